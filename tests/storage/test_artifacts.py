"""commit_dir / fetch_dir / verify on both backends: a local folder and S3 over real HTTP."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from envace.storage import (
    MANIFEST_NAME,
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    commit_dir,
    fetch_dir,
    join_uri,
    open_store,
    read_manifest,
    verify,
)


def make_artifact(root: Path, random_file: Any) -> dict[str, bytes]:
    """A small checkpoint-like folder; returns {relative path: content}."""
    random_file(root / "model-00001-of-00002.safetensors", 6 * 1024 * 1024 + 3, seed=1)
    random_file(root / "model-00002-of-00002.safetensors", 1024, seed=2)
    (root / "config.json").write_text(json.dumps({"hidden_size": 64}))
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "vocab é✓.txt").write_text("a\nb\n", encoding="utf-8")
    (root / "empty.bin").write_bytes(b"")
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_commit_verify_fetch_round_trip(store_root: Any, tmp_path: Path, random_file: Any) -> None:
    files = make_artifact(tmp_path / "src", random_file)
    uri = join_uri(store_root.uri, "ckpt", "iter_000001")
    manifest = commit_dir(tmp_path / "src", uri, store_root.config)

    assert {e.path: e.size for e in manifest.files} == {k: len(v) for k, v in files.items()}
    assert {e.path: e.sha256 for e in manifest.files} == {
        k: hashlib.sha256(v).hexdigest() for k, v in files.items()
    }
    assert read_manifest(uri, store_root.config) == manifest
    assert verify(uri, store_root.config) == manifest
    assert verify(uri, store_root.config, deep=True) == manifest

    out = tmp_path / "out"
    assert fetch_dir(uri, out, store_root.config) == manifest
    got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert got.pop(MANIFEST_NAME) == manifest.to_json()
    assert got == files
    assert not [p for p in out.rglob("*.envace-part")]


def test_fetch_skips_a_local_copy_that_is_already_complete(
    store_root: Any, tmp_path: Path, random_file: Any
) -> None:
    make_artifact(tmp_path / "src", random_file)
    uri = join_uri(store_root.uri, "a1")
    commit_dir(tmp_path / "src", uri, store_root.config)
    moved: list[int] = []
    fetch_dir(uri, tmp_path / "out", store_root.config, progress=moved.append)
    assert sum(moved) > 6 * 1024 * 1024
    moved.clear()
    fetch_dir(uri, tmp_path / "out", store_root.config, progress=moved.append)
    assert moved == []


def test_missing_and_partial_artifacts_are_refused(
    store_root: Any, tmp_path: Path, random_file: Any
) -> None:
    with pytest.raises(ArtifactNotFoundError, match="no artifact at"):
        verify(join_uri(store_root.uri, "never-written"), store_root.config)

    make_artifact(tmp_path / "src", random_file)
    uri = join_uri(store_root.uri, "partial")
    commit_dir(tmp_path / "src", uri, store_root.config)
    store, prefix = open_store(uri, store_root.config)
    assert store.delete(f"{prefix}/{MANIFEST_NAME}".lstrip("/"))

    for call in (
        lambda: verify(uri, store_root.config),
        lambda: fetch_dir(uri, tmp_path / "out", store_root.config),
    ):
        with pytest.raises(ArtifactIntegrityError) as info:
            call()
        assert f"partial artifact at {uri}" in str(info.value)
        assert "no MANIFEST.json" in str(info.value)
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def _overwrite(store_root: Any, uri: str, rel: str, data: bytes) -> None:
    """Change a stored file behind the manifest's back."""
    store, prefix = open_store(uri, store_root.config)
    store.put_bytes(data, f"{prefix}/{rel}".lstrip("/"))


def test_truncated_file_fails_shallow_verify(
    store_root: Any, tmp_path: Path, random_file: Any
) -> None:
    files = make_artifact(tmp_path / "src", random_file)
    uri = join_uri(store_root.uri, "trunc")
    commit_dir(tmp_path / "src", uri, store_root.config)
    _overwrite(store_root, uri, "config.json", files["config.json"][:-1])
    with pytest.raises(ArtifactIntegrityError) as info:
        verify(uri, store_root.config)
    message = str(info.value)
    assert f"corrupt artifact at {uri}" in message
    assert "config.json (size" in message and "1 of 5 file(s) bad" in message


def test_same_size_corruption_needs_deep_verify_and_fetch_refuses_it(
    store_root: Any, tmp_path: Path, random_file: Any
) -> None:
    files = make_artifact(tmp_path / "src", random_file)
    uri = join_uri(store_root.uri, "flip")
    commit_dir(tmp_path / "src", uri, store_root.config)
    original = files["model-00002-of-00002.safetensors"]
    _overwrite(
        store_root, uri, "model-00002-of-00002.safetensors", bytes([original[0] ^ 1]) + original[1:]
    )

    verify(uri, store_root.config)  # sizes still match: the shallow check cannot see it
    with pytest.raises(ArtifactIntegrityError, match="sha256 differs"):
        verify(uri, store_root.config, deep=True)
    out = tmp_path / "out"
    with pytest.raises(ArtifactIntegrityError) as info:
        fetch_dir(uri, out, store_root.config)
    assert "model-00002-of-00002.safetensors has 1024 bytes" in str(info.value)
    assert not (out / "model-00002-of-00002.safetensors").exists()
    assert not (out / MANIFEST_NAME).exists()


def test_recommit_withdraws_the_old_manifest_before_replacing_files(
    store_root: Any, tmp_path: Path, random_file: Any
) -> None:
    make_artifact(tmp_path / "src", random_file)
    uri = join_uri(store_root.uri, "again")
    commit_dir(tmp_path / "src", uri, store_root.config)
    store, prefix = open_store(uri, store_root.config)
    manifest_key = f"{prefix}/{MANIFEST_NAME}".lstrip("/")
    seen_during_upload: list[bool] = []

    def watch(_: int) -> None:
        seen_during_upload.append(store.exists(manifest_key))

    (tmp_path / "src" / "config.json").write_text('{"hidden_size": 128}')
    manifest = commit_dir(tmp_path / "src", uri, store_root.config, progress=watch)
    assert seen_during_upload and not any(seen_during_upload)
    assert verify(uri, store_root.config, deep=True) == manifest
    assert {e.path: e.size for e in manifest.files}["config.json"] == len('{"hidden_size": 128}')
