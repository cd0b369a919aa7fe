"""Generate the chart README's value table and the schema's descriptions from values.yaml.

Every value in values.yaml carries a helm-docs style comment (`# -- text`, continued on following
`# ` lines) right above its key. This script is the single writer of
- the table between the `<!-- values:start -->` / `<!-- values:end -->` markers of README.md, and
- the `description` of each documented key in values.schema.json,
so the three files cannot drift. `--check` exits 1 when either file is out of date (used by tests).

    python charts/envace/hack/gen_readme.py [--check]
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ValueDoc", "check", "parse_value_docs", "render_table", "write"]

CHART = Path(__file__).resolve().parents[1]
START, END = "<!-- values:start -->", "<!-- values:end -->"
_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z0-9_.\-/]+):(\s|$)")
_DOC = re.compile(r"^\s*# -- ?(?P<text>.*)$")
_CONT = re.compile(r"^\s*# ?(?P<text>.*)$")


@dataclass(frozen=True)
class ValueDoc:
    """One documented value: its dotted path, default (from values.yaml) and description."""

    path: str
    default: Any
    description: str


def _lookup(values: dict[str, Any], path: list[str]) -> Any:
    node: Any = values
    for key in path:
        node = node[key]
    return node


def parse_value_docs(values_file: Path = CHART / "values.yaml") -> list[ValueDoc]:
    """Documented keys of values_file in file order.

    Keys inside YAML sequences (e.g. the items of a default `tolerations` list) are part of their
    parent's default, never documented on their own.
    """
    text = values_file.read_text()
    values = yaml.safe_load(text)
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    seq_owner_indent: int | None = None
    docs: list[ValueDoc] = []
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        stripped = line.strip()
        if seq_owner_indent is not None and stripped and indent > seq_owner_indent:
            continue
        seq_owner_indent = None
        if doc := _DOC.match(line):
            pending = [doc["text"]]
            continue
        if stripped.startswith("#"):
            if pending is not None and (cont := _CONT.match(line)):
                pending.append(cont["text"])
            continue
        if stripped.startswith("- "):
            seq_owner_indent = stack[-1][0] if stack else -1
            continue
        key_match = _KEY.match(line)
        if key_match is None:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [key for _, key in stack] + [key_match["key"]]
        if pending is not None:
            default = _lookup(values, path)
            docs.append(ValueDoc(".".join(path), default, " ".join(pending).strip()))
            pending = None
        stack.append((indent, key_match["key"]))
    return docs


def _schema_node(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for key in path.split("."):
        node = node["properties"][key]
    return node


def _type_of(schema: dict[str, Any], node: dict[str, Any]) -> str:
    if "$ref" in node:
        name = str(node["$ref"]).rsplit("/", 1)[-1]
        if "enum" not in schema["$defs"][name]:
            return name
        node = schema["$defs"][name]
    if "enum" in node:
        return " \\| ".join(json.dumps(v) for v in node["enum"])
    if "oneOf" in node:
        return " or ".join(_type_of(schema, option) for option in node["oneOf"])
    kind = node.get("type", "object")
    return " or ".join(kind) if isinstance(kind, list) else str(kind)


def render_table(docs: list[ValueDoc], schema: dict[str, Any]) -> str:
    """The Markdown value table: key, type (from the schema), default, description."""
    rows = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for doc in docs:
        kind = _type_of(schema, _schema_node(schema, doc.path))
        default = json.dumps(doc.default, separators=(", ", ": "))
        rows.append(f"| `{doc.path}` | {kind} | `{default}` | {doc.description} |")
    return "\n".join(rows) + "\n"


def _described_schema(docs: list[ValueDoc], schema: dict[str, Any]) -> dict[str, Any]:
    updated: dict[str, Any] = copy.deepcopy(schema)
    for doc in docs:
        _schema_node(updated, doc.path)["description"] = doc.description
    return updated


def _expected(readme: str, docs: list[ValueDoc], schema: dict[str, Any]) -> tuple[str, str]:
    if START not in readme or END not in readme:
        raise SystemExit(f"{CHART / 'README.md'} lacks the {START} / {END} markers")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    new_readme = f"{head}{START}\n{render_table(docs, schema)}{END}{tail}"
    new_schema = json.dumps(_described_schema(docs, schema), indent=2) + "\n"
    return new_readme, new_schema


def check(chart: Path = CHART) -> list[str]:
    """Files under chart that are out of date (empty when README and schema match values.yaml)."""
    docs = parse_value_docs(chart / "values.yaml")
    schema_text = (chart / "values.schema.json").read_text()
    readme = (chart / "README.md").read_text()
    new_readme, new_schema = _expected(readme, docs, json.loads(schema_text))
    stale = []
    if new_readme != readme:
        stale.append("README.md")
    if new_schema != schema_text:
        stale.append("values.schema.json")
    return stale


def write(chart: Path = CHART) -> None:
    docs = parse_value_docs(chart / "values.yaml")
    schema = json.loads((chart / "values.schema.json").read_text())
    readme = (chart / "README.md").read_text()
    new_readme, new_schema = _expected(readme, docs, schema)
    (chart / "README.md").write_text(new_readme)
    (chart / "values.schema.json").write_text(new_schema)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README or schema is stale")
    args = parser.parse_args()
    if args.check:
        stale = check()
        for name in stale:
            print(f"{CHART / name} is out of date: run python charts/envace/hack/gen_readme.py")
        return 1 if stale else 0
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
