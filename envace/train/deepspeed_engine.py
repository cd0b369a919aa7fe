"""DeepSpeed ZeRO-2/3 behind the trainer's `TrainingEngine` interface.

The trainer calls `logprobs` and `backward` once per micro-batch and `step` once per optimizer
step, with a number of micro-batches that changes every iteration (rows per rollout vary). So
DeepSpeed runs with `managed_gradient_accumulation: false`: `backward` only accumulates and
`step` is the accumulation boundary, whatever the count. The trainer already weights each
micro-batch loss so the parts add up to the batch loss, hence `gradient_accumulation_steps` is 1
and no loss is rescaled here.

Data parallel contract: every rank calls `logprobs`/`backward` the same number of times between
two `step`s (ZeRO-2/3 reduce gradients inside every backward, ZeRO-3 gathers weights inside
every forward), and each rank's loss is the mean over its own rows. DeepSpeed averages the
gradients over ranks, so with equal row counts per rank (`distributed.shard`) an N-rank step is
the single-process step over all rows (tests/train/test_deepspeed.py checks the losses).

What is built from `train.deepspeed_config` (DeepSpeed JSON keys, see `split_deepspeed_config`)
and `train.deepspeed` (EnvACE's own: collective timeout, shm all-reduce, compiled layers): ZeRO stage (default 2), bf16 (default: on with a GPU),
optimizer offload, and everything else DeepSpeed reads. The optimizer (AdamW, no decay on norms
and biases), lr schedule, gradient clipping and what trains (`train.trainable`: LoRA adapters or
the top layers, the same code as `TorchEngine`'s, `envace/train/adapters.py`) come from
`train.*`.

Checkpoints: `save_model(dir)` writes Hugging Face weights gathered from the ZeRO-3 shards (LoRA
merged in; rank 0 writes) plus DeepSpeed's own state under `dir/deepspeed/` (fp32 master weights,
optimizer moments, scheduler; each rank writes its shard) so `load_sharded_state(dir)` resumes
exactly. DeepSpeed is imported when an engine is built, never at module import.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import logging
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from envace.errors import ConfigError
from envace.train.adapters import (
    LoraOptions,
    Trainable,
    apply_trainable,
    lora_scaling,
    merge_lora_state_dict,
)
from envace.train.batch import (
    ChunkFn,
    MicroBatch,
    chunk_logprobs,
    compiled_chunk_logprobs,
    token_logprobs,
)
from envace.train.distributed import (
    DEFAULT_TIMEOUT_S,
    DistInfo,
    barrier,
    init_process_group,
)
from envace.train.engine import TrainingEngine, lr_lambda

if TYPE_CHECKING:
    from envace.config import Config

__all__ = [
    "DeepSpeedEngine",
    "DeepSpeedOptions",
    "LoraOptions",  # re-exported from envace.train.adapters, where it lives
    "build_ds_config",
    "enable_activation_checkpointing",
    "load_pretrained",
    "merge_lora_state_dict",
    "split_deepspeed_config",
]

log = logging.getLogger(__name__)

# DeepSpeed keys the engine sets from train.* (or must set itself): where to configure them instead.
_OWNED_KEYS = {
    "optimizer": "train.lr and train.weight_decay (AdamW)",
    "scheduler": "train.lr_schedule and train.warmup_iterations",
    "gradient_clipping": "train.grad_clip",
    "train_batch_size": "train.micro_batch_rows (the trainer forms the micro-batches)",
    "train_micro_batch_size_per_gpu": "train.micro_batch_rows",
    "gradient_accumulation_steps": "nothing: the trainer accumulates every micro-batch of a step",
    "managed_gradient_accumulation": "nothing: the engine needs it off (variable micro-batches)",
}
# EnvACE's own keys, once read from train.deepspeed_config: their typed section now.
_MOVED_KEYS = ("collective_timeout_s", "cpu_shm_comm", "compile_layers")
_CHECKPOINT_TAG = "state"
_STATE_DIR = "deepspeed"


@dataclass(frozen=True)
class DeepSpeedOptions:
    """Everything the engine needs; `from_config` maps the project config onto it."""

    lr: float
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    schedule: str = "constant"
    warmup: int = 0
    total_steps: int = 1
    # DeepSpeed JSON keys, merged over the engine's defaults (see build_ds_config).
    ds_config: Mapping[str, Any] = field(default_factory=dict)
    gradient_checkpointing: bool = False
    # which parameters train (train.trainable); None: the model's requires_grad as it comes
    trainable: Trainable | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S  # every collective's deadline
    # DeepSpeed's shared-memory all-reduce for CPU ranks: a C++ build of ~2 min on first use;
    # gloo does the same job, and multi-process CPU training only happens in tests.
    cpu_shm_comm: bool = False
    # torch.compile each decoder layer (one graph shared by all layers: fused norms, rotary and
    # activations) and the LM-head chunk. The first step pays the compilation (~30 s on a GPU).
    compile_layers: bool = False

    @classmethod
    def from_config(cls, cfg: Config) -> DeepSpeedOptions:
        t = cfg.train
        ds, _lora = split_deepspeed_config(t.deepspeed_config)
        return cls(
            lr=t.lr,
            weight_decay=t.weight_decay,
            grad_clip=t.grad_clip,
            schedule=t.lr_schedule,
            warmup=t.warmup_iterations * t.steps_per_iteration,
            total_steps=max(1, t.iterations * t.steps_per_iteration),
            ds_config=ds,
            gradient_checkpointing=cfg.model.gradient_checkpointing,
            trainable=Trainable.from_config(cfg),
            timeout_s=t.deepspeed.collective_timeout_s,
            cpu_shm_comm=t.deepspeed.cpu_shm_comm,
            compile_layers=t.deepspeed.compile_layers,
        )

    @property
    def zero_stage(self) -> int:
        return int(dict(self.ds_config.get("zero_optimization") or {}).get("stage", 2))


def split_deepspeed_config(raw: Mapping[str, Any]) -> tuple[dict[str, Any], LoraOptions | None]:
    """`train.deepspeed_config` -> (DeepSpeed keys, LoRA options of its `lora` key).

    `lora` (a mapping or true) is the older spelling of `train.trainable: lora`, read by
    `Trainable.from_config`. Keys the engine derives from `train.*` are refused, naming the
    field to set instead, and so are EnvACE's own keys that moved to `train.deepspeed`.
    """
    where = "train.deepspeed_config"
    for key, instead in _OWNED_KEYS.items():
        if key in raw:
            raise ConfigError(f"{where}.{key}: set by the engine; configure {instead}")
    for key in _MOVED_KEYS:
        if key in raw:
            raise ConfigError(
                f"{where}.{key}: an EnvACE setting, not DeepSpeed's: set train.deepspeed.{key}"
            )
    ds = {k: copy.deepcopy(v) for k, v in raw.items() if k != "lora"}
    lora = LoraOptions.from_mapping(raw["lora"], f"{where}.lora") if raw.get("lora") else None
    stage = dict(ds.get("zero_optimization") or {}).get("stage", 2)
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"{where}.zero_optimization.stage: {stage!r} is not 0, 1, 2 or 3")
    return ds, lora


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def build_ds_config(options: DeepSpeedOptions, world_size: int, on_gpu: bool) -> dict[str, Any]:
    """The DeepSpeed config: the engine's fixed keys, defaults, then the user's keys."""
    defaults: dict[str, Any] = {
        "zero_optimization": {"stage": 2},
        "bf16": {"enabled": on_gpu},
        "steps_per_print": 2**31 - 1,  # the trainer logs metrics; keep DeepSpeed quiet
        "wall_clock_breakdown": False,
    }
    cfg = _deep_merge(defaults, options.ds_config)
    cfg.update(
        {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "train_batch_size": world_size,
            "managed_gradient_accumulation": False,
            "gradient_clipping": options.grad_clip,
        }
    )
    return cfg


def _offloads_optimizer(ds_config: Mapping[str, Any]) -> bool:
    off = dict(ds_config.get("zero_optimization") or {}).get("offload_optimizer") or {}
    return str(off.get("device", "none")) in ("cpu", "nvme")


def _init_distributed(options: DeepSpeedOptions) -> DistInfo:
    import deepspeed
    import deepspeed.ops

    if not options.cpu_shm_comm and not torch.cuda.is_available():
        # DeepSpeed reads this (probed once per process) before building the op.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    info = init_process_group(timeout_s=options.timeout_s)
    deepspeed.init_distributed(
        dist_backend=torch.distributed.get_backend(),
        timeout=datetime.timedelta(seconds=options.timeout_s),
        auto_mpi_discovery=False,
    )
    return info


def load_pretrained(path: str | Path, options: DeepSpeedOptions, dtype: str = "float32") -> Any:
    """Load a Hugging Face checkpoint for this engine.

    Under ZeRO-3 every rank loads only its shard (transformers builds the model inside
    `deepspeed.zero.Init` while an `HfDeepSpeedConfig` is alive), so an 8B model never sits
    whole in each rank's memory.
    """
    from transformers import AutoModelForCausalLM

    info = _init_distributed(options)
    keep_alive = None
    if options.zero_stage == 3:
        from transformers.integrations import HfDeepSpeedConfig

        keep_alive = HfDeepSpeedConfig(
            build_ds_config(options, info.world_size, torch.cuda.is_available())
        )
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    del keep_alive
    return model


class _LogprobModule(torch.nn.Module):  # type: ignore[misc]  # torch is untyped here
    """The module DeepSpeed wraps: its forward is the chunked log-prob computation, so ZeRO-3's
    gather/release hooks see one root forward per micro-batch."""

    def __init__(self, model: Any, chunk_fn: ChunkFn = chunk_logprobs) -> None:
        super().__init__()
        self.model = model
        self.chunk_fn = chunk_fn

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        response_mask: torch.Tensor,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        zeros = response_mask.new_zeros(0)
        mb = MicroBatch(input_ids, attention_mask, response_mask, zeros, [], None, temperature)
        return token_logprobs(self.model, mb, chunk_fn=self.chunk_fn)


def _param_shape(p: torch.nn.Parameter) -> torch.Size:
    return getattr(p, "ds_shape", p.shape)  # ZeRO-3 partitions hold the full shape in ds_shape


def _param_groups(module: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    params = [p for p in module.parameters() if p.requires_grad]
    # No weight decay on norms and biases, as in TorchEngine.
    decay = [p for p in params if len(_param_shape(p)) >= 2]
    no_decay = [p for p in params if len(_param_shape(p)) < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def enable_activation_checkpointing(model: Any) -> None:
    """Per-layer activation checkpointing (non-reentrant, so frozen inputs under LoRA work)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def compile_decoder_layers(model: Any) -> int:
    """torch.compile every decoder layer in place; the number of layers compiled."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise ConfigError(
            "train.deepspeed.compile_layers: this model's decoder has no `layers` list"
        )
    for layer in layers:
        layer.compile()
    return len(layers)


class DeepSpeedEngine(TrainingEngine):
    """`TrainingEngine` over DeepSpeed ZeRO. Build one per process, on every rank."""

    data_parallel = True
    shards_optimizer_state = True

    def __init__(self, model: Any, options: DeepSpeedOptions) -> None:
        import deepspeed

        self.options = options
        # DeepSpeed's ZeRO calls these torch.distributed aliases; not ours to fix, and repeated
        # at every collective they would bury the training log.
        warnings.filterwarnings(
            "ignore",
            message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)`",
            category=FutureWarning,
        )
        self.info = _init_distributed(options)
        on_gpu = torch.cuda.is_available()
        self.ds_config = build_ds_config(options, self.info.world_size, on_gpu)
        if options.gradient_checkpointing:
            enable_activation_checkpointing(model)
        if options.compile_layers:
            compile_decoder_layers(model)
        if options.trainable is not None:
            apply_trainable(model, options.trainable)  # adapters go inside the model, unwrapped
        self.model = model  # generation uses this (under ZeRO-3 its forward is collective)
        self._wrapper = _LogprobModule(
            model, compiled_chunk_logprobs() if options.compile_layers else chunk_logprobs
        )
        self.ds, *_ = deepspeed.initialize(
            model=self._wrapper,
            optimizer=self._optimizer(),
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(
                opt, lr_lambda(options.schedule, options.warmup, options.total_steps)
            ),
            config=self.ds_config,
            dist_init_required=False,
        )
        self.steps = 0
        log.info(
            "DeepSpeed engine: ZeRO-%d, %d rank(s), bf16 %s, offload %s, trains %s",
            self.zero_stage,
            self.info.world_size,
            self.ds_config["bf16"].get("enabled"),
            _offloads_optimizer(self.ds_config),
            "as the model comes" if options.trainable is None else options.trainable.describe(),
        )

    def _optimizer(self) -> torch.optim.Optimizer:
        groups = _param_groups(self._wrapper, self.options.weight_decay)
        if _offloads_optimizer(self.ds_config) and self.ds_config.get(
            "zero_force_ds_cpu_optimizer", True
        ):
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            # DeepSpeed's C++ Adam (built on first use): the fast optimizer for offloaded state.
            opt: torch.optim.Optimizer = DeepSpeedCPUAdam(
                groups, lr=self.options.lr, betas=(0.9, 0.999), adamw_mode=True
            )
            return opt
        # On a GPU the fused kernel: one launch for the whole (ZeRO-flattened) parameter set.
        fused = torch.cuda.is_available()
        return torch.optim.AdamW(groups, lr=self.options.lr, betas=(0.9, 0.999), fused=fused)

    @property
    def zero_stage(self) -> int:
        return int(self.ds.zero_optimization_stage())

    @property
    def partitioned(self) -> bool:
        return self.zero_stage == 3

    @property
    def device(self) -> torch.device:
        return torch.device(self.ds.device)

    @property
    def lr(self) -> float:
        return float(self.ds.get_lr()[0])

    # --- the TrainingEngine interface -------------------------------------------------------
    def logprobs(self, mb: MicroBatch) -> torch.Tensor:
        """(B, T) log-probs of the response tokens (and ECHO's observations). Moves `mb`'s tensors to the engine's device
        (in place), so the loss terms the trainer builds from `mb` live there too."""
        dev = self.device
        mb.input_ids = mb.input_ids.to(dev)
        mb.attention_mask = mb.attention_mask.to(dev)
        mb.response_mask = mb.response_mask.to(dev)
        mb.advantages = mb.advantages.to(dev)
        if mb.env_mask is not None:
            mb.env_mask = mb.env_mask.to(dev)
        self.ds.train()
        # the target mask rides in the response_mask slot: ECHO's observations are scored too
        out: torch.Tensor = self.ds(
            mb.input_ids, mb.attention_mask, mb.target_mask, temperature=mb.temperature
        )
        return out

    def backward(self, loss: torch.Tensor) -> None:
        self.ds.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        """Reduce, clip, apply and zero the gradients of this step; the pre-clip grad norm."""
        self.ds.step()
        self.steps += 1
        norm = self.ds.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def state_dict(self) -> dict[str, Any]:
        """Counters only: optimizer and master weights are sharded across ranks and are saved
        by `save_model` under `<dir>/deepspeed/` (restore them with `load_sharded_state`)."""
        return {
            "steps": self.steps,
            "zero_stage": self.zero_stage,
            "world_size": self.info.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])

    def save_weights(self, out_dir: Path, tokenizer: Any) -> None:
        """Collective: Hugging Face weights (gathered from ZeRO-3 shards, LoRA merged) and the
        tokenizer, written by rank 0; no DeepSpeed state (a final or exported model)."""
        out_dir = Path(out_dir)
        sd = self.full_state_dict()
        if self.info.is_main:
            out_dir.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(out_dir, state_dict=sd, safe_serialization=True)
            tokenizer.save_pretrained(out_dir)
        barrier(f"save weights {out_dir}", self.options.timeout_s)

    def save_model(self, out_dir: Path, tokenizer: Any) -> None:
        """Collective: Hugging Face weights + tokenizer (rank 0) and DeepSpeed state (all)."""
        out_dir = Path(out_dir)
        self.save_weights(out_dir, tokenizer)
        self.ds.save_checkpoint(
            str(out_dir / _STATE_DIR),
            tag=_CHECKPOINT_TAG,
            client_state={"envace": self.state_dict()},
        )
        barrier(f"save {out_dir}", self.options.timeout_s)

    def load_sharded_state(self, ckpt_dir: Path) -> None:
        """Collective: restore weights, optimizer and scheduler saved by `save_model`."""
        state_dir = Path(ckpt_dir) / _STATE_DIR
        if not (state_dir / _CHECKPOINT_TAG).is_dir():
            raise FileNotFoundError(
                f"{state_dir}: no DeepSpeed state (tag {_CHECKPOINT_TAG!r}); was the checkpoint "
                "written by the DeepSpeed engine? A torch-engine checkpoint resumes with "
                "train.engine: torch"
            )
        path, client = self.ds.load_checkpoint(
            str(state_dir), tag=_CHECKPOINT_TAG, load_optimizer_states=True
        )
        if path is None:
            raise RuntimeError(f"{state_dir}: DeepSpeed could not load the checkpoint")
        saved = dict(client or {}).get("envace", {})
        if saved.get("world_size", self.info.world_size) != self.info.world_size:
            raise RuntimeError(
                f"{state_dir}: saved by {saved['world_size']} ranks, resuming with "
                f"{self.info.world_size}; ZeRO shards need the same number of processes"
            )
        self.load_state_dict(saved or {"steps": 0})

    @contextlib.contextmanager
    def generation_context(self) -> Iterator[None]:
        """Collective under ZeRO-3: every rank gathers the whole model and ZeRO's module hooks
        are lifted, so each rank generates on its own (its own prompts, lengths and number of
        forward calls) and nothing waits on the other ranks; on exit the weights are
        partitioned again and the hooks restored. A no-op under ZeRO-0/1/2, where every rank
        already holds the whole (bf16) model."""
        if self.zero_stage != 3:
            yield
            return
        import deepspeed

        offload = self.ds.optimizer.parameter_offload
        params = list(self._wrapper.parameters())
        with deepspeed.zero.GatheredParameters(params):
            for p in params:
                p.ds_active_sub_modules.clear()
            for hook in [*offload.forward_hooks, *offload.backward_hooks]:
                hook.remove()
            offload.forward_hooks, offload.backward_hooks = [], []
            try:
                yield
            finally:
                offload._register_deepspeed_module(offload.module)

    # --- weights ----------------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Collective: the whole model's weights with Hugging Face names (LoRA merged), on
        rank 0; None on the others. Under ZeRO-3 gathered layer by layer."""
        if self.zero_stage == 3:
            raw = self.ds._zero3_consolidated_16bit_state_dict()
        else:
            raw = self._wrapper.state_dict() if self.info.is_main else None
        if raw is None:
            return None
        sd = {k.removeprefix("model."): v.detach().cpu() for k, v in raw.items()}
        scaling = lora_scaling(self.model)
        return sd if scaling is None else merge_lora_state_dict(sd, scaling)
