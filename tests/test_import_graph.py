"""The package's module-level imports form no cycle, and no module is a god module.

Read from the source with `ast` (nothing is imported): an import at a module's top level
(`TYPE_CHECKING` blocks excluded, function-local imports too: they run late, on purpose) is an
edge from that module to the module it names; a package's `__init__` that re-exports its
submodules is an edge like any other.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("envace", "pipelines")
# Modules over the size aim (~500 lines) that are one thing each, with the reason.
LONG_ON_PURPOSE = {
    "envace.config": "the config dataclasses, their docs and range rules, and the strict YAML "
    "reader: one schema, read in one place",
    "envace.tasks.generate": "the task generator's worlds, one scenario family each",
    "envace.tasks.loader": "the task checks, one per rule of docs/task_format.md",
    "envace.envs.schema_check": "the bounded JSON-schema checker, one keyword per function",
    "envace.evaluate.bfcl.worker": "BFCL's checkers driven in their own venv",
    "envace.policy.static_decode": "the static-cache decoder (one loop and its cache layout)",
    "envace.evaluate.rehearsal": "test-time rehearsal (attempts, notes, committed execution)",
    "envace.rollout.engine": "the episode state machine",
}
MAX_LINES = 520
# Layers, top first: a module imports (at module level) only its own group and lower layers.
# docs/architecture.md draws the same picture.
LAYERS = (
    ("pipelines", "cli"),
    ("stages",),
    ("run",),
    ("evaluate", "train", "cluster"),
    ("rollout",),
    ("reward", "algo"),
    ("policy", "tasks"),
    ("envs", "storage"),
    ("config", "report", "retry"),
    ("errors", "envace"),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    found: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.If) and not _is_type_checking(node):
            body.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            body.extend(node.body + node.orelse + node.finalbody)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def _graph() -> tuple[dict[str, set[str]], dict[str, int]]:
    sources = [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    modules = {_module_name(p): p for p in sources}
    graph: dict[str, set[str]] = {}
    lines: dict[str, int] = {}
    for name, path in modules.items():
        text = path.read_text(encoding="utf-8")
        lines[name] = text.count("\n")
        imports = _top_level_imports(ast.parse(text), name, path.name == "__init__.py")
        graph[name] = {m for m in imports if m in modules and m != name}
    return graph, lines


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _without_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's `__init__` re-exporting its own submodules, which import siblings through the
    package's path, is not a cycle of meaning: drop the edges from a package to its children."""
    return {
        name: {m for m in targets if not m.startswith(f"{name}.")}
        for name, targets in graph.items()
    }


def test_no_import_cycle() -> None:
    graph, _ = _graph()
    assert len(graph) > 100  # the walk found the package
    assert not _cycles(_without_package_inits(graph))


def _group(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "pipelines" or parts[-1] in ("cli", "config_cli", "__main__"):
        return "pipelines" if parts[0] == "pipelines" else "cli"
    return parts[1] if len(parts) > 1 else "envace"


def _layer(group: str) -> int:
    (level,) = [i for i, names in enumerate(LAYERS) if group in names]
    return level


def test_imports_go_down_the_layers() -> None:
    graph, _ = _graph()
    upward = sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if _group(a) != _group(b) and _layer(_group(b)) <= _layer(_group(a))
    )
    assert not upward, upward


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "from . import sib\n"
        "from ..other import thing\n"
        "if TYPE_CHECKING:\n    from envace.x import y\n"
        "def f():\n    import envace.late\n"
    )
    assert _top_level_imports(tree, "envace.pkg.mod", False) == {
        "typing",
        "typing.TYPE_CHECKING",
        "envace.pkg",
        "envace.pkg.sib",
        "envace.other",
        "envace.other.thing",
    }


def test_modules_stay_small_unless_they_are_one_thing() -> None:
    _, lines = _graph()
    too_long = {m: n for m, n in lines.items() if n > MAX_LINES and m not in LONG_ON_PURPOSE}
    assert not too_long, f"split these or say why they are one thing: {too_long}"
    stale = {m for m in LONG_ON_PURPOSE if lines.get(m, 0) <= MAX_LINES}
    assert not stale, f"no longer long: remove from LONG_ON_PURPOSE: {stale}"


def test_the_architecture_doc_names_every_module() -> None:
    """docs/architecture.md stays true to the tree: each package of envace/ has its row in the
    modules table, and the row names every module in it (a new or renamed file fails here)."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    rows = {}
    for line in doc.splitlines():
        found = re.match(r"\| `envace/(\w+)/`", line)
        if found:
            rows[found.group(1)] = line
    missing = []
    for package in sorted(p for p in (REPO / "envace").iterdir() if (p / "__init__.py").is_file()):
        row = rows.get(package.name)
        if row is None:
            missing.append(f"envace/{package.name}/ (no row)")
            continue
        missing += [
            str(f.relative_to(REPO))
            for f in sorted(package.glob("*.py"))
            if f.name != "__init__.py" and f"`{f.name}`" not in row
        ]
    missing += [
        f"envace/{f.name}"
        for f in sorted((REPO / "envace").glob("*.py"))
        if f"`envace/{f.name}`" not in doc
    ]
    assert not missing, f"docs/architecture.md does not name: {missing}"
