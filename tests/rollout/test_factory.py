"""`build_policy`: a missing or corrupt checkpoint is a one-line `UserInputError` naming the
checkpoint, the reason and the accepted --policy forms, never a transformers traceback."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from envace.errors import UserInputError
from envace.rollout.factory import POLICY_FORMS, build_policy
from envace.rollout.policies import ModelPolicy, OraclePolicy
from envace.storage.artifacts import commit_dir


@pytest.fixture(scope="module")
def checkpoint(
    tmp_path_factory: pytest.TempPathFactory, micro_model: Any, tiny_tokenizer: Any
) -> Path:
    from envace.policy.tiny import save_checkpoint

    return save_checkpoint(micro_model, tiny_tokenizer, tmp_path_factory.mktemp("ckpt") / "good")


def _truncate_weights(d: Path) -> None:
    (d / "model.safetensors").write_bytes(b"\x01\x02")


def _break_tokenizer(d: Path) -> None:
    (d / "tokenizer.json").write_text("{not json")


def _unknown_model_type(d: Path) -> None:
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "model_type": "nonesuch"}))


def test_a_good_checkpoint_and_the_scripted_policies_build(checkpoint: Path) -> None:
    assert isinstance(build_policy("oracle"), OraclePolicy)
    assert isinstance(build_policy(str(checkpoint)), ModelPolicy)


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        (_truncate_weights, "header"),
        (_break_tokenizer, "property name"),
        (_unknown_model_type, "nonesuch"),
    ],
)
def test_a_corrupt_checkpoint_names_the_path_the_reason_and_the_fix(
    checkpoint: Path, tmp_path: Path, corrupt: Callable[[Path], None], reason: str
) -> None:
    bad = Path(shutil.copytree(checkpoint, tmp_path / "bad"))
    corrupt(bad)
    with pytest.raises(UserInputError) as info:
        build_policy(str(bad))
    msg = str(info.value)
    assert f"cannot load the checkpoint {bad}" in msg and reason in msg
    assert "re-download or re-commit" in msg and POLICY_FORMS in msg
    assert "\n" not in msg


def test_a_committed_checkpoint_is_verified_first(checkpoint: Path, tmp_path: Path) -> None:
    bad = Path(shutil.copytree(checkpoint, tmp_path / "committed"))
    commit_dir(bad, str(bad))
    _truncate_weights(bad)
    with pytest.raises(UserInputError, match=r"model\.safetensors \(size 2, manifest says \d+\)"):
        build_policy(str(bad))


@pytest.mark.parametrize("spec", ["/nonexistent/dir", "./runs/ckpt", "~/no/such/ckpt", "a/b/c"])
def test_a_missing_checkpoint_directory_is_not_taken_for_a_hub_id(spec: str) -> None:
    with pytest.raises(UserInputError) as info:
        build_policy(spec)
    msg = str(info.value)
    assert msg.startswith(f"no such checkpoint directory: {spec}") and POLICY_FORMS in msg
    assert "Repo id" not in msg


def test_a_folder_without_config_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"no config\.json"):
        build_policy(str(tmp_path))
