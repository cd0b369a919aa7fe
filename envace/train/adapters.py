"""Which parameters an engine trains: all of them, LoRA adapters, or the top decoder layers.

One implementation for both engines (`TorchEngine`, `DeepSpeedEngine`), chosen by
`train.trainable` (`Trainable.from_config`) and applied to the model before the optimizer is
built, so the optimizer only ever holds the parameters that train.

LoRA (Hu et al., 2021): each target linear layer y = W x becomes

    y = W x + s * B (A x),   W: (out, in), A: (r, in), B: (out, r), s = alpha / r,

with A random and B zero when added, so the model computes the same function until the first
step; W is frozen and only A and B train. The adapters are injected into the transformers model
in place (`peft.inject_adapter_in_model`), without a `PeftModel` wrapper, so the engine's `model`
is still the object generation uses: `generate`, the static decoder, `get_decoder()` and
`get_output_embeddings()` (`batch.token_logprobs`) all run through the adapted layers. What
leaves the process is plain: `merged_state_dict` (W + s B A under the plain model's names) is
what checkpoints hold and what vLLM loads, so no reader needs peft.

Top layers: the last N decoder layers and the final norm train; the embeddings and the LM head
stay frozen. Tied embeddings (SmolLM2, Qwen3 small models) are one matrix used at the input
and at the head: training it would pull the backward through every layer down to the input,
and it is a fifth of a 135 M model. Frozen, nothing below layer L - N requires a gradient, so
autograd neither records nor back-propagates the lower layers.

An engine built on a model that already carries adapters (the RL engine after the warm start's)
reuses them when the options are the same, so adapters never stack; with other options, or a
mode without adapters, they are first merged into the weights. Resume: the engine's state holds
the adapters (`adapter_state`), and `restore_adapters` splits the merged checkpoint weights back
into base + adapters, so the optimizer's moments meet the tensors they were computed for.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from envace.errors import ConfigError, UserInputError

if TYPE_CHECKING:
    import torch

    from envace.config import Config

__all__ = [
    "LoraOptions",
    "Trainable",
    "adapter_state",
    "apply_trainable",
    "lora_layers",
    "lora_scaling",
    "merge_lora_state_dict",
    "merged_state_dict",
    "restore_adapters",
    "save_hf_checkpoint",
    "unload_lora",
]

log = logging.getLogger(__name__)

TrainableMode = Literal["full", "lora", "top_layers"]
_ADAPTER = "default"  # peft's name of the one adapter we add
_LORA_KEYS = ("r", "alpha", "dropout", "target_modules")


@dataclass(frozen=True)
class LoraOptions:
    """LoRA adapters (peft) on the named linear layers; only the adapters train."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )

    @property
    def scaling(self) -> float:
        return self.alpha / self.r

    @classmethod
    def from_mapping(cls, raw: Any, where: str = "train.lora") -> LoraOptions:
        """`raw`: a mapping of r, alpha, dropout, target_modules (each optional), or true for
        the defaults. `where` names the key in errors."""
        if raw is True:
            return cls()
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: expected a mapping ({', '.join(_LORA_KEYS)}), got {raw!r}")
        unknown = sorted(set(raw) - set(_LORA_KEYS))
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {unknown[0]!r}; known: {', '.join(_LORA_KEYS)}"
            )
        targets = raw.get("target_modules", cls().target_modules)
        if isinstance(targets, str) or not all(isinstance(t, str) for t in targets):
            raise ConfigError(
                f"{where}.target_modules: expected a list of layer names, e.g. [q_proj, v_proj],"
                f" got {targets!r}"
            )
        try:
            opts = cls(
                r=_integer(raw.get("r", cls.r)),
                alpha=_integer(raw.get("alpha", cls.alpha)),
                dropout=float(raw.get("dropout", cls.dropout)),
                target_modules=tuple(targets),
            )
        except (TypeError, ValueError):
            raise ConfigError(
                f"{where}: r and alpha must be whole numbers and dropout a number, got {raw!r}"
            ) from None
        if opts.r < 1 or opts.alpha <= 0 or not 0 <= opts.dropout < 1 or not opts.target_modules:
            raise ConfigError(
                f"{where}: need r >= 1, alpha > 0, 0 <= dropout < 1 and at least one target "
                f"module, got {raw!r}"
            )
        return opts


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not float(value).is_integer():
        raise ValueError(value)
    return int(value)


