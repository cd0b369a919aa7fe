"""The files world: paths, parents, no-overwrite moves, listings kept in step, snapshots."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from envace.envs.files import FilesWorld, files_state
from envace.errors import UserInputError

STATE = files_state(
    {"/docs/a.txt": "alpha", "/docs/old/b.md": "beta", "/inbox/c.txt": "gamma"}, ["/empty"]
)


def _fs() -> FilesWorld:
    world = FilesWorld()
    world.reset(copy.deepcopy(STATE))
    return world


def _code(result: dict[str, Any]) -> str:
    return str(result["error"]["code"])


def test_files_state_builds_sorted_listings_with_parents() -> None:
    assert STATE == {
        "dirs": {
            "/": ["docs", "empty", "inbox"],
            "/docs": ["a.txt", "old"],
            "/docs/old": ["b.md"],
            "/empty": [],
            "/inbox": ["c.txt"],
        },
        "files": {"/docs/a.txt": "alpha", "/docs/old/b.md": "beta", "/inbox/c.txt": "gamma"},
    }


def test_list_and_read() -> None:
    world = _fs()
    assert world.call("list_dir", {"path": "/docs"}) == {"entries": ["a.txt", "old/"]}
    assert world.call("list_dir", {"path": "/"}) == {"entries": ["docs/", "empty/", "inbox/"]}
    assert world.call("read_file", {"path": "/docs/a.txt"}) == {"content": "alpha"}
    assert _code(world.call("read_file", {"path": "/docs"})) == "IS_A_DIRECTORY"
    assert _code(world.call("list_dir", {"path": "/docs/a.txt"})) == "NOT_A_DIRECTORY"
    assert _code(world.call("read_file", {"path": "/nope.txt"})) == "NOT_FOUND"


def test_write_creates_then_overwrites_and_needs_the_parent() -> None:
    world = _fs()
    assert world.call("write_file", {"path": "/empty/n.txt", "content": "x"}) == {
        "path": "/empty/n.txt",
        "created": True,
    }
    assert world.call("write_file", {"path": "/empty/n.txt", "content": "y"})["created"] is False
    snap = world.snapshot()
    assert snap["files"]["/empty/n.txt"] == "y" and snap["dirs"]["/empty"] == ["n.txt"]
    missing = world.call("write_file", {"path": "/nowhere/n.txt", "content": "x"})
    assert _code(missing) == "NOT_FOUND" and "/nowhere" in missing["error"]["message"]
    under_file = world.call("write_file", {"path": "/docs/a.txt/x", "content": "x"})
    assert _code(under_file) == "NOT_A_DIRECTORY"
    assert _code(world.call("write_file", {"path": "/docs", "content": "x"})) == "IS_A_DIRECTORY"


def test_move_file_updates_both_listings() -> None:
    world = _fs()
    assert world.call("move", {"src": "/inbox/c.txt", "dst": "/docs/c.txt"}) == {
        "moved": "/inbox/c.txt",
        "to": "/docs/c.txt",
    }
    snap = world.snapshot()
    assert snap["dirs"]["/inbox"] == [] and snap["dirs"]["/docs"] == ["a.txt", "c.txt", "old"]
    assert snap["files"]["/docs/c.txt"] == "gamma" and "/inbox/c.txt" not in snap["files"]


def test_move_folder_moves_its_contents() -> None:
    world = _fs()
    world.call("move", {"src": "/docs", "dst": "/empty/docs"})
    snap = world.snapshot()
    assert snap["files"] == {
        "/empty/docs/a.txt": "alpha",
        "/empty/docs/old/b.md": "beta",
        "/inbox/c.txt": "gamma",
    }
    assert snap["dirs"]["/"] == ["empty", "inbox"]
    assert snap["dirs"]["/empty/docs/old"] == ["b.md"]
    # The result must still be a consistent state.
    FilesWorld().reset(snap)


@pytest.mark.parametrize(
    ("src", "dst", "code"),
    [
        ("/inbox/c.txt", "/docs/a.txt", "ALREADY_EXISTS"),  # never overwrites
        ("/inbox/zzz.txt", "/docs/z.txt", "NOT_FOUND"),
        ("/inbox/c.txt", "/missing/c.txt", "NOT_FOUND"),
        ("/docs", "/docs/old/docs", "INVALID_MOVE"),  # into itself
        ("/", "/x", "INVALID_MOVE"),
        ("/docs/a.txt", "/docs/a.txt", "INVALID_MOVE"),
        ("/docs/../a", "/b", "INVALID_ARGUMENTS"),
        ("docs/a.txt", "/b", "INVALID_ARGUMENTS"),
        ("/docs/", "/b", "INVALID_ARGUMENTS"),
    ],
)
def test_bad_moves_change_nothing(src: str, dst: str, code: str) -> None:
    world = _fs()
    before = world.snapshot()
    assert _code(world.call("move", {"src": src, "dst": dst})) == code
    assert world.snapshot() == before


def test_make_dir_and_delete() -> None:
    world = _fs()
    assert world.call("make_dir", {"path": "/new"}) == {"created": "/new"}
    assert _code(world.call("make_dir", {"path": "/new"})) == "ALREADY_EXISTS"
    assert _code(world.call("make_dir", {"path": "/a/b"})) == "NOT_FOUND"
    assert _code(world.call("delete", {"path": "/docs"})) == "DIRECTORY_NOT_EMPTY"
    assert _code(world.call("delete", {"path": "/"})) == "INVALID_PATH"
    assert _code(world.call("delete", {"path": "/ghost"})) == "NOT_FOUND"
    assert world.call("delete", {"path": "/docs/old/b.md"}) == {"deleted": "/docs/old/b.md"}
    assert world.call("delete", {"path": "/docs/old"}) == {"deleted": "/docs/old"}
    assert world.snapshot()["dirs"]["/docs"] == ["a.txt"]


def test_schema_violations_and_unknown_tools() -> None:
    world = _fs()
    assert _code(world.call("write_file", {"path": "/x.txt"})) == "INVALID_ARGUMENTS"
    assert _code(world.call("list_dir", {"path": 3})) == "INVALID_ARGUMENTS"
    assert _code(world.call("copy", {"src": "/a", "dst": "/b"})) == "UNKNOWN_TOOL"


def test_snapshot_is_a_deep_copy_and_reset_drops_everything() -> None:
    world = _fs()
    snap = world.snapshot()
    snap["dirs"]["/docs"].append("ghost")
    snap["files"]["/docs/a.txt"] = "changed"
    assert world.snapshot() == STATE
    world.call("delete", {"path": "/inbox/c.txt"})
    world.reset(files_state({"/only.txt": "x"}))
    assert world.snapshot() == {"dirs": {"/": ["only.txt"]}, "files": {"/only.txt": "x"}}


def test_results_do_not_alias_the_listing() -> None:
    world = _fs()
    world.call("list_dir", {"path": "/inbox"})["entries"].append("ghost")
    assert world.call("list_dir", {"path": "/inbox"}) == {"entries": ["c.txt"]}


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"dirs": {}, "files": {}}, "malformed"),
        ({"dirs": {"/": []}, "files": {"/a/b.txt": "x"}}, "not listed in its parent"),
        ({"dirs": {"/": ["ghost"]}, "files": {}}, "does not exist"),
        ({"dirs": {"/": ["b", "a"], "/a": [], "/b": []}, "files": {}}, "sorted"),
        ({"dirs": {"/": []}, "files": {"relative.txt": "x"}}, "malformed"),
    ],
)
def test_inconsistent_initial_states_are_refused(state: dict[str, Any], message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        FilesWorld().reset(state)
