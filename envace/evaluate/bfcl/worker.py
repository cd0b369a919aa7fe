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
  hello                                  -> {"version", "categories", "step_limit", "live_counts"}
  load {category, limit, ids?}           -> [task records] (see `Dataset.record`)
  prereqs {category, scenario}           -> [task records] of a memory scenario's conversations
  start {episode, id, run}               -> {"system": str | None}: the episode's instances now
  call {episode, id, name, arguments}    -> {"result": str} executed in the episode's instances
  snapshot {episode}                     -> {class name: public attributes} of those instances
  end {episode}                          -> drops the instances (a memory prerequisite: saved first)
  grade {id, output}                     -> {"valid": bool, "error_type": str, "error": ...}
  leaderboard {scores}                   -> bfcl-eval's data_overall.csv row for those scores
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
import tempfile
import traceback
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

# How bfcl-eval grades each supported category (its eval_runner.evaluate_task dispatch), in the
# order of its category lists. memory_vector needs sentence-transformers and a model from the
# Hugging Face hub, web_search a search API: neither runs offline.
KINDS = {
    "simple_python": "ast",
    "simple_java": "ast",
    "simple_javascript": "ast",
    "multiple": "ast",
    "parallel": "ast",
    "parallel_multiple": "ast",
    "irrelevance": "irrelevance",
    "live_simple": "ast",
    "live_multiple": "ast",
    "live_parallel": "ast",
    "live_parallel_multiple": "ast",
    "live_irrelevance": "irrelevance",
    "multi_turn_base": "multi_turn",
    "multi_turn_miss_func": "multi_turn",
    "multi_turn_miss_param": "multi_turn",
    "multi_turn_long_context": "multi_turn",
    "memory_kv": "memory",
    "memory_rec_sum": "memory",
}
CATEGORIES = tuple(KINDS)
LIVE_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
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


def _language(category: str) -> Any:
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.utils import is_java, is_js

    if is_java(category):
        return Language.JAVA
    return Language.JAVASCRIPT if is_js(category) else Language.PYTHON


# --- tools -------------------------------------------------------------------------------------
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


# --- ground truth as calls (the oracle's answers; grading never uses them) ----------------------
def _java(value: Any, ptype: str, items: str | None) -> str:
    """A Java-syntax string that bfcl-eval's `java_type_converter` turns back into `value`."""
    if ptype == "Array" and isinstance(value, list):
        inner = ", ".join(_java(x, items or "any", None) for x in value)
        return f"new {items or 'Object'}[]{{{inner}}}"
    if ptype == "ArrayList" and isinstance(value, list):
        inner = ", ".join(_java_element(x, items) for x in value)
        return f"new ArrayList<>(Arrays.asList({inner}))" if value else "new ArrayList<>()"
    if ptype == "HashMap" and isinstance(value, dict):
        puts = " ".join(f'put("{k}", {_java_element(v, None)});' for k, v in value.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    suffix = {"long": "L", "float": "f"}.get(ptype, "")
    return _scalar(value) + suffix


def _java_element(value: Any, items: str | None) -> str:
    """An element of an ArrayList or a HashMap value: without an element type bfcl-eval reads
    it with `parse_java_value` (strings quoted); String and char elements lose their quotes."""
    if isinstance(value, str) and items in (None, "String"):
        return f'"{value}"'
    if isinstance(value, str) and items == "char":
        return f"'{value}'"
    return _java(value, items or "any", None)


def _js(value: Any, ptype: str) -> str:
    """A JavaScript-syntax string that bfcl-eval's `js_type_converter` turns back into `value`."""
    if ptype in ("array", "dict") and isinstance(value, list | dict):
        return _js_literal(value)
    return _scalar(value) + ("n" if ptype == "Bigint" else "")


def _js_literal(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_js_literal(x) for x in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_js_literal(v)}" for k, v in value.items()) + "}"
    return _scalar(value)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value)


def _first_choices(answer: dict[str, Any]) -> dict[str, Any]:
    """A dict answer's keys with their first acceptable value (keys that may be left out go)."""
    out = {}
    for key, choices in answer.items():
        real = [c for c in choices if c != ""] if isinstance(choices, list) else [choices]
        if real:
            out[key] = real[0]
    return out