@dataclass(frozen=True)
class Trainable:
    """What trains: `mode` full | lora (with `lora`) | top_layers (the last `top_layers`)."""

    mode: TrainableMode = "full"
    lora: LoraOptions = field(default_factory=LoraOptions)  # mode lora only
    top_layers: int = 1  # mode top_layers only

    def __post_init__(self) -> None:
        if self.mode not in get_args(TrainableMode):
            raise ConfigError(
                f"train.trainable: {self.mode!r} is not one of "
                f"{' | '.join(get_args(TrainableMode))}"
            )
        if self.top_layers < 1:
            raise ConfigError(f"train.top_layers: {self.top_layers} must be >= 1")

    @classmethod
    def from_config(cls, cfg: Config) -> Trainable:
        """`train.trainable` with `train.lora` / `train.top_layers`, or the older spelling
        `train.deepspeed_config.lora` (the same as trainable: lora with those options)."""
        t = cfg.train
        alias = t.deepspeed_config.get("lora")
        if alias:
            if t.trainable != "full" or t.lora:
                raise ConfigError(
                    "train.deepspeed_config.lora is the older spelling of train.trainable: lora"
                    f" with train.lora; keep one of them (got train.trainable: {t.trainable!r},"
                    f" train.lora: {t.lora!r})"
                )
            return cls("lora", lora=LoraOptions.from_mapping(alias, "train.deepspeed_config.lora"))
        if t.lora and t.trainable != "lora":
            raise ConfigError(
                f"train.lora: {t.lora!r} does nothing with train.trainable: {t.trainable!r};"
                " set train.trainable: lora, or remove train.lora"
            )
        if t.top_layers is not None and t.trainable != "top_layers":
            raise ConfigError(
                f"train.top_layers: {t.top_layers!r} does nothing with train.trainable:"
                f" {t.trainable!r}; set train.trainable: top_layers, or remove train.top_layers"
            )
        if t.trainable == "lora":
            return cls("lora", lora=LoraOptions.from_mapping(t.lora, "train.lora"))
        if t.trainable == "top_layers":
            if t.top_layers is None:
                raise ConfigError(
                    "train.top_layers: null, but train.trainable: top_layers needs the number of"
                    " last decoder layers to train, e.g. train.top_layers: 4"
                )
            return cls("top_layers", top_layers=t.top_layers)
        return cls()

    def describe(self) -> dict[str, Any]:
        """Plain values (saved beside the optimizer state, compared on resume)."""
        if self.mode == "lora":
            o = self.lora
            return {
                "mode": "lora",
                "r": o.r,
                "alpha": o.alpha,
                "dropout": o.dropout,
                "target_modules": sorted(o.target_modules),
            }
        if self.mode == "top_layers":
            return {"mode": "top_layers", "top_layers": self.top_layers}
        return {"mode": "full"}


# --- applying a mode --------------------------------------------------------------------------
def apply_trainable(model: Any, spec: Trainable) -> None:
    """Set which parameters of `model` require a gradient (adding or merging LoRA adapters)."""
    _APPLY[spec.mode](model, spec)


def _train_all(model: Any, spec: Trainable) -> None:
    unload_lora(model)
    for p in model.parameters():
        p.requires_grad_(True)


def _train_lora(model: Any, spec: Trainable) -> None:
    current = _lora_options_of(model)
    if current is not None and current != _normalized(spec.lora):
        log.info("merging the model's LoRA adapters (%s) before adding %s", current, spec.lora)
        unload_lora(model)
        current = None
    if current is None:
        _inject_lora(model, spec.lora)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)


