"""`load_model_and_tokenizer`: `envace run` (model.path) and `envace evaluate` share it, so a
missing, empty or corrupt checkpoint is a `UserInputError` there, not a loader traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envace.errors import UserInputError
from envace.policy.hf_backend import load_model_and_tokenizer


def test_a_missing_or_empty_model_path_names_it_and_model_path(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="no such checkpoint directory: /nonexistent") as info:
        load_model_and_tokenizer("/nonexistent")
    assert "model.path" in str(info.value)
    with pytest.raises(UserInputError) as info:
        load_model_and_tokenizer(tmp_path)
    assert str(info.value).startswith(f"{tmp_path} is not a Hugging Face checkpoint")


def test_a_corrupt_checkpoint_gives_the_reason_on_one_line(
    tmp_path: Path, micro_model: Any, tiny_tokenizer: Any
) -> None:
    from envace.policy.tiny import save_checkpoint

    ckpt = save_checkpoint(micro_model, tiny_tokenizer, tmp_path / "c")
    model, _tokenizer = load_model_and_tokenizer(ckpt)
    assert model.config.vocab_size == micro_model.config.vocab_size
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "model_type": "nonesuch"}))
    with pytest.raises(UserInputError) as info:
        load_model_and_tokenizer(ckpt, hint="point model.path elsewhere")
    msg = str(info.value)
    assert msg.startswith(f"cannot load the checkpoint {ckpt}: ") and "nonesuch" in msg
    assert msg.endswith("or point model.path elsewhere") and "\n" not in msg