def _encode(value: Any, param: dict[str, Any], language: str) -> str:
    """Java and JavaScript parameters are strings in their language's syntax (bfcl-eval shows
    the model their docs with every type turned into string)."""
    if isinstance(value, dict):
        value = _first_choices(value)
    ptype = str(param.get("type"))
    if language == "java":
        raw_items = param.get("items")
        items = raw_items.get("type") if isinstance(raw_items, dict) else None
        return _java(value, ptype, items)
    return _js(value, ptype)


def _pick(choices: list[Any], param: dict[str, Any], language: str) -> tuple[bool, Any]:
    """One acceptable value from a possible-answer list ('' means: may be omitted)."""
    real = [c for c in choices if c != ""]
    if not real:
        return False, None
    value = real[0]
    if language != "python":
        return True, _encode(value, param, language)
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
        choices = choices if isinstance(choices, list) else [choices]
        ok, value = _pick(choices, props.get(key, {}), "python")
        if ok:
            out[key] = value
    return out


def _single_turn_expected(
    functions: list[dict[str, Any]], truth: list[Any], language: str
) -> list[dict[str, Any]]:
    """`functions`: the docs as the checker sees them (Java/JS types, not the model's strings)."""
    docs = {f["name"]: f for f in functions}
    calls = []
    for item in truth:
        ((name, params),) = item.items()
        schema = docs.get(name, {}).get("parameters", {})
        props, required = schema.get("properties", {}), schema.get("required", [])
        args = {}
        for key, choices in params.items():
            if key not in props and "" in choices:
                continue  # a few answers list an undocumented optional parameter: leave it out
            ok, value = _pick(choices, props.get(key, {}), language)
            if ok:
                args[key] = value
            elif key in required and "" in choices:
                args[key] = ""  # a required parameter whose only accepted value is ''
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


# --- turns -------------------------------------------------------------------------------------
def _first_turn(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, str]], str]:
    """(system prompt, earlier messages, the user message the model answers) of turn 0."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system") or None
    rest = [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"]
    if rest and rest[-1]["role"] == "user":
        return system, rest[:-1], rest[-1]["content"]
    return system, [], "\n\n".join(m["content"] for m in rest)


def _later_turn(entry: dict[str, Any], index: int) -> str:
    """A later turn's user text; a miss_func turn reveals its held-out functions in it, as the
    Qwen3-FC handler's prompting inference does."""
    held_out = entry.get("missed_function", {}).get(str(index))
    if held_out is not None:
        from bfcl_eval.constants.default_prompts import (
            DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING,
        )

        return str(DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=held_out))
    return "\n\n".join(m["content"] for m in entry["question"][index])