def _train_top_layers(model: Any, spec: Trainable) -> None:
    unload_lora(model)
    decoder = model.get_decoder()
    layers, norm = getattr(decoder, "layers", None), getattr(decoder, "norm", None)
    if layers is None or norm is None:
        raise ConfigError(
            f"train.trainable: top_layers needs a decoder with a `layers` list and a final"
            f" `norm` (llama / qwen style); {type(decoder).__name__} has not. Use train.trainable:"
            " lora or full"
        )
    if spec.top_layers > len(layers):
        raise ConfigError(
            f"train.top_layers: {spec.top_layers} exceeds the model's {len(layers)} decoder"
            f" layers; use at most {len(layers)}, or train.trainable: full"
        )
    for p in model.parameters():
        p.requires_grad_(False)
    for module in [*layers[len(layers) - spec.top_layers :], norm]:
        for p in module.parameters():
            p.requires_grad_(True)


# train.trainable -> how it is applied (each leaves requires_grad set on what trains only).
_APPLY: dict[str, Callable[[Any, Trainable], None]] = {
    "full": _train_all,
    "lora": _train_lora,
    "top_layers": _train_top_layers,
}


# --- LoRA adapters in the model ---------------------------------------------------------------
def lora_layers(model: Any) -> list[tuple[str, Any]]:
    """(module name, peft LoRA layer) of every adapted layer of `model`; [] without peft."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return []
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]


def lora_scaling(model: Any) -> float | None:
    """The adapters' s = alpha / r (one value: one config added them); None without adapters."""
    values = {float(m.scaling[_ADAPTER]) for _, m in lora_layers(model)}
    if len(values) > 1:
        raise RuntimeError(f"LoRA layers with different scalings {sorted(values)}: not ours")
    return values.pop() if values else None


def _lora_options_of(model: Any) -> LoraOptions | None:
    config = getattr(model, "peft_config", {}).get(_ADAPTER)
    if config is None or not lora_layers(model):
        return None
    return LoraOptions(
        r=int(config.r),
        alpha=int(config.lora_alpha),
        dropout=float(config.lora_dropout),
        target_modules=tuple(sorted(config.target_modules)),  # peft keeps a set
    )


def _normalized(opts: LoraOptions) -> LoraOptions:
    """`opts` with its target names sorted, as `_lora_options_of` reads them back."""
    return LoraOptions(opts.r, opts.alpha, opts.dropout, tuple(sorted(opts.target_modules)))


def _inject_lora(model: Any, opts: LoraOptions) -> None:
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        raise ConfigError(
            "train.trainable: lora needs the peft package: pip install 'envace[deepspeed]'"
            " (or pip install peft)"
        ) from None

    config = LoraConfig(
        r=opts.r,
        lora_alpha=opts.alpha,
        lora_dropout=opts.dropout,
        target_modules=list(opts.target_modules),
    )
    try:
        with warnings.catch_warnings():
            # peft reads transformers' deprecated `is_gradient_checkpointing`; not ours to fix.
            warnings.filterwarnings(
                "ignore", message=".*is_gradient_checkpointing", category=FutureWarning
            )
            inject_adapter_in_model(config, model, adapter_name=_ADAPTER)
    except ValueError as exc:
        if "not found in the base model" not in str(exc):
            raise
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if _is_linear(m)})
        raise ConfigError(
            f"train.lora.target_modules: {list(opts.target_modules)} match no layer of"
            f" {type(model).__name__}; its linear layers are named {linear}"
        ) from None


def _is_linear(module: Any) -> bool:
    import torch

    return isinstance(module, torch.nn.Linear)


