"""Training engines: the optimiser side of the trainer, behind one small interface.

`TorchEngine` is plain PyTorch (AdamW, gradient clipping, an lr schedule) for CPU and single-GPU
runs; a DeepSpeed ZeRO engine implements the same interface for multi-GPU runs. The trainer only
calls `forward`, `backward`, `step`, `state_dict`/`load_state_dict` and `save_model`.

Both engines train what `train.trainable` selects (all weights, LoRA adapters, the top decoder
layers: `envace/train/adapters.py`); the optimizer holds only those parameters, and saved
weights are always a plain Hugging Face checkpoint (LoRA merged in).
"""

from __future__ import annotations

import contextlib
import logging
import math
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import torch

from envace.errors import ConfigError, UserInputError, diverged
from envace.train.adapters import (
    Trainable,
    adapter_state,
    apply_trainable,
    lora_layers,
    merged_state_dict,
    restore_adapters,
    save_hf_checkpoint,
)
from envace.train.batch import MicroBatch, token_logprobs

__all__ = ["TorchEngine", "TrainingEngine", "lr_lambda"]

log = logging.getLogger(__name__)

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def require_finite_weights(model: Any, where: str) -> None:
    """Raise TrainingDiverged when a parameter of `model` holds nan/inf (a diverged update), so
    such weights are neither sampled from nor saved as a complete checkpoint. `where` names
    them in the message. Under ZeRO-3 a rank sees empty placeholders here: nothing to check."""
    for name, param in model.named_parameters():
        if param.numel() and not bool(torch.isfinite(param).all()):
            raise diverged(
                f"parameter {name} of {where} holds nan or inf",
                "Lower train.lr / warm_start.lr, or the clipping threshold train.grad_clip.",
            )


def load_trainer_state(path: Path) -> dict[str, Any]:
    """A `trainer_state.pt` (iteration, optimizer and scheduler states, RNG states), loaded
    with `weights_only=True`: tensors and plain values only, so a file planted in the store
    cannot run code when a job resumes from it."""
    import pickle

    try:
        state: dict[str, Any] = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UserInputError(
            f"{path}: refused to load: it holds objects other than tensors and plain values"
            f" ({str(exc).splitlines()[0][:200]}); EnvACE writes none, so this file was not"
            " written by EnvACE's trainer. Resume from another checkpoint"
        ) from None
    return state


class TrainingEngine(Protocol):
    """What the trainer calls. Engines subclass it: the optional abilities below have defaults
    that fit an engine holding the whole model in one process, so callers never probe for them.
    """

    model: Any  # the module generation uses (unwrapped)
    # RLTrainer may split rows across ranks (gradients are averaged over them)
    data_parallel: bool = False
    # the optimizer state lives in shards beside the weights (`load_sharded_state` reads them)
    shards_optimizer_state: bool = False

    @property
    def partitioned(self) -> bool:
        """Each rank holds a shard of the weights only (ZeRO-3): no whole copy can be taken."""
        return False

    def generation_context(self) -> AbstractContextManager[None]:
        """Collective: the weights ready for generation inside (gathered when partitioned)."""
        return contextlib.nullcontext()

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Collective: the whole model's weights with Hugging Face names (LoRA merged) on the
        main rank, None on the others."""
        return merged_state_dict(self.model)

    def load_sharded_state(self, folder: Path) -> None:
        """Collective: read the optimizer-state shards saved in `folder` (engines with
        `shards_optimizer_state`; the others keep it all in `state_dict`: nothing to read)."""
        return None

    def logprobs(self, mb: MicroBatch) -> torch.Tensor: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> float:
        """Clip, apply and zero the accumulated gradients; returns the pre-clip grad norm."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def save_model(self, out_dir: Path, tokenizer: Any) -> None:
        """Weights + tokenizer, plus any engine state kept beside them (collective)."""
        ...

    def save_weights(self, out_dir: Path, tokenizer: Any) -> None:
        """Hugging Face weights + tokenizer only (collective): a final or exported model."""
        ...


