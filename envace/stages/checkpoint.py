"""Checkpoints between pipeline steps: `policy/` (+ `simulator/`), `trainer_state.pt` and
`checkpoint.json` (iterations trained, where RL started), loaded into a scratch folder."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.config import Config
from envace.stages.store import CHECKPOINT_META, _model_dir
from envace.train.engine import load_trainer_state
from envace.train.learners import (
    TRAINER_STATE,
    trains_simulator,
)

log = logging.getLogger(__name__)


# --- checkpoints ------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointMeta:
    """A checkpoint's place in the run: RL iterations trained into it, and the checkpoint RL
    started from (the KL reference and the default frozen external simulator)."""

    iteration: int
    rl_start: str

    @classmethod
    def read(cls, folder: Path, uri: str) -> CheckpointMeta:
        path = folder / CHECKPOINT_META
        if not path.is_file():  # an initial or warm-start checkpoint: RL starts here
            return cls(0, uri)
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(int(data["iteration"]), str(data["rl_start"]))


@dataclass
class _Checkpoint:
    uri: str
    policy: Any
    tokenizer: Any
    simulator: Any | None  # noshare: the simulator's own model, once it has one
    state: dict[str, Any] | None  # trainer_state.pt: optimizer states, iteration, RNG
    meta: CheckpointMeta
    folder: Path | None = None  # the local copy (DeepSpeed state lives in <folder>/<model>/)


def _load_checkpoint(cfg: Config, uri: str, scratch: Path, with_state: bool) -> _Checkpoint:
    from transformers import AutoModelForCausalLM

    from envace.policy.hf_backend import load_model_and_tokenizer, place_model, resolve_dtype

    source = _model_dir(uri, scratch / hashlib.sha256(uri.encode()).hexdigest()[:12])
    folder = Path(source)
    if not (folder / "policy").is_dir():
        model, tokenizer = load_model_and_tokenizer(
            source, cfg.model.dtype, device=cfg.model.device
        )
        return _Checkpoint(uri, model, tokenizer, None, None, CheckpointMeta(0, uri), folder)
    model, tokenizer = load_model_and_tokenizer(
        folder / "policy", cfg.model.dtype, device=cfg.model.device
    )
    simulator = None
    if (folder / "simulator").is_dir():
        simulator = place_model(
            AutoModelForCausalLM.from_pretrained(
                folder / "simulator", dtype=resolve_dtype(cfg.model.dtype)
            ),
            cfg.model.device,
        )
    state = None
    if with_state and (folder / TRAINER_STATE).is_file():
        state = load_trainer_state(folder / TRAINER_STATE)
    meta = CheckpointMeta.read(folder, uri)
    return _Checkpoint(uri, model, tokenizer, simulator, state, meta, folder)


def _policy_dir(ckpt: _Checkpoint) -> Path | None:
    """The local Hugging Face folder of the checkpoint's policy (a vLLM engine loads it)."""
    if ckpt.folder is None or not ckpt.folder.is_dir():
        return None
    return ckpt.folder / "policy" if (ckpt.folder / "policy").is_dir() else ckpt.folder


def _rl_start_policy(cfg: Config, ckpt: _Checkpoint, scratch: Path) -> Any:
    """The policy as it was when RL started (a fresh copy when that is this checkpoint)."""
    if ckpt.meta.rl_start == ckpt.uri:
        return copy.deepcopy(ckpt.policy)
    return _load_checkpoint(cfg, ckpt.meta.rl_start, scratch, with_state=False).policy


def _saved_simulator(cfg: Config, ckpt: _Checkpoint) -> Any | None:
    """The simulator's own model when it trains: the checkpoint's, or the policy's copy."""
    if not trains_simulator(cfg):
        return None
    return ckpt.simulator if ckpt.simulator is not None else copy.deepcopy(ckpt.policy)
