"""What a store may not do quietly (issue #20 items 4 and 5): follow a symbolic link out of the
folder being committed, commit an artifact missing what it skipped, write through a link in a
download's destination, commit a killed writer's temporary file, resume from a checkpoint whose
bytes were damaged, or show the credentials of an endpoint."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from envace.cli import main
from envace.storage import (
    MANIFEST_NAME,
    S3Settings,
    UnsafeTreeError,
    checkpoint_uri,
    commit_dir,
    fetch_dir,
    latest_complete,
    open_store,
    read_manifest,
    verify,
)
from envace.storage.base import is_temp_name
from envace.storage.checkpoints import fetch_latest
from envace.storage.uri import redact_url


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("a")
    (folder / "sub" / "b.txt").write_text("bb")
    (tmp_path / "outside.txt").write_text("SECRET outside the folder")
    return folder


# --- store put and symbolic links --------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "shown"),
    [
        (lambda s: (s / "link").symlink_to(s.parent / "outside.txt"), "link ->"),
        (lambda s: (s / "dirlink").symlink_to(s / "sub", target_is_directory=True), "dirlink ->"),
        (lambda s: (s / "dangling").symlink_to(s / "nowhere"), "dangling ->"),
    ],
)
def test_put_refuses_symlinks_and_names_them(
    store_root: Any, src: Path, make: Any, shown: str
) -> None:
    make(src)
    uri = f"{store_root.uri}/art"
    with pytest.raises(UnsafeTreeError, match="symbolic link") as err:
        commit_dir(src, uri, store_root.config)
    assert shown in str(err.value) and "--follow-symlinks" in str(err.value)
    store, prefix = open_store(uri, store_root.config)
    assert store.list(prefix) == []  # not one byte moved


def test_a_refused_put_leaves_the_committed_artifact_as_it_was(
    store_root: Any, src: Path, tmp_path: Path
) -> None:
    uri = f"{store_root.uri}/art"
    before = commit_dir(src, uri, store_root.config)
    (src / "link").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(UnsafeTreeError):
        commit_dir(src, uri, store_root.config)
    assert verify(uri, store_root.config, deep=True) == before


def test_follow_symlinks_stores_what_they_point_to(
    store_root: Any, src: Path, tmp_path: Path
) -> None:
    (src / "link").symlink_to(tmp_path / "outside.txt")
    (src / "dirlink").symlink_to(src / "sub", target_is_directory=True)
    uri = f"{store_root.uri}/art"
    commit_dir(src, uri, store_root.config, follow_symlinks=True)
    out = tmp_path / "out"
    fetch_dir(uri, out, store_root.config)
    got = _tree(out)
    got.pop(MANIFEST_NAME)
    assert got == {
        "a.txt": b"a",
        "sub/b.txt": b"bb",
        "dirlink/b.txt": b"bb",
        "link": b"SECRET outside the folder",
    }
    assert not any(p.is_symlink() for p in out.rglob("*"))


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda s: (s / "dangling").symlink_to(s / "nowhere"), "(dangling)"),
        (lambda s: (s / "sub" / "up").symlink_to(s, target_is_directory=True), "(a loop)"),
    ],
)
def test_follow_symlinks_still_refuses_links_to_nothing(
    tmp_path: Path, src: Path, make: Any, what: str
) -> None:
    make(src)
    with pytest.raises(UnsafeTreeError, match="lead nowhere") as err:
        commit_dir(src, str(tmp_path / "store"), follow_symlinks=True)
    assert what in str(err.value) and not (tmp_path / "store").exists()


def test_put_refuses_a_pipe(tmp_path: Path, src: Path) -> None:
    os.mkfifo(src / "fifo")
    with pytest.raises(UnsafeTreeError, match=r"not regular files .*fifo"):
        commit_dir(src, str(tmp_path / "store"))


def test_the_cli_refuses_links_unless_asked(
    tmp_path: Path, src: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (src / "link").symlink_to(tmp_path / "outside.txt")
    dest = str(tmp_path / "store")
    assert main(["store", "put", str(src), dest]) == 2
    err = capsys.readouterr().err
    assert "link -> " in err and "--follow-symlinks" in err and "Traceback" not in err
    assert main(["store", "put", "--follow-symlinks", str(src), dest]) == 0
    assert "link" in {e.path for e in read_manifest(dest).files}


def test_put_into_a_local_store_never_writes_through_its_links(tmp_path: Path, src: Path) -> None:
    store = tmp_path / "store"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store.mkdir()
    (store / "sub").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UnsafeTreeError, match="writing through it"):
        commit_dir(src, str(store))
    assert list(elsewhere.iterdir()) == []


# --- store get and links in the destination ----------------------------------------------------
@pytest.mark.parametrize("where", ["sub", "a.txt", MANIFEST_NAME])
def test_get_never_writes_through_a_link_in_the_destination(
    store_root: Any, src: Path, tmp_path: Path, where: str
) -> None:
    uri = f"{store_root.uri}/art"
    commit_dir(src, uri, store_root.config)
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    target = elsewhere if where == "sub" else elsewhere / "victim"
    if where != "sub":
        target.write_text("keep me")
    (dest / where).symlink_to(target, target_is_directory=where == "sub")
    with pytest.raises(UnsafeTreeError) as err:
        fetch_dir(uri, dest, store_root.config)
    assert f"{dest / where} -> {target} is a symbolic link" in str(err.value)
    assert _tree(elsewhere) == ({} if where == "sub" else {"victim": b"keep me"})
    assert sorted(p.name for p in dest.iterdir()) == [where]


def test_get_into_a_destination_that_is_itself_a_link(tmp_path: Path, src: Path) -> None:
    uri = str(tmp_path / "store")
    commit_dir(src, uri)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    fetch_dir(uri, tmp_path / "alias")
    assert _tree(real)["sub/b.txt"] == b"bb"


# --- temporary files of killed writers ---------------------------------------------------------
def test_temporary_files_never_enter_a_manifest(
    tmp_path: Path, src: Path, caplog: pytest.LogCaptureFixture
) -> None:
    temps = [
        ".config.json.k2j4_x1p.tmp",  # envace.tasks.io.atomic_write_text
        ".3f2a9c.envace-part",  # envace.storage.base.atomic_target
        ".tmpa8x2k_0",  # tempfile's default prefix
        "sub/.model.safetensors.tmp-4242",  # envace.policy.pretrained
    ]
    for name in temps:
        (src / name).write_text("half a file")
    (src / "results.tmp").write_text("a user's file")  # not hidden: kept
    with caplog.at_level(logging.WARNING, logger="envace.storage.manifest"):
        manifest = commit_dir(src, str(src))  # in place, as training commits a checkpoint
    assert {e.path for e in manifest.files} == {"a.txt", "sub/b.txt", "results.tmp"}
    assert "left out 4 temporary file(s)" in caplog.text
    assert all(is_temp_name(Path(t).name) for t in temps)
    verify(str(src), deep=True)


# --- resume from the newest checkpoint that verifies ------------------------------------------
def _commit_step(tmp_path: Path, prefix: str, step: int, config: Any) -> str:
    folder = tmp_path / f"c{step}"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(bytes([step]) * 64)
    uri = checkpoint_uri(prefix, step)
    commit_dir(folder, uri, config)
    return uri


def _flip_a_byte(uri: str, key: str, config: Any) -> None:
    store, prefix = open_store(uri, config)
    full = f"{prefix}/{key}".lstrip("/")
    data = bytearray(store.get_bytes(full))
    data[10] ^= 0xFF
    store.put_bytes(bytes(data), full)


def test_a_resume_skips_a_byte_flipped_newest_checkpoint(
    store_root: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"{store_root.uri}/checkpoints"
    good = _commit_step(tmp_path, prefix, 1, store_root.config)
    bad = _commit_step(tmp_path, prefix, 2, store_root.config)
    _flip_a_byte(bad, "weights.bin", store_root.config)
    assert latest_complete(prefix, store_root.config) == bad  # sizes alone cannot tell
    with caplog.at_level(logging.WARNING, logger="envace.storage.checkpoints"):
        found = fetch_latest(prefix, tmp_path / "local", store_root.config)
    assert found == (good, tmp_path / "local" / "iter_000001")
    assert _tree(found[1])["weights.bin"] == bytes([1]) * 64
    assert "skipping damaged checkpoint 2" in caplog.text and "sha256" in caplog.text
    assert "skipped the newer damaged one(s): iter_000002" in caplog.text
    assert latest_complete(prefix, store_root.config, deep=True) == good


# --- credentials in an endpoint ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:secret@host:9000", "http://host:9000"),
        ("user:secret@host:9000", "host:9000"),
        ("http://user:se/cret@host:9000/v1", "http://host:9000/v1"),
        ("http://user:secret@[::1", "http://[::1"),
        ("https://host:9000/v1", "https://host:9000/v1"),
    ],
)
def test_redact_url_removes_user_and_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    "endpoint",
    ["http://user:hunter2@host:9000", "user:hunter2@host:9000", "http://user:hunter2@[::1"],
)
def test_credentials_in_the_endpoint_appear_in_no_message(
    endpoint: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from envace.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        S3Settings.from_env({"ENVACE_S3_ENDPOINT": endpoint})
    assert "hunter2" not in str(err.value) and "ENVACE_S3_ACCESS_KEY" in str(err.value)
    monkeypatch.setenv("ENVACE_S3_ENDPOINT", endpoint)
    assert main(["store", "ls", "minio://bucket/x"]) == 2
    assert "hunter2" not in capsys.readouterr().err
    built = S3Settings(endpoint="user:hunter2@host:9000")  # built in code, never parsed
    assert "hunter2" not in repr(built) and "hunter2" not in built.endpoint_url