def unload_lora(model: Any) -> None:
    """Merge every adapter into its layer's weight (W += s B A) and put the plain layer back."""
    layers = lora_layers(model)
    if not layers:
        return
    import torch

    with torch.no_grad():
        for name, layer in layers:
            layer.merge(adapter_names=[_ADAPTER])
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, layer.get_base_layer())
    if hasattr(model, "peft_config"):
        del model.peft_config
    log.info("merged %d LoRA adapters into the model's weights", len(layers))


# --- weights out and back in ------------------------------------------------------------------
def merge_lora_state_dict(
    state: Mapping[str, torch.Tensor], scaling: float, adapter: str = _ADAPTER
) -> dict[str, torch.Tensor]:
    """A LoRA model's state dict as the plain model's: W + scaling * B @ A per adapted layer.

    Keys lose peft's `base_model.model.` prefix (a `PeftModel`) and `.base_layer` infix; adapter
    keys go away. Computed in float32, stored in each weight's dtype.
    """
    prefix = "base_model.model."
    sd = {k.removeprefix(prefix): v for k, v in state.items()}
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if ".lora_" in key:
            continue
        if key.endswith(".base_layer.weight"):
            stem = key.removesuffix(".base_layer.weight")
            a = sd[f"{stem}.lora_A.{adapter}.weight"].float()  # (r, in)
            b = sd[f"{stem}.lora_B.{adapter}.weight"].float()  # (out, r)
            out[f"{stem}.weight"] = (value.float() + scaling * (b @ a)).to(value.dtype)
        else:
            out[key.replace(".base_layer.", ".")] = value
    return out


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """`model`'s weights under the plain model's names, any LoRA adapters merged in."""
    sd = model.state_dict()
    scaling = lora_scaling(model)
    return dict(sd) if scaling is None else merge_lora_state_dict(sd, scaling)


def save_hf_checkpoint(model: Any, out_dir: Any, tokenizer: Any) -> None:
    """A plain Hugging Face checkpoint (safetensors, config, tokenizer), LoRA merged in: what
    `AutoModelForCausalLM.from_pretrained` reads without peft."""
    out_dir.mkdir(parents=True, exist_ok=True)
    state = merged_state_dict(model) if lora_layers(model) else None
    model.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """Copies of the adapter tensors (A, B of every layer) by parameter name; {} without."""
    return {
        name: p.detach().to("cpu", copy=True)
        for name, p in model.named_parameters()
        if ".lora_" in name
    }


def restore_adapters(model: Any, saved: Mapping[str, torch.Tensor]) -> None:
    """Put saved adapters back without changing what the model computes: per layer, the
    current W + s B A is kept and W becomes (W + s B A) - s B' A' with the saved A', B'. On a
    model loaded from a merged checkpoint (fresh adapters, B = 0) this recovers the base
    weights the adapters were trained on (to float rounding in the weights' dtype)."""
    import torch

    params = dict(model.named_parameters())
    current = {n for n in params if ".lora_" in n}
    if set(saved) != current:
        missing = sorted(set(saved) ^ current)
        raise UserInputError(
            f"the trainer state's LoRA adapters do not match this model's ({len(saved)} saved,"
            f" {len(current)} here; first difference: {missing[0]}); resume with the"
            " train.trainable and train.lora the run was started with"
        )
    with torch.no_grad():
        for name, layer in lora_layers(model):
            s = float(layer.scaling[_ADAPTER])
            a = layer.lora_A[_ADAPTER].weight  # (r, in)
            b = layer.lora_B[_ADAPTER].weight  # (out, r)
            a_new = saved[f"{name}.lora_A.{_ADAPTER}.weight"].to(a.device, torch.float32)
            b_new = saved[f"{name}.lora_B.{_ADAPTER}.weight"].to(b.device, torch.float32)
            w = layer.get_base_layer().weight  # (out, in)
            effective = w.float() + s * (b.float() @ a.float())
            w.copy_((effective - s * (b_new @ a_new)).to(w.dtype))
            a.copy_(a_new.to(a.dtype))
            b.copy_(b_new.to(b.dtype))
