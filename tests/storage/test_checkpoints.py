"""latest_complete: the newest checkpoint whose manifest exists and verifies wins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envace.errors import UserInputError
from envace.storage import (
    MANIFEST_NAME,
    checkpoint_name,
    checkpoint_step,
    checkpoint_uri,
    commit_dir,
    latest_complete,
    list_checkpoints,
    open_store,
)


def test_names() -> None:
    assert checkpoint_name(10) == "iter_000010"
    assert checkpoint_name(1234567) == "iter_1234567"
    assert checkpoint_step("iter_000010") == 10
    assert checkpoint_step("iter_10") is None
    assert checkpoint_step("iter_000010.tmp") is None
    with pytest.raises(UserInputError):
        checkpoint_name(-1)


def _commit(tmp_path: Path, prefix: str, step: int, config: Any) -> str:
    src = tmp_path / f"src{step}"
    src.mkdir()
    (src / "weights.bin").write_bytes(bytes([step % 256]) * (100 + step % 7))
    (src / "state.json").write_text(f'{{"step": {step}}}')
    uri = checkpoint_uri(prefix, step)
    commit_dir(src, uri, config)
    return uri


def test_latest_skips_partial_and_corrupt_newer_checkpoints(
    store_root: Any, tmp_path: Path
) -> None:
    prefix = f"{store_root.uri}/checkpoints"
    cfg = store_root.config
    assert latest_complete(prefix, cfg) is None

    _commit(tmp_path, prefix, 1, cfg)
    good = _commit(tmp_path, prefix, 2, cfg)
    partial = _commit(tmp_path, prefix, 3, cfg)
    corrupt = _commit(tmp_path, prefix, 4, cfg)
    store, key = open_store(partial, cfg)
    store.delete(f"{key}/{MANIFEST_NAME}".lstrip("/"))  # an upload that never finished
    store, key = open_store(corrupt, cfg)
    store.delete(f"{key}/weights.bin".lstrip("/"))  # a file lost after the commit
    not_a_checkpoint = tmp_path / "misc"
    not_a_checkpoint.mkdir()
    (not_a_checkpoint / "x").write_text("x")
    commit_dir(not_a_checkpoint, f"{prefix}/best", cfg)

    assert [s for s, _ in list_checkpoints(prefix, cfg)] == [1, 2, 4]
    assert latest_complete(prefix, cfg) == good


def test_steps_sort_numerically_past_six_digits(store_root: Any, tmp_path: Path) -> None:
    prefix = f"{store_root.uri}/ck"
    _commit(tmp_path, prefix, 999_999, store_root.config)
    newest = _commit(tmp_path, prefix, 1_000_000, store_root.config)
    assert latest_complete(prefix, store_root.config, deep=True) == newest
