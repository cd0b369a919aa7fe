"""Property tests of `store put` / `store get` on random folder trees holding files, folders,
temporary files of killed writers and symbolic links (inside, outside, dangling, to folders):
a put then a get reproduces exactly the files that were asked for, or the put is refused with a
StoreError naming the cause before anything is committed. Never another exception."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.errors import UserInputError
from envace.storage import MANIFEST_NAME, StoreError, UnsafeTreeError, commit_dir, fetch_dir
from envace.storage.base import is_temp_name

SECONDS_PER_CASE = 5.0
FUZZ = settings(
    max_examples=int(os.environ.get("ENVACE_FUZZ_EXAMPLES", "60")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Names include what is legal but awkward (spaces, dots, unicode) and what keys refuse
# (a backslash), plus hidden temporary names.
name = st.one_of(
    st.text("abAB019 ._-é✓\\", min_size=1, max_size=6).filter(lambda n: n not in (".", "..")),
    st.sampled_from([".x.json.k2j4.tmp", ".ab12.envace-part", ".tmpq9"]),
)
KINDS = ("file", "dir", "link_inside", "link_outside", "link_dangling", "link_dir")
entry = st.tuples(
    st.lists(name, min_size=1, max_size=3), st.sampled_from(KINDS), st.binary(max_size=64)
)


@dataclass
class Tree:
    """What was built: the files a put must store without following links, and with."""

    plain: dict[str, bytes]
    followed: dict[str, bytes]
    links: int
    dangling: int


def _build(root: Path, outside: Path, entries: list[tuple[list[str], str, bytes]]) -> Tree:
    outside.mkdir()
    (outside / "o.txt").write_bytes(b"outside content")
    (outside / "d").mkdir()
    (outside / "d" / "in.txt").write_bytes(b"in a linked folder")
    tree = Tree({}, {}, 0, 0)
    for parts, kind, data in entries:
        path = root.joinpath(*parts)
        if any(p.is_symlink() or p.is_file() for p in [*path.parents, path]) or path.exists():
            continue  # a name already taken, or a parent that is not a folder
        path.parent.mkdir(parents=True, exist_ok=True)
        rel = "/".join(parts)
        hidden_temp = any(is_temp_name(p) for p in parts)
        if kind == "dir":
            path.mkdir()
            continue
        if kind == "file":
            path.write_bytes(data)
            if not hidden_temp:
                tree.plain[rel] = tree.followed[rel] = data
            continue
        if kind == "link_dangling":
            path.symlink_to(outside / "missing")
        elif kind == "link_dir":
            path.symlink_to(outside / "d", target_is_directory=True)
        else:
            path.symlink_to(outside / "o.txt" if kind == "link_outside" else path.parent)
        if hidden_temp:
            continue
        tree.links += 1
        if kind == "link_dangling":
            tree.dangling += 1
        elif kind == "link_dir":
            tree.followed[f"{rel}/in.txt"] = b"in a linked folder"
        elif kind == "link_outside":
            tree.followed[rel] = b"outside content"
        else:  # a link to its own folder: a loop when followed
            tree.dangling += 1
    return tree


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


def _round_trip(entries: list[tuple[list[str], str, bytes]], follow: bool) -> None:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        src = base / "src"
        src.mkdir()
        tree = _build(src, base / "outside", entries)
        store, out = str(base / "store"), base / "out"
        refused_for = tree.dangling if follow else tree.links
        try:
            commit_dir(src, store, follow_symlinks=follow)
        except UnsafeTreeError as exc:
            assert refused_for, f"refused a tree without links: {exc}"
            assert not (base / "store").exists()  # nothing committed, nothing stored
        except StoreError as exc:  # a name that is no valid key (a backslash)
            assert "backslash" in str(exc)
            assert not (base / "store" / MANIFEST_NAME).exists()
        else:
            assert not refused_for, "committed a tree it should have refused"
            fetch_dir(store, out)
            got = _files(out)
            got.pop(MANIFEST_NAME)
            assert got == (tree.followed if follow else tree.plain)
            assert not any(p.is_symlink() for p in out.rglob("*"))
    assert time.perf_counter() - t0 < SECONDS_PER_CASE


@FUZZ
@given(st.lists(entry, max_size=10))
def test_put_get_round_trips_or_refuses_links(entries: list[tuple[list[str], str, bytes]]) -> None:
    _round_trip(entries, follow=False)


@FUZZ
@given(st.lists(entry, max_size=10))
def test_put_following_links_round_trips_their_content(
    entries: list[tuple[list[str], str, bytes]],
) -> None:
    _round_trip(entries, follow=True)


@FUZZ
@given(st.lists(st.lists(name, min_size=1, max_size=3), min_size=1, max_size=4))
def test_get_never_writes_through_a_link_in_the_destination(links: list[list[str]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        src, dest, victim = base / "src", base / "dest", base / "victim"
        for folder in (src, dest, victim):
            folder.mkdir()
        for i, parts in enumerate(links):  # the artifact: a file at each path that fits
            with_file = src.joinpath(*parts)
            if with_file.exists() or any(p.is_file() for p in with_file.parents):
                continue
            with_file.parent.mkdir(parents=True, exist_ok=True)
            with_file.write_bytes(bytes([i]))
        try:
            manifest = commit_dir(src, str(base / "store"))
        except UserInputError:
            return  # a name keys refuse
        if not manifest.files:
            return  # only temporary files: nothing is written, so nothing goes through a link
        first = manifest.files[0].path.split("/")
        (dest / first[0]).symlink_to(victim, target_is_directory=len(first) > 1)
        try:
            fetch_dir(str(base / "store"), dest)
        except UnsafeTreeError as exc:
            assert "symbolic link" in str(exc)
        else:
            raise AssertionError("wrote through a link in the destination")
        assert list(victim.iterdir()) == []