def lr_lambda(schedule: str, warmup: int, total: int) -> Any:
    """Multiplier of the base lr at optimizer step s (linear warmup, then the schedule)."""

    def f(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress  # linear

    return f


class TorchEngine(TrainingEngine):
    """AdamW on one process. `total_steps` sizes the lr schedule. `trainable` (`train.trainable`)
    sets which parameters train before the optimizer is built; None takes the model as it comes
    (its `requires_grad` flags, adapters an earlier engine added: a save-only engine changes
    nothing).

    `master_weights` (`train.master_weights`): the optimizer updates float32 copies of the
    trainable bf16/fp16 weights and writes each step's result back, rounded, into the model (as
    DeepSpeed's ZeRO and torch's mixed precision do). Without them an AdamW step of lr 1e-4 leaves
    most bf16 weights unchanged: the step is below half a bf16 ulp of any weight above ~0.026
    (measured on SmolLM2: 14 % of the top layers' weights move at lr 1e-4, 4 % at 2e-5).
    """

    def __init__(
        self,
        model: Any,
        lr: float,
        weight_decay: float = 0.01,
        grad_clip: float = 1.0,
        schedule: str = "constant",
        warmup: int = 0,
        total_steps: int = 1,
        trainable: Trainable | None = None,
        master_weights: bool = True,
    ) -> None:
        if trainable is not None:
            apply_trainable(model, trainable)
        self.model = model  # the transformers model itself: adapters sit inside it, unwrapped
        self.trainable = trainable
        self.grad_clip = grad_clip
        trained = [p for p in model.parameters() if p.requires_grad]
        # (model weight, its float32 master) for each low-precision trainable weight
        self.masters = [
            (p, p.detach().to(torch.float32, copy=True))
            for p in trained
            if master_weights and p.dtype in _LOW_PRECISION
        ]
        if self.masters:
            log.info(
                "torch engine: float32 master weights for %d %s trainable tensors (%.1f M values)",
                len(self.masters),
                self.masters[0][0].dtype,
                sum(p.numel() for p, _ in self.masters) / 1e6,
            )
        master_of = {id(p): m for p, m in self.masters}
        self.params = [master_of.get(id(p), p) for p in trained]  # what the optimizer updates
        decay = [p for p in self.params if p.ndim >= 2]
        no_decay = [p for p in self.params if p.ndim < 2]
        # No weight decay on norms and biases (standard practice, as in nanoGPT).
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=lr,
            betas=(0.9, 0.999),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(schedule, warmup, total_steps)
        )
        self.steps = 0

    def logprobs(self, mb: MicroBatch) -> torch.Tensor:
        self.model.train()
        return token_logprobs(self.model, mb.to(self.model.device))

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        for p, m in self.masters:  # the model's gradients, as float32, onto the masters
            m.grad = None if p.grad is None else p.grad.to(torch.float32)
            p.grad = None
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        if torch.isfinite(norm):  # an overflowed gradient is dropped, never applied
            self.optimizer.step()
            self.scheduler.step()
            self._write_masters()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return float(norm)

    def _write_masters(self) -> None:
        with torch.no_grad():
            for p, m in self.masters:
                p.copy_(m)

    @property
    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, scheduler, step count, what trains and (LoRA) the adapters: the saved
        weights have them merged in, and the optimizer's moments belong to these tensors."""
        state: dict[str, Any] = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "steps": self.steps,
            "trainable": None if self.trainable is None else self.trainable.describe(),
        }
        if self.masters:  # the saved weights are the masters rounded: keep the exact values
            state["master_weights"] = [m.detach().clone() for _, m in self.masters]
        adapters = adapter_state(self.model)
        if adapters:
            state["adapters"] = adapters
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: call on an engine built like the saved one, over the saved (merged) weights."""
        saved = state.get("trainable")
        if saved is not None and self.trainable is not None and saved != self.trainable.describe():
            raise ConfigError(
                f"train.trainable: the checkpoint's optimizer state trains {saved}, this engine"
                f" {self.trainable.describe()}; resume with the run's train.trainable,"
                " train.lora and train.top_layers"
            )
        if "adapters" in state:
            restore_adapters(self.model, state["adapters"])
        elif lora_layers(self.model):
            raise ConfigError(
                "train.trainable: this engine trains LoRA adapters but the checkpoint's"
                " optimizer state has none; resume with the run's train.trainable"
            )
        self._load_masters(state.get("master_weights"))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = int(state["steps"])

    def _load_masters(self, saved: list[torch.Tensor] | None) -> None:
        """The masters from a saved state, or (none saved: a float32 run's, or one from before
        master weights) from the model's weights as loaded."""
        shapes = [tuple(m.shape) for _, m in self.masters]
        if saved is not None and [tuple(t.shape) for t in saved] != shapes:
            raise ConfigError(
                f"train.master_weights: the checkpoint holds {len(saved)} master weight(s), this"
                f" engine trains {len(shapes)} low-precision tensor(s) of other shapes; resume"
                " with the run's model.dtype, train.trainable and train.master_weights"
            )
        with torch.no_grad():
            for i, (p, m) in enumerate(self.masters):
                m.copy_(p if saved is None else saved[i])
        if saved is not None:
            self._write_masters()

    def save_weights(self, out_dir: Path, tokenizer: Any) -> None:
        """Hugging Face weights + tokenizer (the optimizer state lives in `state_dict`)."""
        self.save_model(out_dir, tokenizer)

    def save_model(self, out_dir: Path, tokenizer: Any) -> None:
        """A plain Hugging Face checkpoint, LoRA merged: loads without peft."""
        save_hf_checkpoint(self.model, Path(out_dir), tokenizer)
