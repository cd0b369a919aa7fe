"""The `files` world: a small in-memory file system of folders and text files.

Rules: paths are absolute (`/docs/a.txt`, no `.` or `..`); a parent folder must exist before
anything is written, created or moved into it; `move` never overwrites; a folder must be empty
before `delete`; `/` itself cannot be moved or deleted. Moving a folder moves everything in it.

State (also the `initial_state` format): every folder's sorted listing and every file's text.
Keeping the listings makes "the folder now holds exactly these entries" a plain success rule.

    {"dirs": {"/": ["docs"], "/docs": ["a.txt"]},
     "files": {"/docs/a.txt": "buy milk"}}

`files_state(files, dirs)` builds a consistent state from file paths and extra folders.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Iterable, Mapping
from typing import Any

from envace.envs.base import tool_error
from envace.envs.schema_check import ToolTable, check_state_shape, function_tool
from envace.errors import UserInputError

__all__ = ["FilesWorld", "files_state"]

_PATH_PATTERN = r"^(/|(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)+)$"
_PATH = {
    "type": "string",
    "pattern": _PATH_PATTERN,
    "maxLength": 200,
    "description": "absolute path, e.g. /docs/a.txt",
}
_CONTENT = {"type": "string", "maxLength": 2000, "description": "the whole text of the file"}

_TOOLS = [
    function_tool("list_dir", "List a folder; sub-folders end with '/'.", {"path": _PATH}),
    function_tool("read_file", "Read a text file.", {"path": _PATH}),
    function_tool(
        "write_file",
        "Create or overwrite a text file. Its folder must exist.",
        {"path": _PATH, "content": _CONTENT},
    ),
    function_tool("make_dir", "Create a folder. Its parent must exist.", {"path": _PATH}),
    function_tool(
        "move",
        "Move or rename a file or folder. dst must not exist; its parent must.",
        {"src": _PATH, "dst": _PATH},
    ),
    function_tool("delete", "Delete a file or an empty folder.", {"path": _PATH}),
]

_STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["dirs", "files"],
    "additionalProperties": False,
    "properties": {
        "dirs": {
            "type": "object",
            "required": ["/"],
            "propertyNames": {"pattern": _PATH_PATTERN},
            "additionalProperties": {"type": "array", "items": {"type": "string"}},
        },
        "files": {
            "type": "object",
            "propertyNames": {"pattern": _PATH_PATTERN},
            "additionalProperties": {"type": "string"},
        },
    },
}


def _parent(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or "/"


def _base(path: str) -> str:
    return path.rsplit("/", 1)[1]


def _join(folder: str, name: str) -> str:
    return f"/{name}" if folder == "/" else f"{folder}/{name}"


def files_state(files: Mapping[str, str], dirs: Iterable[str] = ()) -> dict[str, Any]:
    """A consistent state holding `files` (path -> text) and `dirs`; parents are created."""
    listing: dict[str, list[str]] = {"/": []}

    def add_dir(path: str) -> None:
        if path in listing:
            return
        add_dir(_parent(path))
        listing[path] = []
        bisect.insort(listing[_parent(path)], _base(path))

    for folder in dirs:
        add_dir(folder)
    for path in files:
        add_dir(_parent(path))
        bisect.insort(listing[_parent(path)], _base(path))
    ordered = {path: listing[path] for path in sorted(listing)}
    return {"dirs": ordered, "files": {path: files[path] for path in sorted(files)}}


def _tree_problems(state: dict[str, Any]) -> list[str]:
    """Where the listings disagree with the folders and files that exist."""
    dirs, files = state["dirs"], state["files"]
    problems = [f"{path}: is both a file and a folder" for path in files if path in dirs]
    for path in [*dirs, *files]:
        if path == "/":
            continue
        parent = _parent(path)
        if parent not in dirs or _base(path) not in dirs[parent]:
            problems.append(f"{path}: not listed in its parent folder {parent}")
    for folder, names in dirs.items():
        if names != sorted(set(names)):
            problems.append(f"dirs[{folder!r}]: listing must be sorted and without repeats")
        problems += [
            f"dirs[{folder!r}]: lists {name!r}, which does not exist"
            for name in names
            if _join(folder, name) not in dirs and _join(folder, name) not in files
        ]
    return problems


class FilesWorld:
    """The executable file system (see the module docstring for the rules and the state)."""

    name: str = "files"
    # Tools that never change the state: an extra one costs nothing in the turn score.
    READ_ONLY: frozenset[str] = frozenset({"list_dir", "read_file"})

    def __init__(self) -> None:
        self._dirs: dict[str, list[str]] = {"/": []}
        self._files: dict[str, str] = {}
        self._table = ToolTable(
            self.name,
            _TOOLS,
            {
                "list_dir": self._list_dir,
                "read_file": self._read_file,
                "write_file": self._write_file,
                "make_dir": self._make_dir,
                "move": self._move,
                "delete": self._delete,
            },
        )

    def tools(self) -> list[dict[str, Any]]:
        return self._table.schemas()

    def reset(self, initial_state: dict[str, Any]) -> None:
        check_state_shape(self.name, _STATE_SCHEMA, initial_state)
        state = copy.deepcopy(initial_state)
        problems = _tree_problems(state)
        if problems:
            raise UserInputError(
                f"files initial_state is inconsistent: {'; '.join(problems[:5])}; "
                "build it with envace.envs.files.files_state to keep listings in step"
            )
        self._dirs, self._files = state["dirs"], state["files"]

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self._table.call(name, arguments)

    def snapshot(self) -> dict[str, Any]:
        dirs = {path: list(self._dirs[path]) for path in sorted(self._dirs)}
        return {"dirs": dirs, "files": {path: self._files[path] for path in sorted(self._files)}}

    # Helpers that keep listings in step with the entries.

    def _exists(self, path: str) -> bool:
        return path in self._dirs or path in self._files

    def _link(self, path: str) -> None:
        bisect.insort(self._dirs[_parent(path)], _base(path))

    def _unlink(self, path: str) -> None:
        self._dirs[_parent(path)].remove(_base(path))

    def _parent_error(self, path: str) -> dict[str, Any] | None:
        parent = _parent(path)
        if parent in self._dirs:
            return None
        if parent in self._files:
            return tool_error("NOT_A_DIRECTORY", f"{parent} is a file")
        return _not_found(parent)

    # Handlers: arguments have passed the tool's schema.

    def _list_dir(self, args: dict[str, Any]) -> dict[str, Any]:
        path = args["path"]
        if path in self._files:
            return tool_error("NOT_A_DIRECTORY", f"{path} is a file; use read_file")
        if path not in self._dirs:
            return _not_found(path)
        entries = [
            f"{name}/" if _join(path, name) in self._dirs else name for name in self._dirs[path]
        ]
        return {"entries": entries}

    def _read_file(self, args: dict[str, Any]) -> dict[str, Any]:
        path = args["path"]
        if path in self._dirs:
            return tool_error("IS_A_DIRECTORY", f"{path} is a folder; use list_dir")
        if path not in self._files:
            return _not_found(path)
        return {"content": self._files[path]}

    def _write_file(self, args: dict[str, Any]) -> dict[str, Any]:
        path = args["path"]
        if path in self._dirs:
            return tool_error("IS_A_DIRECTORY", f"{path} is a folder")
        error = self._parent_error(path)
        if error is not None:
            return error
        created = path not in self._files
        if created:
            self._link(path)
        self._files[path] = args["content"]
        return {"path": path, "created": created}

    def _make_dir(self, args: dict[str, Any]) -> dict[str, Any]:
        path = args["path"]
        if self._exists(path):
            return tool_error("ALREADY_EXISTS", f"{path} already exists")
        error = self._parent_error(path)
        if error is not None:
            return error
        self._dirs[path] = []
        self._link(path)
        return {"created": path}

    def _move_error(self, src: str, dst: str) -> dict[str, Any] | None:
        if not self._exists(src):
            return _not_found(src)
        if src == "/" or dst == src or dst.startswith(src + "/"):
            return tool_error("INVALID_MOVE", f"cannot move {src} to {dst}")
        if self._exists(dst):
            return tool_error("ALREADY_EXISTS", f"{dst} already exists; move never overwrites")
        return self._parent_error(dst)

    def _move(self, args: dict[str, Any]) -> dict[str, Any]:
        src, dst = args["src"], args["dst"]
        error = self._move_error(src, dst)
        if error is not None:
            return error
        self._unlink(src)
        self._dirs = {_rebase(p, src, dst): names for p, names in self._dirs.items()}
        self._files = {_rebase(p, src, dst): text for p, text in self._files.items()}
        self._link(dst)
        return {"moved": src, "to": dst}

    def _delete(self, args: dict[str, Any]) -> dict[str, Any]:
        path = args["path"]
        if path == "/":
            return tool_error("INVALID_PATH", "cannot delete /")
        if path in self._files:
            del self._files[path]
        elif path in self._dirs:
            if self._dirs[path]:
                return tool_error("DIRECTORY_NOT_EMPTY", f"{path} is not empty")
            del self._dirs[path]
        else:
            return _not_found(path)
        self._unlink(path)
        return {"deleted": path}


def _rebase(path: str, src: str, dst: str) -> str:
    """`path` after moving `src` to `dst` (unchanged when it is not `src` or inside it)."""
    if path == src:
        return dst
    if path.startswith(src + "/"):
        return dst + path[len(src) :]
    return path


def _not_found(path: str) -> dict[str, Any]:
    return tool_error("NOT_FOUND", f"{path} does not exist")
