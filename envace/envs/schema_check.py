"""Tool schemas and the checked dispatch every world shares; the one place parameter schemas
are vetted and validators built.

A world validates each call against the tool's JSON schema before running it, so handlers only
ever see well-typed arguments; a bad call is answered with an `INVALID_ARGUMENTS` result (as a
real API answers 400) and an unknown tool with `UNKNOWN_TOOL`. Nothing is ever evaluated.

Every validator built here has the same three properties, whoever uses it (the worlds, the task
loader, the valid-call metric):

- `integer` means a JSON integer literal (`5.0` is a number, not an integer), as the worlds need;
- `$ref` resolves inside the schema only (an empty `referencing.Registry`): nothing is ever
  fetched from the network or read from a file;
- `pattern` is matched by a small automaton without backtracking (`pattern_search`), so its
  cost grows with the length of the text times the size of the pattern, never exponentially.
  A pattern uses Python's syntax minus the features that need backtracking (backreferences,
  lookaround, atomic groups and possessive repeats) and inline flags; `$` is the end of the text
  (as in JSON Schema's ECMA-262 dialect: Python's `re` also lets it match before a final newline).

`parameters_problem` says why a task's parameter schema cannot be used: not a JSON schema, a
`$ref` that leaves the schema or loops back into itself, nesting deeper than
`MAX_SCHEMA_DEPTH`, `patternProperties`, or a pattern `pattern_problem` refuses.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, UnknownType, ValidationError
from referencing import Registry
from referencing.exceptions import Unresolvable

from envace.envs.base import tool_error
from envace.errors import UserInputError

__all__ = [
    "MAX_MATCH_STEPS",
    "MAX_PATTERN_NESTING",
    "MAX_PATTERN_STATES",
    "MAX_SCHEMA_DEPTH",
    "PatternError",
    "SchemaProblem",
    "ToolHandler",
    "ToolTable",
    "argument_errors",
    "arguments_valid",
    "check_state_shape",
    "checked_validator",
    "function_tool",
    "parameters_problem",
    "pattern_problem",
    "pattern_search",
]

ToolHandler = Callable[[dict[str, Any]], dict[str, Any]]

# A pattern is data: these bound what one may cost (see the module docstring).
MAX_PATTERN_STATES = 1000  # automaton states once counted repeats are written out
MAX_PATTERN_NESTING = 32  # groups inside groups
MAX_MATCH_STEPS = 1_000_000  # automaton states visited while matching one value
MAX_SCHEMA_DEPTH = 32  # schemas nested in a parameter schema, each $ref followed counting one

# Python's own regex parser (the syntax stays Python's); private, hence imported by name.
_PARSER: Any = importlib.import_module("re._parser")
_SRE: Any = importlib.import_module("re._constants")


# ---------------------------------------------------------------------------------------------
# Patterns without backtracking: Python's parse tree -> an automaton searched state-set by
# state-set (Thompson's construction), with the state sets cached as they are met (a lazy DFA).


class PatternError(ValueError):
    """A pattern this module does not match (a feature that needs backtracking, or too big), or
    a value that would cost more than `MAX_MATCH_STEPS` to match."""


class _InvalidRegex(PatternError):
    """Not a regular expression at all (JSON Schema's own check reports those)."""


_CHAR, _EPSILON, _ASSERT, _MATCH = range(4)
_CACHE_LIMIT = 4096


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"


# Python's own definitions for str patterns (\d: Unicode decimal digits, \s: str.isspace).
_CATEGORIES: dict[str, Callable[[str], bool]] = {
    "CATEGORY_DIGIT": str.isdecimal,
    "CATEGORY_NOT_DIGIT": lambda c: not c.isdecimal(),
    "CATEGORY_SPACE": str.isspace,
    "CATEGORY_NOT_SPACE": lambda c: not c.isspace(),
    "CATEGORY_WORD": _is_word,
    "CATEGORY_NOT_WORD": lambda c: not _is_word(c),
}
_ANCHORS = {
    "AT_BEGINNING": "begin",
    "AT_BEGINNING_STRING": "begin",
    "AT_END": "end",
    "AT_END_STRING": "end",
    "AT_BOUNDARY": "boundary",
    "AT_NON_BOUNDARY": "inside",
}
_REFUSED = {
    "ASSERT": "lookahead/lookbehind (?=...) (?!...) (?<=...) (?<!...)",
    "ASSERT_NOT": "lookahead/lookbehind (?=...) (?!...) (?<=...) (?<!...)",
    "GROUPREF": "backreferences (\\1, (?P=name))",
    "GROUPREF_EXISTS": "conditional groups (?(1)...)",
    "ATOMIC_GROUP": "atomic groups (?>...)",
    "POSSESSIVE_REPEAT": "possessive repeats (*+, ++, ?+)",
}


def _class_test(items: Sequence[tuple[Any, Any]]) -> Callable[[str], bool]:
    negate = False
    chars: set[str] = set()
    ranges: list[tuple[int, int]] = []
    categories: list[Callable[[str], bool]] = []
    for op, arg in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            chars.add(chr(arg))
        elif name == "RANGE":
            ranges.append((arg[0], arg[1]))
        elif name == "CATEGORY" and str(arg) in _CATEGORIES:
            categories.append(_CATEGORIES[str(arg)])
        else:
            raise PatternError(f"the character class item {name} is not supported")

    def test(c: str) -> bool:
        hit = (
            c in chars
            or any(lo <= ord(c) <= hi for lo, hi in ranges)
            or any(f(c) for f in categories)
        )
        return hit != negate

    return test


class _Builder:
    """Builds the automaton back to front: each piece is compiled knowing where it leads."""

    def __init__(self) -> None:
        self.kind: list[int] = []
        self.arg: list[Any] = []
        self.out: list[tuple[int, ...]] = []

    def add(self, kind: int, arg: Any, out: tuple[int, ...]) -> int:
        if len(self.kind) >= MAX_PATTERN_STATES:
            raise PatternError(
                f"it needs more than {MAX_PATTERN_STATES} states once its repeat counts are "
                "written out; use smaller counts ({m,n})"
            )
        self.kind.append(kind)
        self.arg.append(arg)
        self.out.append(out)
        return len(self.kind) - 1

    def sequence(self, items: Sequence[tuple[Any, Any]], after: int) -> int:
        for op, arg in reversed(items):
            after = self.item(str(op), arg, after)
        return after

    def item(self, op: str, arg: Any, after: int) -> int:
        if op == "LITERAL":
            return self.add(_CHAR, chr(arg).__eq__, (after,))
        if op == "NOT_LITERAL":
            return self.add(_CHAR, chr(arg).__ne__, (after,))
        if op == "ANY":
            return self.add(_CHAR, "\n".__ne__, (after,))
        if op == "IN":
            return self.add(_CHAR, _class_test(arg), (after,))
        if op == "AT" and str(arg) in _ANCHORS:
            return self.add(_ASSERT, _ANCHORS[str(arg)], (after,))
        if op == "BRANCH":
            starts = tuple(self.sequence(alt, after) for alt in arg[1])
            return self.add(_EPSILON, None, starts)
        if op == "SUBPATTERN":
            _group, add_flags, del_flags, body = arg
            if add_flags or del_flags:
                raise PatternError("inline flags such as (?i:...) are not supported")
            return self.sequence(body, after)
        if op in ("MAX_REPEAT", "MIN_REPEAT"):  # greedy or lazy: the same yes/no answer
            low, high, body = arg
            return self.repeat(low, None if high == _SRE.MAXREPEAT else high, body, after)
        what = _REFUSED.get(op, op)
        raise PatternError(f"{what} need backtracking and are not supported")

    def repeat(self, low: int, high: int | None, body: Sequence[Any], after: int) -> int:
        if high is None:
            loop = self.add(_EPSILON, None, ())
            self.out[loop] = (self.sequence(body, loop), after)
            start = loop
        else:
            start = after
            for _ in range(high - low):
                start = self.add(_EPSILON, None, (self.sequence(body, start), after))
        for _ in range(low):
            size = len(self.kind)
            start = self.sequence(body, start)
            if len(self.kind) == size:  # an empty body: repeating it changes nothing
                break
        return start


def _group_nesting(pattern: str) -> int:
    """How deeply groups nest (a character class's brackets and escapes skipped); checked before
    Python's parser, which recurses once per level."""
    depth = deepest = 0
    escaped = in_class = False
    for c in pattern:
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth = max(0, depth - 1)
    return deepest


class _Automaton:
    """A compiled pattern; `search` answers like `re.search(...) is not None` would."""

    def __init__(self, pattern: str) -> None:
        if _group_nesting(pattern) > MAX_PATTERN_NESTING:
            raise PatternError(f"groups nest more than {MAX_PATTERN_NESTING} deep")
        try:
            parsed = _PARSER.parse(pattern)
        except OverflowError as exc:
            raise PatternError(f"{exc}; use a count below 4294967295") from None
        except _SRE.error as exc:
            raise _InvalidRegex(f"not a valid regular expression: {exc}") from None
        if parsed.state.flags & ~_SRE.SRE_FLAG_UNICODE:
            raise PatternError("inline flags such as (?i) are not supported")
        builder = _Builder()
        self.accept = builder.add(_MATCH, None, ())
        self.start = builder.sequence(list(parsed), self.accept)
        self.kind, self.arg, self.out = builder.kind, builder.arg, builder.out
        self.uses_boundaries = any(
            kind == _ASSERT and arg in ("boundary", "inside")
            for kind, arg in zip(self.kind, self.arg, strict=True)
        )
        self._closures: dict[tuple[frozenset[int], tuple[bool, ...]], frozenset[int]] = {}
        self._steps: dict[tuple[frozenset[int], str], frozenset[int]] = {}

    def search(self, text: str) -> bool:
        """One pass over `text`, keeping the set of states every match begun so far is in."""
        budget = [MAX_MATCH_STEPS]
        n = len(text)
        current: frozenset[int] = frozenset()
        before_word = False
        for i in range(n + 1):
            context = (i == 0, i == n, False, False)
            if self.uses_boundaries:
                after_word = i < n and _is_word(text[i])
                # As Python's re: neither \b nor \B holds anywhere in an empty text.
                context = (
                    i == 0,
                    i == n,
                    n > 0 and before_word != after_word,
                    n > 0 and before_word == after_word,
                )
                before_word = after_word
            states = self._closure(current, context, budget)
            if self.accept in states:
                return True
            if i == n:
                return False
            current = self._step(states, text[i], budget)
        return False  # not reached: the loop returns at i == n

    def _closure(
        self, seeds: frozenset[int], context: tuple[bool, ...], budget: list[int]
    ) -> frozenset[int]:
        """The states reachable without reading a character (a new match may start anywhere)."""
        key = (seeds, context)
        found = self._closures.get(key)
        if found is not None:
            return found
        holds = {
            "begin": context[0],
            "end": context[1],
            "boundary": context[2],
            "inside": context[3],
        }
        seen: set[int] = set()
        kept: list[int] = []
        stack = [self.start, *seeds]
        while stack:
            state = stack.pop()
            if state in seen:
                continue
            seen.add(state)
            kind = self.kind[state]
            if kind == _EPSILON:
                stack.extend(self.out[state])
            elif kind == _ASSERT:
                if holds[self.arg[state]]:
                    stack.append(self.out[state][0])
            else:
                kept.append(state)
        _spend(budget, len(seen))
        result = frozenset(kept)
        _remember(self._closures, key, result)
        return result

    def _step(self, states: frozenset[int], c: str, budget: list[int]) -> frozenset[int]:
        key = (states, c)
        found = self._steps.get(key)
        if found is not None:
            return found
        _spend(budget, len(states))
        result = frozenset(
            self.out[s][0] for s in states if self.kind[s] == _CHAR and self.arg[s](c)
        )
        _remember(self._steps, key, result)
        return result


def _spend(budget: list[int], cost: int) -> None:
    budget[0] -= cost
    if budget[0] < 0:
        raise PatternError(
            f"matching it costs more than {MAX_MATCH_STEPS} steps; use a simpler pattern or a "
            "shorter value"
        )


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value


@functools.lru_cache(maxsize=512)
def _automaton(pattern: str) -> _Automaton:
    return _Automaton(pattern)


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be matched here (see the module docstring), or None."""
    try:
        _automaton(pattern)
    except PatternError as exc:
        return str(exc)
    return None


def pattern_search(pattern: str, text: str) -> bool:
    """True when `pattern` matches somewhere in `text` (`$` is the end of the text).

    Raises PatternError when the pattern is refused or the match would cost too much.
    """
    return _automaton(pattern).search(text)


def _pattern_keyword(
    validator: Any, pattern: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not isinstance(pattern, str) or not validator.is_type(instance, "string"):
        return
    try:
        found = pattern_search(pattern, instance)
    except PatternError as exc:
        shown = instance if len(instance) <= 60 else instance[:59] + "…"
        yield ValidationError(f"{shown!r} cannot be checked against {pattern!r}: {exc}")
        return
    if not found:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


# ---------------------------------------------------------------------------------------------
# Validators


def _is_strict_integer(_checker: object, instance: object) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


# JSON Schema counts 5.0 as an integer; accepting it would turn whole-dollar balances and stock
# counts into floats and break exact state equality, so "integer" means a JSON integer literal.
_TYPE_CHECKER = Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer)
_StrictValidator = jsonschema.validators.extend(
    Draft202012Validator,
    validators={"pattern": _pattern_keyword},
    type_checker=_TYPE_CHECKER,
)
# Validators and verdicts are memoised by the schema's canonical JSON; a huge schema is checked
# every time rather than kept.
_MEMO_KEY_LIMIT = 16_384
_validators: dict[tuple[str, bool], Any] = {}


def _canonical(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True, ensure_ascii=False)


def _memoised(cache: dict[Any, Any], key: Any, size: int, make: Callable[[], Any]) -> Any:
    if key in cache:
        return cache[key]
    value = make()
    if size <= _MEMO_KEY_LIMIT:
        _remember(cache, key, value)
    return value


def _validator(schema: Any, check: bool) -> Any:
    def make() -> Any:
        if check:
            Draft202012Validator.check_schema(schema)
        # An empty registry: a $ref outside the schema is Unresolvable, never a fetch.
        return _StrictValidator(schema, registry=Registry())

    text = _canonical(schema)
    return _memoised(_validators, (text, check), len(text), make)


def checked_validator(schema: Mapping[str, Any] | bool) -> Any:
    """A validator (see the module docstring) for a schema that `parameters_problem` accepts or
    a world's own; raises SchemaError when `schema` is not a valid Draft 2020-12 schema."""
    return _validator(schema, check=True)


def arguments_valid(parameters: Mapping[str, Any], arguments: Any) -> bool:
    """True when `arguments` satisfy `parameters`, for any schema a task offers the model (also
    unvetted ones, e.g. BFCL's): a schema that cannot be used counts as not satisfied."""
    try:
        return bool(_validator(parameters, check=False).is_valid(arguments))
    except (Unresolvable, SchemaError, UnknownType, PatternError):
        return False


# ---------------------------------------------------------------------------------------------
# Vetting a task's parameter schema

_Path = tuple[str | int, ...]
_ONE_SCHEMA = (
    "additionalProperties",
    "propertyNames",
    "contains",
    "items",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalItems",
    "contentSchema",
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


@dataclass(frozen=True)
class SchemaProblem:
    """Why a parameter schema cannot be used: where inside it (`path`) and what. `invalid` is
    True when it is not a valid JSON schema at all, False when it is valid but not supported."""

    path: _Path
    message: str
    invalid: bool = False


def _children(node: Any, path: _Path) -> Iterator[tuple[_Path, Any]]:
    """The subschemas (objects or booleans) directly inside schema `node`."""
    if not isinstance(node, dict):
        return
    for key in _ONE_SCHEMA:
        if isinstance(node.get(key), dict | bool):
            yield (*path, key), node[key]
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                if isinstance(sub, dict | bool):
                    yield (*path, key, i), sub
    for key in (*_SCHEMA_MAPS, "dependencies"):
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                if isinstance(sub, dict | bool):
                    yield (*path, key, name), sub


def _walk(root: Any) -> Iterator[tuple[_Path, Any]]:
    """Every schema in `root`, by containment (refs not followed), root first."""
    stack: list[tuple[_Path, Any]] = [((), root)]
    while stack:
        path, node = stack.pop()
        yield path, node
        stack.extend(reversed(list(_children(node, path))))


def _pattern_problems(root: Any) -> Iterator[SchemaProblem]:
    for path, node in _walk(root):
        if not isinstance(node, dict):
            continue
        found: list[tuple[_Path, Any]] = [((*path, "pattern"), node.get("pattern"))]
        if isinstance(node.get("patternProperties"), dict):
            found += [((*path, "patternProperties", k), k) for k in node["patternProperties"]]
        for where, pattern in found:
            if not isinstance(pattern, str):
                continue
            try:
                _automaton(pattern)
            except _InvalidRegex:
                continue  # left to check_schema, which says so in the schema's terms
            except PatternError as exc:
                yield SchemaProblem(where, f"pattern {json.dumps(pattern)[:80]}: {exc}")


def _schema_error(schema: Any) -> SchemaProblem | None:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        message = " ".join(exc.message.split())
        return SchemaProblem(tuple(exc.absolute_path), message[:300], invalid=True)
    except RecursionError:
        return SchemaProblem((), "nested too deeply to be checked")
    return None


def _pointer(ref: str) -> list[str] | None:
    """The parts of a local JSON-pointer ref (`#`, `#/$defs/a`), or None for any other ref."""
    if not ref.startswith("#"):
        return None
    fragment = urllib.parse.unquote(ref[1:])
    if fragment == "":
        return []
    if not fragment.startswith("/"):
        return None
    return [p.replace("~1", "/").replace("~0", "~") for p in fragment[1:].split("/")]


def _step_key(node: Any, part: str) -> str | int | None:
    """The key or index a pointer part names in `node`, or None when there is none."""
    if isinstance(node, dict):
        return part if part in node else None
    if isinstance(node, list) and part.isascii() and part.isdigit() and int(part) < len(node):
        return int(part)
    return None


def _resolve(root: Any, ref: str, where: _Path) -> tuple[_Path, Any] | SchemaProblem:
    parts = _pointer(ref)
    shown = json.dumps(ref)[:120]
    if parts is None:
        return SchemaProblem(
            where,
            f"$ref {shown} points outside the schema, and refs are never fetched (no network, "
            'no files): inline it under $defs and use "#/$defs/NAME"',
        )
    node, path = root, list[str | int]()
    for part in parts:
        key = _step_key(node, part)
        if key is None:
            return SchemaProblem(where, f"$ref {shown} points at nothing in this schema")
        node = node[key]
        path.append(key)
    if not isinstance(node, dict | bool):
        return SchemaProblem(where, f"$ref {shown} does not point at a schema")
    return tuple(path), node


def _node_problem(path: _Path, node: Any) -> SchemaProblem | None:
    if not isinstance(node, dict):
        return None
    if "patternProperties" in node:
        return SchemaProblem(
            (*path, "patternProperties"),
            "patternProperties is not supported: list the properties, or use propertyNames "
            "with a pattern",
        )
    for key in ("$dynamicRef", "$recursiveRef"):
        if key in node:
            return SchemaProblem((*path, key), f"{key} is not supported; use a local $ref")
    if path and "$id" in node:
        return SchemaProblem(
            (*path, "$id"), "$id is only allowed at the top (it changes where $refs point)"
        )
    return None


def _structure_problem(root: Any) -> SchemaProblem | None:
    """Refs that leave the schema or recurse, unsupported keywords, and nesting deeper than
    MAX_SCHEMA_DEPTH counting followed refs. Each schema is visited once (depth-first, no
    recursion: a long chain of refs cannot exhaust the stack)."""
    heights: dict[_Path, int] = {}
    tallest: dict[_Path, int] = {(): 0}
    on_path: set[_Path] = {()}
    first = _node_problem((), root)
    if first is not None:
        return first
    stack: list[tuple[_Path, Iterator[tuple[_Path, Any, _Path | None]]]] = [
        ((), _successors(root, (), root))
    ]
    while stack:
        path, successors = stack[-1]
        step = next(successors, None)
        if step is None:
            stack.pop()
            on_path.discard(path)
            heights[path] = 1 + tallest.pop(path)
            if heights[path] > MAX_SCHEMA_DEPTH:
                return SchemaProblem(
                    path,
                    f"schemas nest more than {MAX_SCHEMA_DEPTH} deep here (each $ref followed "
                    "counts one); flatten the schema",
                )
            if stack:
                parent = stack[-1][0]
                tallest[parent] = max(tallest[parent], heights[path])
            continue
        if isinstance(step, SchemaProblem):
            return step
        child, node, ref_at = step
        if child in on_path:
            return SchemaProblem(
                ref_at or child,
                "this $ref leads back to a schema that contains it (a recursive schema); tool "
                "parameters must not recurse: write the nesting out to the depth you need",
            )
        if child in heights:
            tallest[path] = max(tallest[path], heights[child])
            continue
        problem = _node_problem(child, node)
        if problem is not None:
            return problem
        on_path.add(child)
        tallest[child] = 0
        stack.append((child, _successors(node, child, root)))
    return None


def _successors(node: Any, path: _Path, root: Any) -> Iterator[Any]:
    """(path, schema, where the $ref is or None) of each schema that applies below `node`; a
    SchemaProblem for a $ref that cannot be followed."""
    for child_path, child in _children(node, path):
        yield child_path, child, None
    ref = node.get("$ref") if isinstance(node, dict) else None
    if isinstance(ref, str):
        where = (*path, "$ref")
        target = _resolve(root, ref, where)
        yield target if isinstance(target, SchemaProblem) else (*target, where)


_verdicts: dict[str, SchemaProblem | None] = {}


def parameters_problem(schema: Any) -> SchemaProblem | None:
    """Why `schema` cannot be a tool's parameter schema (see the module docstring), or None."""

    def make() -> SchemaProblem | None:
        found = next(_pattern_problems(schema), None)
        return found or _schema_error(schema) or _structure_problem(schema)

    text = _canonical(schema)
    result: SchemaProblem | None = _memoised(_verdicts, text, len(text), make)
    return result


# ---------------------------------------------------------------------------------------------
# The worlds' tools


def function_tool(
    name: str,
    description: str,
    properties: Mapping[str, dict[str, Any]],
    required: Sequence[str] | None = None,
) -> dict[str, Any]:
    """An OpenAI function-tool schema; every property is required unless `required` says so."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": copy.deepcopy(dict(properties)),
                "required": list(properties if required is None else required),
                "additionalProperties": False,
            },
        },
    }


# A message quotes the offending value; a model can send megabytes, and the message goes back
# into its context as the tool result.
_MAX_MESSAGE_CHARS = 200


def _error_line(error: ValidationError) -> str:
    message = error.message
    if len(message) > _MAX_MESSAGE_CHARS:
        message = f"{message[:_MAX_MESSAGE_CHARS]}... ({len(message)} chars)"
    return f"{error.json_path}: {message}"


def argument_errors(parameters: Mapping[str, Any], arguments: Any) -> list[str]:
    """Every way `arguments` breaks the `parameters` schema, one short line each, sorted."""
    return sorted(_error_line(e) for e in checked_validator(parameters).iter_errors(arguments))


def check_state_shape(world: str, schema: Mapping[str, Any], state: Any) -> None:
    """Raise UserInputError when an initial state does not have the world's state shape."""
    errors = argument_errors(schema, state)
    if errors:
        shown = "; ".join(errors[:5])
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        raise UserInputError(
            f"{world} initial_state is malformed: {shown}{more}; "
            f"fix the task's environment.initial_state (see docs/worlds.md)"
        )


class ToolTable:
    """The tools of one world: their schemas, their handlers, and the checked dispatch."""

    def __init__(
        self,
        world: str,
        tools: Sequence[dict[str, Any]],
        handlers: Mapping[str, ToolHandler],
    ) -> None:
        names = [str(tool["function"]["name"]) for tool in tools]
        if sorted(names) != sorted(handlers):
            raise ValueError(
                f"{world}: tool schemas {names} and handlers {sorted(handlers)} differ"
            )
        self._world = world
        self._tools = copy.deepcopy(list(tools))
        self._handlers = dict(handlers)
        self._validators = {
            str(tool["function"]["name"]): checked_validator(tool["function"]["parameters"])
            for tool in tools
        }

    def schemas(self) -> list[dict[str, Any]]:
        """Deep copies of the OpenAI function-tool schemas."""
        return copy.deepcopy(self._tools)

    def call(self, name: Any, arguments: Any) -> dict[str, Any]:
        """Check the tool name and the arguments, then run the handler on a private copy."""
        if not isinstance(name, str) or name not in self._handlers:
            known = ", ".join(sorted(self._handlers))
            return tool_error(
                "UNKNOWN_TOOL", f"{self._world} has no tool {name!r}; available: {known}"
            )
        validator = self._validators[name]
        errors = sorted(_error_line(e) for e in validator.iter_errors(arguments))
        if errors:
            return tool_error(
                "INVALID_ARGUMENTS", f"arguments of {name} break its schema", errors=errors
            )
        return self._handlers[name](copy.deepcopy(arguments))
