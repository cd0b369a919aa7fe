"""trainer_state.pt is loaded with weights_only=True: a planted pickle cannot run code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


class _Planted:
    """Stands for any object a planted pickle could carry (code runs on unpickling)."""


def test_trainer_state_loads_plain_values_only(tmp_path: Path) -> None:
    from envace.errors import UserInputError
    from envace.train.engine import load_trainer_state

    ok = tmp_path / "ok.pt"
    torch.save({"iteration": 2, "rng": {"torch": torch.get_rng_state()}}, ok)
    assert load_trainer_state(ok)["iteration"] == 2
    planted = tmp_path / "planted.pt"
    torch.save({"iteration": 2, "extra": _Planted()}, planted)
    with pytest.raises(UserInputError, match="refused to load"):
        load_trainer_state(planted)