def _sample(n: int, limit: int | None) -> list[int]:
    """Evenly spaced indices: a sample that spans the whole category, the same every time."""
    if limit is None or not 0 < limit < n:
        return list(range(n))
    return [(i * n) // limit for i in range(limit)]


class Dataset:
    """Entries and ground truth of the loaded categories, by entry id.

    `entries` are what the model sees (bfcl-eval's generation loader: language hints, memory
    prerequisites); `plain` are what the checkers see (its evaluation loader: no hints), aligned
    with the ground truth by position, as bfcl-eval's `evaluate_task` aligns them.
    """

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self.plain: dict[str, dict[str, Any]] = {}
        self.truth: dict[str, Any] = {}
        self.category: dict[str, str] = {}
        self.prereqs: dict[tuple[str, str], list[str]] = {}

    def kind(self, entry_id: str) -> str:
        if "prereq" in entry_id:
            return "memory_prereq"
        return KINDS[self.category[entry_id]]

    def load(
        self, category: str, limit: int | None, only: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """Records of `limit` evenly spaced entries of `category` (all: None), or of the
        entries named in `only`."""
        from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

        if category not in KINDS:
            raise ValueError(f"unsupported BFCL category {category!r}; supported: {CATEGORIES}")
        shown = {e["id"]: e for e in load_dataset_entry(category)}
        plain = load_dataset_entry(
            category, include_prereq=False, include_language_specific_hint=False
        )
        truth = None if KINDS[category] == "irrelevance" else load_ground_truth_entry(category)
        picked = _sample(len(plain), limit)
        if only is not None:
            wanted = set(only)
            picked = [i for i, e in enumerate(plain) if e["id"] in wanted]
        ids = []
        for i in picked:
            entry_id = plain[i]["id"]
            self.plain[entry_id] = plain[i]
            self.truth[entry_id] = truth[i]["ground_truth"] if truth is not None else []
            self._add(shown[entry_id], category)
            ids.append(entry_id)
        chains: dict[tuple[str, str], list[str]] = {}
        for entry in shown.values():
            if "prereq" in entry["id"]:
                self._add(entry, category)
                chains.setdefault((category, entry["scenario"]), []).append(entry["id"])
        self.prereqs.update(chains)  # a category loaded again keeps one chain per scenario
        return [self.record(i) for i in ids]

    def _add(self, entry: dict[str, Any], category: str) -> None:
        self.entries[entry["id"]] = entry
        self.category[entry["id"]] = category

    def prereq_records(self, category: str, scenario: str) -> list[dict[str, Any]]:
        """A memory scenario's prerequisite conversations, in the order they must run."""
        return [self.record(i) for i in self.prereqs.get((category, scenario), [])]

    def allowed(self, entry_id: str) -> set[str]:
        """Function names the episode may call: the entry's docs and any it holds back."""
        entry = self.entries[entry_id]
        held_out = [f for docs in entry.get("missed_function", {}).values() for f in docs]
        return {f["name"] for f in [*entry["function"], *held_out]}

    def record(self, entry_id: str) -> dict[str, Any]:
        entry, kind = self.entries[entry_id], self.kind(entry_id)
        system, history, first = _first_turn(entry["question"][0])
        turns = [first] + [_later_turn(entry, i) for i in range(1, len(entry["question"]))]
        return {
            "id": entry_id,
            "category": self.category[entry_id],
            "kind": kind,
            "scenario": entry.get("scenario"),
            "system": system,
            "history": history,
            "turns": turns,
            "tools": [_tool(f) for f in entry["function"]],
            "expected": self._expected(entry_id, kind, len(turns)),
            "answers": self.truth.get(entry_id, []) if kind == "memory" else [],
        }

    def _expected(self, entry_id: str, kind: str, n_turns: int) -> list[list[dict[str, Any]]]:
        truth: list[Any] = self.truth.get(entry_id) or []
        if kind == "ast":
            category = self.category[entry_id]
            language = _language(category).value.lower()
            return [_single_turn_expected(self.plain[entry_id]["function"], truth, language)]
        if kind == "multi_turn":
            methods = _method_table(self.entries[entry_id]["involved_classes"])
            return [[_parse_truth_call(c, methods) for c in turn] for turn in truth]
        return [[] for _ in range(n_turns)]  # no call is the answer (or none is graded)


# --- execution ---------------------------------------------------------------------------------
def _call_string(allowed: set[str], call: Any) -> str | None:
    """`name(k=repr(v), ...)` for a documented function with identifier keys; else None."""
    if not isinstance(call, dict) or not isinstance(call.get("arguments"), dict):
        return None
    name, args = call.get("name"), call["arguments"]
    if name not in allowed or not str(name).isidentifier():
        return None
    if not all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k in args):
        return None
    from bfcl_eval.model_handler.utils import convert_to_function_call

    strings: list[str] = convert_to_function_call([{name: args}])
    return strings[0]


def _long_context(category: str) -> bool:
    return "long_context" in category or "composite" in category  # as bfcl-eval's handlers


class Episode:
    """One episode's entry, its instances' configuration and (once started) its instances."""

    def __init__(self, entry_id: str, config: dict[str, Any]) -> None:
        self.entry_id = entry_id
        self.config = config
        self.instances: dict[str, Any] = {}


class Executor:
    """Runs one episode's calls in bfcl-eval's executable classes, each episode apart."""

    def __init__(self, data: Dataset) -> None:
        self.data = data
        self.episodes: dict[str, Episode] = {}

    def _config(self, entry_id: str, run: str) -> dict[str, Any]:
        """The entry's initial configuration; memory entries read and write their scenario's
        snapshots under a folder of their run (bfcl-eval's `model_result_dir`)."""
        entry = self.data.entries[entry_id]
        if self.data.kind(entry_id) not in ("memory", "memory_prereq"):
            config: dict[str, Any] = entry.get("initial_config", {})
            return config
        from bfcl_eval.constants.eval_config import RESULT_PATH

        (cls,) = entry["involved_classes"]
        folder = Path(RESULT_PATH) / f"{_PREFIX}_run_{re.sub(r'[^A-Za-z0-9_-]', '_', run)}"
        return {
            cls: {
                "model_result_dir": folder,
                "scenario": entry["scenario"],
                "test_id": entry_id,
                "test_category": self.data.category[entry_id],
            }
        }

    def _run(self, episode: str, calls: list[str]) -> list[str]:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
            execute_multi_turn_func_call,
        )

        ep = self.episodes[episode]
        entry = self.data.entries[ep.entry_id]
        results, ep.instances = execute_multi_turn_func_call(
            func_call_list=calls,
            initial_config=ep.config,
            involved_classes=entry["involved_classes"],
            model_name=_tag(episode),
            test_entry_id=ep.entry_id,
            long_context=_long_context(self.data.category[ep.entry_id]),
            is_evaL_run=False,
        )
        return list(results)

    def start(self, episode: str, entry_id: str, run: str) -> dict[str, Any]:
        """Build the episode's instances now, as bfcl-eval's inference does before the first
        turn; a memory entry's system prompt shows the memory they loaded."""
        self.end(episode)
        self.episodes[episode] = Episode(entry_id, self._config(entry_id, run))
        self._run(episode, [])
        return {"system": self._memory_system(episode)}

    def _memory_system(self, episode: str) -> str | None:
        ep = self.episodes[episode]
        if self.data.kind(ep.entry_id) not in ("memory", "memory_prereq"):
            return None
        from bfcl_eval.model_handler.utils import add_memory_instruction_system_prompt

        entry = self.data.entries[ep.entry_id]
        (instance,) = ep.instances.values()
        question = add_memory_instruction_system_prompt(
            copy.deepcopy(entry["question"]),
            self.data.category[ep.entry_id],
            entry["scenario"],
            instance,
        )
        return _first_turn(question[0])[0]

    def call(self, episode: str, entry_id: str, name: Any, arguments: Any) -> dict[str, Any]:
        if episode not in self.episodes:
            self.episodes[episode] = Episode(entry_id, self._config(entry_id, ""))
        text = _call_string(self.data.allowed(entry_id), {"name": name, "arguments": arguments})
        if text is None:
            return {"result": None, "refused": f"{name!r} is not a documented function here"}
        return {"result": self._run(episode, [text])[0]}

    def snapshot(self, episode: str) -> dict[str, Any]:
        ep = self.episodes.get(episode)
        state = {}
        for inst in (ep.instances if ep else {}).values():
            public = {k: v for k, v in vars(inst).items() if not k.startswith("_")}
            state[type(inst).__name__] = json.loads(json.dumps(public, default=str))
        return state

    def end(self, episode: str) -> int:
        """Drop the episode; a memory prerequisite first saves its memory for the next one, as
        bfcl-eval does at the end of each prerequisite conversation."""
        ep = self.episodes.pop(episode, None)
        if ep is not None and ep.instances and self.data.kind(ep.entry_id) == "memory_prereq":
            for instance in ep.instances.values():
                instance._flush_memory_to_local_file()
        return _drop_instances(_tag(episode))


