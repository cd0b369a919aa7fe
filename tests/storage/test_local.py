"""LocalStore specifics: in-place commits copy nothing, writes are atomic, listings are clean."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envace.storage import (
    MANIFEST_NAME,
    ArtifactIntegrityError,
    InvalidKeyError,
    LocalStore,
    ObjectInfo,
    ObjectNotFoundError,
    commit_dir,
    fetch_dir,
    verify,
)


def test_commit_in_place_writes_only_the_manifest(tmp_path: Path) -> None:
    ckpt = tmp_path / "iter_000001"
    ckpt.mkdir()
    (ckpt / "w.bin").write_bytes(b"\x01" * 1000)
    inode = (ckpt / "w.bin").stat().st_ino
    manifest = commit_dir(ckpt, str(ckpt))
    assert sorted(p.name for p in ckpt.iterdir()) == [MANIFEST_NAME, "w.bin"]
    assert (ckpt / "w.bin").stat().st_ino == inode
    assert [(e.path, e.size) for e in manifest.files] == [("w.bin", 1000)]
    assert fetch_dir(str(ckpt), ckpt) == manifest  # same folder: a deep verify, no copy


def test_failed_write_leaves_target_untouched_and_no_temp_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put_bytes(b"old", "a/b.json")
    with pytest.raises(IsADirectoryError):
        store.put_file(tmp_path, "a/b.json")  # reading a directory fails mid-copy
    assert store.get_bytes("a/b.json") == b"old"
    assert [p.name for p in (tmp_path / "s" / "a").iterdir()] == ["b.json"]


def test_listing_copy_delete(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put_bytes(b"12345", "run/x/a.bin")
    store.put_bytes(b"1", "run/y.txt")
    (tmp_path / "run" / ".dead.envace-part").write_bytes(b"left by a killed writer")
    assert store.list("run") == [ObjectInfo("run/x/a.bin", 5), ObjectInfo("run/y.txt", 1)]
    assert store.list("run/", recursive=False) == [
        ObjectInfo("run/x/", 0, is_dir=True),
        ObjectInfo("run/y.txt", 1),
    ]
    assert store.list("missing") == []
    store.copy("run/x/a.bin", "run/z/copy.bin")
    assert store.get_bytes("run/z/copy.bin") == b"12345"
    assert store.digest("run/y.txt").size == 1
    assert store.delete_prefix("run/x") == 1
    assert not store.exists("run/x/a.bin") and store.exists("run/z/copy.bin")
    assert store.delete("run/y.txt") and not store.delete("run/y.txt")
    with pytest.raises(ObjectNotFoundError, match="no file at"):
        store.get_bytes("run/y.txt")


def test_keys_cannot_escape_the_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root")
    for key in ("../outside", "/etc/passwd", "a/../../b"):
        with pytest.raises(InvalidKeyError):
            store.put_bytes(b"x", key)
    assert not (tmp_path / "outside").exists()


def test_verify_of_a_folder_written_without_commit_is_partial(tmp_path: Path) -> None:
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "w.bin").write_bytes(os.urandom(10))
    with pytest.raises(ArtifactIntegrityError, match="partial artifact"):
        verify(str(tmp_path / "half"))
