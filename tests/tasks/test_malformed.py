"""Every kind of bad task gets one precise, actionable error: file:line, id, field path, reason.

Each case writes a file whose line 1 is a valid task (`t1`) and whose line 2 is the bad input,
then checks the full rendered message, the default mode (raise) and `skip_invalid` (line 1 kept,
line 2 reported with the same error).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from envace.tasks import TaskFormatError, load_tasks

KNOWN = ("bank", "shop")
TRANSFER_PARAMS = {
    "type": "object",
    "properties": {"to": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["to", "amount"],
    "additionalProperties": False,
}
TOP_LEVEL_KEYS = "environment, id, meta, reference, success, system, tools, turns"
CHECKLIST_KEYS = (
    "failure_examples, focus_on, id, pass_condition, question, required_for_next_turn, weight"
)


def good_task(task_id: str = "t2") -> dict[str, Any]:
    return {
        "id": task_id,
        "tools": [
            {
                "type": "function",
                "function": {"name": "transfer", "parameters": copy.deepcopy(TRANSFER_PARAMS)},
            }
        ],
        "turns": [
            {
                "user": "Send 5 to bob",
                "expected_calls": [{"name": "transfer", "arguments": {"to": "bob", "amount": 5}}],
            }
        ],
    }


def item(item_id: str, weight: Any, **extra: Any) -> dict[str, Any]:
    return {
        "id": item_id,
        "question": "Did it transfer?",
        "focus_on": "assistant.tool_calls",
        "pass_condition": "transfer(to=bob, amount=5)",
        "weight": weight,
        **extra,
    }


def mutated(change: Callable[[dict[str, Any]], None]) -> str:
    data = good_task()
    change(data)
    return json.dumps(data, ensure_ascii=False)


def set_path(*path_and_value: Any) -> Callable[[dict[str, Any]], None]:
    *path, value = path_and_value

    def change(data: dict[str, Any]) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def delete(*path: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


def checklist(*items: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return set_path("turns", 0, "checklist", list(items))


def args(arguments: Any) -> Callable[[dict[str, Any]], None]:
    return set_path("turns", 0, "expected_calls", 0, "arguments", arguments)


def env(name: str = "bank", **extra: Any) -> Callable[[dict[str, Any]], None]:
    return set_path("environment", {"name": name, **extra})


def tool(name: str, params: Any = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": params or {}}}


@dataclass(frozen=True)
class Case:
    name: str
    line: str | bytes
    task_id: str | None
    field: str
    message: str


CASES = [
    Case(
        "not-json",
        '{"id": "t2", "tools": [',
        None,
        "",
        "not valid JSON: Expecting value at column 24",
    ),
    Case(
        "json-array",
        "[1, 2]",
        None,
        "",
        "expected a JSON object (one task per line), got array",
    ),
    Case(
        "json-string",
        '"just text"',
        None,
        "",
        "expected a JSON object (one task per line), got string",
    ),
    Case(
        "nan-weight",
        mutated(checklist(item("C0", 1.0))).replace("1.0", "NaN"),
        None,
        "",
        "not valid JSON: NaN is not allowed; use a finite number",
    ),
    Case(
        "duplicate-json-key",
        '{"id": "t2", "id": "t3"}',
        None,
        "",
        'not valid JSON: duplicate key "id" in an object',
    ),
    Case(
        "not-utf8",
        b'{"id": "t2", "system": "caf\xe9"}',
        None,
        "",
        "not valid UTF-8 at byte 28 of the line; save the file as UTF-8",
    ),
    Case("missing-id", mutated(delete("id")), None, "id", "required key is missing"),
    Case("empty-id", mutated(set_path("id", "")), None, "id", "must not be empty"),
    Case("id-not-string", mutated(set_path("id", 7)), None, "id", "expected string, got integer"),
    Case(
        "duplicate-id",
        json.dumps(good_task("t1")),
        "t1",
        "id",
        "duplicate task id 't1' (first seen on line 1); ids must be unique in a file",
    ),
    Case("no-tools", mutated(set_path("tools", [])), "t2", "tools", "must have at least 1 item"),
    Case("tools-missing", mutated(delete("tools")), "t2", "tools", "required key is missing"),
    Case(
        "tool-without-function",
        mutated(set_path("tools", [{"type": "function"}])),
        "t2",
        "tools[0].function",
        "required key is missing",
    ),
    Case(
        "tool-type-not-function",
        mutated(set_path("tools", 0, "type", "fn")),
        "t2",
        "tools[0].type",
        'must be "function", got "fn"',
    ),
    Case(
        "bad-tool-name",
        mutated(set_path("tools", 0, "function", "name", "send money")),
        "t2",
        "tools[0].function.name",
        '"send money" does not match the pattern ^[A-Za-z_][A-Za-z0-9_.\\-]{0,127}$',
    ),
    Case(
        "duplicate-tool-name",
        mutated(lambda d: d["tools"].append(tool("transfer"))),
        "t2",
        "tools[1].function.name",
        "duplicate tool name 'transfer' (also tools[0])",
    ),
    Case(
        "tool-parameters-not-a-schema",
        mutated(set_path("tools", 0, "function", "parameters", "properties", {"to": {"type": 3}})),
        "t2",
        "tools[0].function.parameters",
        "not a valid JSON schema at properties.to.type: 3 is not valid under any of the given "
        "schemas (tool 'transfer')",
    ),
    Case(
        "tool-parameters-missing",
        mutated(delete("tools", 0, "function", "parameters")),
        "t2",
        "tools[0].function.parameters",
        "required key is missing",
    ),
    Case("no-turns", mutated(set_path("turns", [])), "t2", "turns", "must have at least 1 item"),
    Case(
        "empty-user-message",
        mutated(set_path("turns", 0, "user", "")),
        "t2",
        "turns[0].user",
        "must not be empty",
    ),
    Case(
        "unknown-turn-key",
        mutated(set_path("turns", 0, "assistant", "ok")),
        "t2",
        "turns[0].assistant",
        "unknown key (allowed: answer_facts, checklist, expected_calls, ordered, user)",
    ),
    Case(
        "ordered-not-boolean",
        mutated(set_path("turns", 0, "ordered", "yes")),
        "t2",
        "turns[0].ordered",
        "expected boolean, got string",
    ),
    Case(
        "weights-do-not-sum-to-1",
        mutated(
            lambda d: d["turns"].append(
                {"user": "and again", "checklist": [item("C0", 0.5), item("C1", 0.3)]}
            )
        ),
        "t2",
        "turns[1].checklist[0].weight",
        "weights of turn 1 sum to 0.8, expected 1",
    ),
    Case(
        "weight-above-1",
        mutated(checklist(item("C0", 1.5))),
        "t2",
        "turns[0].checklist[0].weight",
        "1.5 is above the maximum 1",
    ),
    Case(
        "weight-negative",
        mutated(checklist(item("C0", 1.2), item("C1", -0.2))),
        "t2",
        "turns[0].checklist[1].weight",
        "-0.2 is below the minimum 0",
    ),
    Case(
        "weight-not-number",
        mutated(checklist(item("C0", "1"))),
        "t2",
        "turns[0].checklist[0].weight",
        "expected number, got string",
    ),
    Case(
        "bad-focus-on",
        mutated(checklist(item("C0", 1.0, focus_on="assistant.thinking"))),
        "t2",
        "turns[0].checklist[0].focus_on",
        '"assistant.thinking" is not one of "assistant.tool_calls", "assistant.content", '
        '"tool.content"',
    ),
    Case(
        "duplicate-checklist-id",
        mutated(checklist(item("C0", 0.5), item("C0", 0.5))),
        "t2",
        "turns[0].checklist[1].id",
        "duplicate checklist item id 'C0' in turn 0 (also checklist[0])",
    ),
    Case(
        "checklist-item-missing-pass-condition",
        mutated(checklist({k: v for k, v in item("C0", 1.0).items() if k != "pass_condition"})),
        "t2",
        "turns[0].checklist[0].pass_condition",
        "required key is missing",
    ),
    Case(
        "checklist-item-unknown-key",
        mutated(checklist(item("C0", 1.0, evidence=[]))),
        "t2",
        "turns[0].checklist[0].evidence",
        f"unknown key (allowed: {CHECKLIST_KEYS})",
    ),
    Case(
        "expected-call-unknown-tool",
        mutated(set_path("turns", 0, "expected_calls", 0, "name", "refund")),
        "t2",
        "turns[0].expected_calls[0].name",
        "no tool named 'refund' in this task (tools: transfer)",
    ),
    Case(
        "expected-call-wrong-type",
        mutated(args({"to": "bob", "amount": "5"})),
        "t2",
        "turns[0].expected_calls[0].arguments.amount",
        "expected number, got string (parameters of tool 'transfer')",
    ),
    Case(
        "expected-call-missing-required",
        mutated(args({"to": "bob"})),
        "t2",
        "turns[0].expected_calls[0].arguments.amount",
        "required key is missing (parameters of tool 'transfer')",
    ),
    Case(
        "expected-call-unexpected-argument",
        mutated(args({"to": "bob", "amount": 5, "note": "rent"})),
        "t2",
        "turns[0].expected_calls[0].arguments.note",
        "unknown key (allowed: amount, to) (parameters of tool 'transfer')",
    ),
    Case(
        "tool-parameters-remote-ref",
        mutated(
            set_path(
                "tools",
                0,
                "function",
                "parameters",
                "properties",
                "to",
                {"$ref": "https://example.com/account.json"},
            )
        ),
        "t2",
        "tools[0].function.parameters",
        'cannot be used as parameters at properties.to["$ref"]: $ref '
        '"https://example.com/account.json" points outside the schema, and refs are never '
        'fetched (no network, no files): inline it under $defs and use "#/$defs/NAME" '
        "(tool 'transfer')",
    ),
    Case(
        "expected-call-arguments-not-object",
        mutated(args('{"to": "bob"}')),
        "t2",
        "turns[0].expected_calls[0].arguments",
        "expected object, got string",
    ),
    Case(
        "expected-call-unknown-key",
        mutated(set_path("turns", 0, "expected_calls", 0, "result", {})),
        "t2",
        "turns[0].expected_calls[0].result",
        "unknown key (allowed: arguments, name)",
    ),
    Case(
        "no-grading-method",
        mutated(set_path("turns", [{"user": "hello"}, {"user": "bye", "checklist": []}])),
        "t2",
        "",
        "task has no way to be graded: give a turn checklist items or expected_calls, "
        "or add a success rule",
    ),
    Case(
        "unknown-environment",
        mutated(env("mars")),
        "t2",
        "environment.name",
        "unknown environment 'mars' (known: bank, shop)",
    ),
    Case(
        "environment-without-name",
        mutated(set_path("environment", {"initial_state": {}})),
        "t2",
        "environment.name",
        "required key is missing",
    ),
    Case(
        "environment-unknown-key",
        mutated(env(seed=3)),
        "t2",
        "environment.seed",
        "unknown key (allowed: initial_state, name)",
    ),
    Case(
        "success-without-environment",
        mutated(set_path("success", {"final_state": {"bob": 5}})),
        "t2",
        "success",
        "a success rule needs an environment (the final state is read from it); "
        "add environment: {name, initial_state} or remove success",
    ),
    Case(
        "bad-reference-role",
        mutated(set_path("reference", [{"role": "user", "content": "hi"}, {"role": "bot"}])),
        "t2",
        "reference[1].role",
        '"bot" is not a valid role (one of assistant, system, tool, user)',
    ),
    Case(
        "reference-message-without-role",
        mutated(set_path("reference", [{"content": "hi"}])),
        "t2",
        "reference[0].role",
        "required key is missing",
    ),
    Case(
        "reference-tool-call-without-name",
        mutated(set_path("reference", [{"role": "assistant", "tool_calls": [{"id": "c1"}]}])),
        "t2",
        "reference[0].tool_calls[0]",
        'expected {"function": {"name": ..., "arguments": ...}}',
    ),
    Case(
        "extra-top-level-key",
        mutated(set_path("answer", 42)),
        "t2",
        "answer",
        f"unknown key (allowed: {TOP_LEVEL_KEYS})",
    ),
    Case(
        "meta-not-object",
        mutated(set_path("meta", ["a"])),
        "t2",
        "meta",
        "expected object, got array",
    ),
]


def params(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    """Set `value` at `path` inside the transfer tool's parameter schema."""
    return set_path("tools", 0, "function", "parameters", *path, value)