def _tag(episode: str) -> str:
    return f"{_PREFIX}_ep_{episode}"


# --- grading -----------------------------------------------------------------------------------
class Grader:
    """bfcl-eval's own checkers on parsed model calls, per category as its `evaluate_task`.

    `output` is what bfcl-eval's result file would hold, decoded: single-turn, a list of calls;
    multi-turn, per turn the list of steps, each a list of calls; memory, the list of steps of
    its one turn, each {"calls", "content"}. A string is an inference error (bfcl-eval records
    "Error during inference: ..." as the result).
    """

    def __init__(self, data: Dataset) -> None:
        self.data = data
        self.count = 0

    def grade(self, entry_id: str, output: Any) -> dict[str, Any]:
        kind = self.data.kind(entry_id)
        if kind == "multi_turn":
            return self._multi_turn(entry_id, output)
        if kind == "memory":
            return self._memory(entry_id, output)
        calls = output if isinstance(output, list) else []  # the handler decodes no call
        decoded = [{c["name"]: c["arguments"]} for c in calls]
        if kind == "irrelevance":
            return _relevance(decoded)
        return self._ast(entry_id, decoded)

    def _ast(self, entry_id: str, decoded: list[dict[str, Any]]) -> dict[str, Any]:
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
        from bfcl_eval.utils import is_function_calling_format_output

        if not is_function_calling_format_output(decoded):
            return _fail("ast_decoder:decoder_wrong_output_format", "no function call")
        category = self.data.category[entry_id]
        result = ast_checker(
            self.data.plain[entry_id]["function"],
            decoded,
            self.data.truth[entry_id],
            _language(category),
            category,
            CHECKER_MODEL,
        )
        return _verdict(result)

    def _multi_turn(self, entry_id: str, output: Any) -> dict[str, Any]:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

        truth = self.data.truth[entry_id]
        if not isinstance(output, list):
            return _fail("multi_turn:inference_error", str(output))
        if len(output) != len(truth):  # bfcl-eval's force-terminated rule
            return _fail(
                "multi_turn:force_terminated",
                f"the episode produced {len(output)} of {len(truth)} turns",
            )
        allowed = self.data.allowed(entry_id)
        decoded: list[list[list[str]]] = []
        for turn in output:
            steps = [[s for s in (_call_string(allowed, c) for c in step) if s] for step in turn]
            decoded.append([s for s in steps if s])  # bfcl-eval skips empty steps
        self.count += 1
        tag = f"{_PREFIX}_grade_{self.count}"
        entry = self.data.plain[entry_id]
        try:
            result = multi_turn_checker(decoded, truth, entry, self.data.category[entry_id], tag)
        finally:
            _drop_instances(tag)
        return _verdict(result)

    def _memory(self, entry_id: str, output: Any) -> dict[str, Any]:
        """bfcl-eval's agentic rule: the last step without a decodable call is the answer."""
        from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker

        if not isinstance(output, list):
            return _fail("agentic:inference_error", str(output))
        answer = None
        for step in output:
            if not step["calls"]:
                answer = step["content"]
        if not answer:
            return _fail(
                "agentic:no_last_message",
                "Cannot find the last chat message that is not a function call.",
            )
        return _verdict(agentic_checker(answer, self.data.truth[entry_id]))


