"""The BFCL worker: runs inside the bfcl-eval virtual environment, never in EnvACE's process.

bfcl-eval keeps its multi-turn environment instances in module globals and executes tool calls
with `eval()` on Python-call strings. This script is the only place that imports it. EnvACE starts
it as a subprocess (`BfclWorker`) and talks JSON lines over stdin/stdout: one request object per
line in, one response object per line out. Only parsed JSON crosses the pipe (a tool name and an
arguments object), never text to evaluate.

Where bfcl-eval needs a Python-call string (its multi-turn executor and checker), the string is
built HERE from the parsed JSON with bfcl-eval's own `convert_to_function_call` (`name(k=repr(v))`)
and only after checking that the name is one of the entry's documented functions and every
argument key is a plain identifier; values are JSON values, whose `repr` is a Python literal.
A call to any other name is answered with an error without ever reaching `eval`.

Requests (`{"op": ..., ...}`) and their `result`:
  hello                                  -> {"version", "categories"}
  load {category, limit}                 -> [task records] (see `_task_record`)
  call {episode, id, name, arguments}    -> {"result": str} executed in the episode's instances
  snapshot {episode}                     -> {class name: public attributes} of those instances
  end {episode}                          -> drops the episode's instances
  grade {id, output}                     -> {"valid": bool, "error_type": str, "error": ...}
  shutdown                               -> the worker exits

Responses: `{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`. This file uses only
the standard library and bfcl-eval: it runs under the bfcl venv's Python with no EnvACE imports.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import keyword
import re
import sys
import traceback
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

# The categories this adapter supports, by their BFCL v4 file names.
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "multi_turn_base")
MULTI_TURN = ("multi_turn_base",)
# The registry key of the BFCL handler our prompt format mirrors: Qwen3 function calling
# (`<tool_call>` JSON blocks, tools passed with their BFCL names, dots kept). Its
# `underscore_to_dot` is False, so the AST checker compares names as written.
CHECKER_MODEL = "Qwen_Qwen3-8B-FC"
# Prefix of the names under which bfcl-eval stores our instances in its module globals.
_PREFIX = "envace"


def _instance_globals() -> dict[str, Any]:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    table: dict[str, Any] = vars(multi_turn_utils)
    return table


def _drop_instances(tag: str) -> int:
    """Delete every instance bfcl-eval stored for `tag` (an episode or a grading run)."""
    g = _instance_globals()
    prefix = re.sub(r"[-./:]", "_", tag)
    doomed = [k for k in g if k.startswith(prefix + "_") and k.endswith("_instance")]
    for k in doomed:
        del g[k]
    return len(doomed)


# --- dataset -----------------------------------------------------------------------------------
_OPENAPI_TYPES: dict[str, str] = {}


def _openapi_types() -> dict[str, str]:
    if not _OPENAPI_TYPES:
        from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

        _OPENAPI_TYPES.update(GORILLA_TO_OPENAPI)
    return _OPENAPI_TYPES


def _schema(node: Any) -> Any:
    """BFCL's parameter types (dict, float, tuple, any) as JSON Schema types, recursively."""
    if isinstance(node, list):
        return [_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _schema(v) for k, v in node.items()}
    t = node.get("type")
    if isinstance(t, str):
        out["type"] = _openapi_types().get(t, t)
    if isinstance(node.get("properties"), dict):
        out["properties"] = {k: _schema(v) for k, v in node["properties"].items()}
    return out


def _tool(fn: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(fn)
    body["parameters"] = _schema(fn.get("parameters", {"type": "dict", "properties": {}}))
    return {"type": "function", "function": body}


def _pick(choices: list[Any], param: dict[str, Any]) -> tuple[bool, Any]:
    """One acceptable value from a possible-answer list ('' means: may be omitted)."""
    real = [c for c in choices if c != ""]
    if not real:
        return False, None
    value = real[0]
    ptype = param.get("type")
    raw_items = param.get("items")
    items: dict[str, Any] = raw_items if isinstance(raw_items, dict) else {}
    if ptype == "dict" and isinstance(value, dict):
        return True, _pick_dict(value, param.get("properties", {}))
    if ptype in ("array", "tuple") and items.get("type") == "dict" and isinstance(value, list):
        return True, [_pick_dict(d, items.get("properties", {})) for d in value]
    return True, value


def _pick_dict(answer: dict[str, Any], props: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, choices in answer.items():
        ok, value = _pick(choices if isinstance(choices, list) else [choices], props.get(key, {}))
        if ok:
            out[key] = value
    return out


def _single_turn_expected(entry: dict[str, Any], truth: list[Any]) -> list[dict[str, Any]]:
    docs = {f["name"]: f for f in entry["function"]}
    calls = []
    for item in truth:
        ((name, params),) = item.items()
        props = docs.get(name, {}).get("parameters", {}).get("properties", {})
        args = {}
        for key, choices in params.items():
            if key not in props and "" in choices:
                continue  # a few answers list an undocumented optional parameter: leave it out
            ok, value = _pick(choices, props.get(key, {}))
            if ok:
                args[key] = value
        calls.append({"name": name, "arguments": args})
    return calls


def _method_table(classes: list[str]) -> dict[str, Callable[..., Any]]:
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    table: dict[str, Callable[..., Any]] = {}
    for cls_name in classes:
        cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[cls_name]), cls_name)
        for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction):
            if not name.startswith("_"):
                table[name] = fn
    return table