def integer_amount_written(amount: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["tools"][0]["function"]["parameters"]["properties"]["amount"] = {"type": "integer"}
        data["turns"][0]["expected_calls"][0]["arguments"]["amount"] = amount

    return change


def nested(levels: int) -> Any:
    value: Any = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def pattern_arg(pattern: str, value: str) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        data["tools"][0]["function"]["parameters"]["properties"]["to"]["pattern"] = pattern
        data["turns"][0]["expected_calls"][0]["arguments"]["to"] = value

    return change


REFS_OUTSIDE = "points outside the schema, and refs are never fetched (no network, no files): "
RECURSIVE = (
    "this $ref leads back to a schema that contains it (a recursive schema); tool parameters "
    "must not recurse: write the nesting out to the depth you need (tool 'transfer')"
)
# Issue #20: inputs that used to validate and then crash or hang later, or hang validation.
CASES += [
    Case(
        "tool-name-with-final-newline",
        mutated(
            lambda d: (
                d["tools"][0]["function"].update(name="transfer\n"),
                d["turns"][0]["expected_calls"][0].update(name="transfer\n"),
            )
        ),
        "t2",
        "tools[0].function.name",
        '"transfer\\n" does not match the pattern ^[A-Za-z_][A-Za-z0-9_.\\-]{0,127}$',
    ),
    Case(
        "integer-written-as-float",
        mutated(integer_amount_written(430.0)),
        "t2",
        "turns[0].expected_calls[0].arguments.amount",
        "expected integer, got number (parameters of tool 'transfer')",
    ),
    Case(
        "number-that-would-become-zero",
        mutated(args({"to": "bob", "amount": 5})).replace('"amount": 5}', '"amount": 1e-400}'),
        None,
        "",
        "not valid JSON: the number 1e-400 is too small to represent (it would become 0); "
        "write 0 or a number of at least 1e-308",
    ),
    Case(
        "lone-surrogate",
        mutated(set_path("turns", 0, "user", "Send 5 SURROGATE")).replace("SURROGATE", "\\ud800"),
        "t2",
        "turns[0].user",
        "holds a lone surrogate (\\ud800 at character 7), which is not text; fix the escape "
        "(a pair such as \\ud83d\\ude00 is one character)",
    ),
    Case(
        "lone-surrogate-in-a-key",
        mutated(set_path("meta", {"SURROGATE": 1})).replace("SURROGATE", "\\udfff"),
        "t2",
        "meta",
        "a key holds a lone surrogate (\\udfff at character 0), which is not text; fix the "
        "escape (a pair such as \\ud83d\\ude00 is one character)",
    ),
    Case(
        "meta-nested-too-deeply",
        mutated(set_path("meta", nested(900))),
        "t2",
        "meta" + ".a" * 63,
        "nested more than 64 levels deep (objects and arrays); flatten it",
    ),
    Case(
        "string-too-long",
        mutated(set_path("system", "x" * 100_001)),
        "t2",
        "system",
        "is 100001 characters long, at most 100000 allowed",
    ),
    Case(
        "too-many-tools",
        mutated(lambda d: d["tools"].extend(tool(f"t{i}") for i in range(128))),
        "t2",
        "tools",
        "has 129 items, at most 128 allowed",
    ),
    Case(
        "too-many-turns",
        mutated(lambda d: d["turns"].extend({"user": f"turn {i}"} for i in range(64))),
        "t2",
        "turns",
        "has 65 items, at most 64 allowed",
    ),
    Case(
        "too-many-expected-calls",
        mutated(
            lambda d: d["turns"][0]["expected_calls"].extend(
                copy.deepcopy(d["turns"][0]["expected_calls"]) * 64
            )
        ),
        "t2",
        "turns[0].expected_calls",
        "has 65 items, at most 64 allowed",
    ),
    Case(
        "tool-parameters-file-ref",
        mutated(params(("properties", "to"), {"$ref": "file:///etc/passwd"})),
        "t2",
        "tools[0].function.parameters",
        'cannot be used as parameters at properties.to["$ref"]: $ref "file:///etc/passwd" '
        + REFS_OUTSIDE
        + "inline it under $defs and use \"#/$defs/NAME\" (tool 'transfer')",
    ),
    Case(
        "tool-parameters-ref-to-itself",
        mutated(set_path("tools", 0, "function", "parameters", {"$ref": "#"})),
        "t2",
        "tools[0].function.parameters",
        'cannot be used as parameters at ["$ref"]: ' + RECURSIVE,
    ),
    Case(
        "tool-parameters-mutual-refs",
        mutated(
            set_path(
                "tools",
                0,
                "function",
                "parameters",
                {
                    "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                    "$ref": "#/$defs/a",
                },
            )
        ),
        "t2",
        "tools[0].function.parameters",
        'cannot be used as parameters at ["$defs"].b["$ref"]: ' + RECURSIVE,
    ),
    Case(
        "tool-parameters-dangling-ref",
        mutated(params(("properties", "to"), {"$ref": "#/$defs/account"})),
        "t2",
        "tools[0].function.parameters",
        'cannot be used as parameters at properties.to["$ref"]: $ref "#/$defs/account" points '
        "at nothing in this schema (tool 'transfer')",
    ),
    Case(
        "tool-parameters-lookahead-pattern",
        mutated(params(("properties", "to", "pattern"), "^(?=b)")),
        "t2",
        "tools[0].function.parameters",
        'cannot be used as parameters at properties.to.pattern: pattern "^(?=b)": '
        "lookahead/lookbehind (?=...) (?!...) (?<=...) (?<!...) need backtracking and are not "
        "supported (tool 'transfer')",
    ),
    Case(
        "tool-parameters-pattern-properties",
        mutated(params(("patternProperties",), {"^x": {}})),
        "t2",
        "tools[0].function.parameters",
        "cannot be used as parameters at patternProperties: patternProperties is not supported: "
        "list the properties, or use propertyNames with a pattern (tool 'transfer')",
    ),
    Case(
        "catastrophic-pattern-is-matched-in-linear-time",
        mutated(pattern_arg("^(a+)+$", "a" * 40 + "!")),
        "t2",
        "turns[0].expected_calls[0].arguments.to",
        '"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!" does not match the pattern ^(a+)+$ '
        "(parameters of tool 'transfer')",
    ),
]


def test_the_table_covers_enough_distinct_inputs() -> None:
    assert len(CASES) >= 25
    assert len({c.name for c in CASES}) == len(CASES)
    assert len({c.line for c in CASES}) == len(CASES)


def _write(tmp_path: Path, case: Case) -> Path:
    path = tmp_path / "tasks.jsonl"
    line = case.line if isinstance(case.line, bytes) else case.line.encode("utf-8")
    path.write_bytes(json.dumps(good_task("t1")).encode() + b"\n" + line + b"\n")
    return path


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed_task_gets_a_precise_error(tmp_path: Path, case: Case) -> None:
    path = _write(tmp_path, case)
    with pytest.raises(TaskFormatError) as info:
        load_tasks(path, known_environments=KNOWN)
    err = info.value

    where = f"{path}:2" + (f" (id={case.task_id})" if case.task_id else "")
    field = f"{case.field}: " if case.field else ""
    assert str(err) == f"{where}: {field}{case.message}"
    assert (err.file, err.line, err.task_id, err.field, err.message) == (
        str(path),
        2,
        case.task_id,
        case.field,
        case.message,
    )
    assert "\n" not in str(err)

    result = load_tasks(path, skip_invalid=True, known_environments=KNOWN)
    assert [t.id for t in result.tasks] == ["t1"]
    assert [str(e) for e in result.skipped] == [str(err)]


def test_the_base_task_of_the_table_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text(json.dumps(good_task("t1")) + "\n" + json.dumps(good_task()) + "\n")
    assert [t.id for t in load_tasks(path, known_environments=KNOWN).tasks] == ["t1", "t2"]


def test_success_with_environment_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "env.jsonl"
    task = good_task()
    task["environment"] = {"name": "bank", "initial_state": {"bob": 0}}
    task["success"] = {"final_state": {"bob": 5}}
    task["turns"] = [{"user": "Send 5 to bob"}]  # the success rule alone grades it
    path.write_text(json.dumps(task) + "\n")
    loaded = load_tasks(path, known_environments=KNOWN).tasks[0]
    assert loaded.success == {"final_state": {"bob": 5}}