def _relevance(decoded: list[dict[str, Any]]) -> dict[str, Any]:
    """bfcl-eval's irrelevance rule: right when the output decodes to no call."""
    from bfcl_eval.utils import is_empty_output

    if is_empty_output(decoded):
        return {"valid": True, "error_type": None, "error": None}
    return _fail(
        "irrelevance_error:decoder_success",
        "Valid syntax. Successfully decode AST when it should not.",
    )


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


def leaderboard(scores: dict[str, dict[str, Any]]) -> dict[str, str]:
    """bfcl-eval's own aggregation (`generate_leaderboard_csv`) on a score table
    {category: {"accuracy", "total_count"}}: the data_overall.csv row, by column."""
    from bfcl_eval.eval_checker.eval_runner_helper import generate_leaderboard_csv

    table = {CHECKER_MODEL: {c: dict(s) for c, s in scores.items()}}
    with tempfile.TemporaryDirectory() as out:
        generate_leaderboard_csv(table, Path(out))
        header, row = (Path(out) / "data_overall.csv").read_text().splitlines()[:2]
    return dict(zip(header.split(","), row.split(","), strict=False))


def _hello() -> dict[str, Any]:
    from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT
    from bfcl_eval.utils import load_dataset_entry

    counts = {
        c: len(load_dataset_entry(c, include_prereq=False, include_language_specific_hint=False))
        for c in LIVE_AST
    }
    return {
        "version": version("bfcl-eval"),
        "categories": list(CATEGORIES),
        "step_limit": int(MAXIMUM_STEP_LIMIT),
        "live_counts": counts,
    }


# --- protocol ----------------------------------------------------------------------------------
class Worker:
    def __init__(self) -> None:
        self.data = Dataset()
        self.executor = Executor(self.data)
        self.grader = Grader(self.data)

    def handle(self, req: dict[str, Any]) -> Any:
        op = req.get("op")
        handlers: dict[str, Callable[[], Any]] = {
            "hello": _hello,
            "load": lambda: self.data.load(req["category"], req.get("limit"), req.get("ids")),
            "prereqs": lambda: self.data.prereq_records(req["category"], req["scenario"]),
            "start": lambda: self.executor.start(req["episode"], req["id"], str(req["run"])),
            "call": lambda: self.executor.call(
                req["episode"], req["id"], req["name"], req["arguments"]
            ),
            "snapshot": lambda: self.executor.snapshot(req["episode"]),
            "end": lambda: {"dropped": self.executor.end(req["episode"])},
            "grade": lambda: self.grader.grade(req["id"], req["output"]),
            "leaderboard": lambda: leaderboard(req["scores"]),
        }
        if op not in handlers:
            raise ValueError(f"unknown op {op!r}")
        return handlers[str(op)]()


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