def _parse_truth_call(text: str, methods: dict[str, Callable[..., Any]]) -> dict[str, Any]:
    """A ground-truth call string of the dataset -> name + keyword arguments (literals only)."""
    node = ast.parse(text, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"unexpected ground-truth call {text!r}")
    name = node.func.id
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    if args:  # bind positional arguments to their parameter names (skip `self`)
        params = list(inspect.signature(methods[name]).parameters)[1:]
        kwargs = {**dict(zip(params, args, strict=False)), **kwargs}
    return {"name": name, "arguments": kwargs}


def _turn_text(messages: list[dict[str, Any]]) -> tuple[str | None, str]:
    system = "\n\n".join(m["content"] for m in messages if m.get("role") == "system") or None
    user = "\n\n".join(m["content"] for m in messages if m.get("role") != "system")
    return system, user


class Dataset:
    """Entries and ground truth of the loaded categories, by entry id."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self.truth: dict[str, Any] = {}
        self.category: dict[str, str] = {}

    def load(self, category: str, limit: int | None) -> list[dict[str, Any]]:
        from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

        if category not in CATEGORIES:
            raise ValueError(f"unsupported BFCL category {category!r}; supported: {CATEGORIES}")
        entries = load_dataset_entry(category)
        truth = {t["id"]: t["ground_truth"] for t in load_ground_truth_entry(category)}
        if limit is not None and 0 < limit < len(entries):
            # evenly spaced ids: a sample that spans the whole category, the same every time
            entries = [entries[(i * len(entries)) // limit] for i in range(limit)]
        records = []
        for e in entries:
            self.entries[e["id"]] = e
            self.truth[e["id"]] = truth[e["id"]]
            self.category[e["id"]] = category
            records.append(self._task_record(e, category))
        return records

    def _task_record(self, entry: dict[str, Any], category: str) -> dict[str, Any]:
        truth = self.truth[entry["id"]]
        system, _ = _turn_text(entry["question"][0])
        turns = [_turn_text(t)[1] for t in entry["question"]]
        if category in MULTI_TURN:
            methods = _method_table(entry["involved_classes"])
            expected = [[_parse_truth_call(c, methods) for c in turn] for turn in truth]
        else:
            expected = [_single_turn_expected(entry, truth)]
        return {
            "id": entry["id"],
            "category": category,
            "multi_turn": category in MULTI_TURN,
            "system": system,
            "turns": turns,
            "tools": [_tool(f) for f in entry["function"]],
            "expected": expected,
        }


# --- execution ---------------------------------------------------------------------------------
def _call_string(entry: dict[str, Any], call: Any) -> str | None:
    """`name(k=repr(v), ...)` for a documented function with identifier keys; else None."""
    if not isinstance(call, dict) or not isinstance(call.get("arguments"), dict):
        return None
    name, args = call.get("name"), call["arguments"]
    allowed = {f["name"] for f in entry["function"]}
    if name not in allowed or not str(name).isidentifier():
        return None
    if not all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k in args):
        return None
    from bfcl_eval.model_handler.utils import convert_to_function_call

    strings: list[str] = convert_to_function_call([{name: args}])
    return strings[0]


class Executor:
    """Runs one episode's calls in bfcl-eval's executable classes, each episode apart."""

    def __init__(self, data: Dataset) -> None:
        self.data = data

    def call(self, episode: str, entry_id: str, name: Any, arguments: Any) -> dict[str, Any]:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
            execute_multi_turn_func_call,
        )

        entry = self.data.entries[entry_id]
        text = _call_string(entry, {"name": name, "arguments": arguments})
        if text is None:
            return {"result": None, "refused": f"{name!r} is not a documented function here"}
        results, _ = execute_multi_turn_func_call(
            func_call_list=[text],
            initial_config=entry["initial_config"],
            involved_classes=entry["involved_classes"],
            model_name=_tag(episode),
            test_entry_id=entry_id,
            long_context=False,
            is_evaL_run=False,
        )
        return {"result": results[0]}

    def snapshot(self, episode: str) -> dict[str, Any]:
        g = _instance_globals()
        prefix = re.sub(r"[-./:]", "_", _tag(episode)) + "_"
        state = {}
        for key, inst in g.items():
            if key.startswith(prefix) and key.endswith("_instance"):
                public = {k: v for k, v in vars(inst).items() if not k.startswith("_")}
                state[type(inst).__name__] = json.loads(json.dumps(public, default=str))
        return state

    def end(self, episode: str) -> int:
        return _drop_instances(_tag(episode))


def _tag(episode: str) -> str:
    return f"{_PREFIX}_ep_{episode}"


# --- grading -----------------------------------------------------------------------------------
class Grader:
    """bfcl-eval's own checkers on parsed model calls."""

    def __init__(self, data: Dataset) -> None:
        self.data = data
        self.count = 0

    def grade(self, entry_id: str, output: Any) -> dict[str, Any]:
        category = self.data.category[entry_id]
        if category in MULTI_TURN:
            return self._multi_turn(entry_id, output)
        return self._ast(entry_id, category, output)

    def _ast(self, entry_id: str, category: str, output: Any) -> dict[str, Any]:
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
        from bfcl_eval.utils import is_function_calling_format_output

        decoded = [{c["name"]: c["arguments"]} for c in output]
        if not is_function_calling_format_output(decoded):
            return _fail("ast_decoder:decoder_wrong_output_format", "no function call")
        entry = self.data.entries[entry_id]
        result = ast_checker(
            entry["function"],
            decoded,
            self.data.truth[entry_id],
            Language.PYTHON,
            category,
            CHECKER_MODEL,
        )
        return _verdict(result)

    def _multi_turn(self, entry_id: str, output: Any) -> dict[str, Any]:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

        entry = self.data.entries[entry_id]
        truth = self.data.truth[entry_id]
        if len(output) != len(truth):  # bfcl-eval's force-terminated rule
            return _fail(
                "multi_turn:force_terminated",
                f"the episode produced {len(output)} of {len(truth)} turns",
            )
        decoded: list[list[list[str]]] = []
        for turn in output:
            steps = [[s for s in (_call_string(entry, c) for c in step) if s] for step in turn]
            decoded.append([s for s in steps if s])  # bfcl-eval skips empty steps
        self.count += 1
        tag = f"{_PREFIX}_grade_{self.count}"
        try:
            result = multi_turn_checker(decoded, truth, entry, category_of(entry_id), tag)
        finally:
            _drop_instances(tag)
        return _verdict(result)


def category_of(entry_id: str) -> str:
    return entry_id.rsplit("_", 1)[0]


def _fail(error_type: str, message: str) -> dict[str, Any]:
    return {"valid": False, "error_type": error_type, "error": message}


def _verdict(result: dict[str, Any]) -> dict[str, Any]:
    if result.get("valid"):
        return {"valid": True, "error_type": None, "error": None}
    message = result.get("error_message", result.get("error"))
    return {
        "valid": False,
        "error_type": result.get("error_type", "unknown"),
        "error": json.loads(json.dumps(message, default=str)),
    }


# --- protocol ----------------------------------------------------------------------------------
class Worker:
    def __init__(self) -> None:
        self.data = Dataset()
        self.executor = Executor(self.data)
        self.grader = Grader(self.data)

    def handle(self, req: dict[str, Any]) -> Any:
        op = req.get("op")
        if op == "hello":
            return {"version": version("bfcl-eval"), "categories": list(CATEGORIES)}
        if op == "load":
            return self.data.load(req["category"], req.get("limit"))
        if op == "call":
            return self.executor.call(req["episode"], req["id"], req["name"], req["arguments"])
        if op == "snapshot":
            return self.executor.snapshot(req["episode"])
        if op == "end":
            return {"dropped": self.executor.end(req["episode"])}
        if op == "grade":
            return self.grader.grade(req["id"], req["output"])
        raise ValueError(f"unknown op {op!r}")


def main() -> int:
    out = sys.stdout
    # bfcl-eval prints progress on import and during checks: keep the protocol stream clean.
    sys.stdout = sys.stderr
    worker = Worker()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            if req.get("op") == "shutdown":
                break
            reply = {"ok": True, "result": worker.handle(req)}
        except Exception as exc:  # reported to the caller, which raises with this message
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc(file=sys.stderr)
        out.write(json.dumps(reply, default=str) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
