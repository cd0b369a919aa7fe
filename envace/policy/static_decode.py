"""Decoding with a static KV cache and, on CUDA, the one-token step replayed as a CUDA graph.

`model.generate` pays Python and kernel-launch overhead on every step (tens of milliseconds for
a 28-layer model, whatever the batch), so small-batch rollouts are bound by the host, not the GPU
(MEASUREMENTS.md). Here the cache is a transformers `StaticCache` of a fixed (batch, length)
shape, so the decode step reads and writes the same tensors every time; on CUDA it is captured
once per shape and replayed: one launch per step.

One call: plan (which prompt prefixes are already in a kept cache: `plan`, prefix_cache.py)
-> prefill (eager: held prefixes copied into columns [0, C), the rest computed in [C, C + S),
each right-aligned) -> steps. Each step feeds the token sampled at the previous one; the input
buffers (token, position, attention mask) are updated in place before the replay. Positions
count real tokens only, so the holes between a row's copied and computed parts change nothing. The attention mask is ours, 4-D, so transformers passes it
through untouched: a key is visible if it is a real prompt token or an already generated one
(later cache slots hold stale values from earlier calls and stay masked). The attention itself is
ours too during these calls (`_decode_attention`): grouped-query attention that reads each
key/value head once (transformers' SDPA path copies them per query head when there is a mask).

Measured on the H200 (docs/benchmarks.md, 2026-11-30) before `_decode_attention`: the graph
removes the host overhead, but SDPA's masked path made the step cost grow with batch x context
(21.5 ms at 64 x 768, 63 ms at 256 x 640). The grouped products have not run on a GPU yet;
`attention="sdpa"` keeps the first version's step for the benchmark's comparison, and
`run_steps` runs bare steps for its step profile (bench/gpu.py --profile).

Shapes are bucketed on CUDA (batch to a multiple of 8 / 32, cache length to a multiple of 128;
extra rows are copies of the first prompt, marked done and dropped) so a rollout loop with
changing batch sizes and contexts reuses a few graphs. The newest `max_slots` shapes are kept;
a graph is re-captured when the model's parameters move (their addresses are part of the key).

Sampling (temperature, top-k, top-p, then a multinomial draw; argmax when greedy) runs after the
graph, as `model.generate` does with our warpers, and draws from the same generator in the same
order, so a seeded call samples what `generate` would from the same logits. Log-probabilities
are those of the warped distribution at the sampled token (as `_LogprobRecorder`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from envace.policy.prefix_cache import BLOCK, PrefixIndex, RowKV
from envace.policy.types import SamplingParams

__all__ = ["Plan", "StaticDecoder", "static_decode_supported"]

log = logging.getLogger(__name__)

# steps between host checks for "every row has ended": on CUDA each check is a sync that stalls
# the queue of replays; on the CPU it costs nothing and ends the call at the same step as
# `model.generate` (so a seeded generator has drawn the same samples after the call)
CHECK_EVERY = 8
# a prompt follows an earlier one of its call only if at most this many of its tokens remain to
# compute: every row of the final prefill pays for the longest remainder (padding)
FOLLOW_SUFFIX = 64


def _text_config(cfg: Any) -> Any:
    """The decoder's config (the config itself for a plain causal LM)."""
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


def static_decode_supported(model: Any) -> str | None:
    """None when `model` can decode with `StaticDecoder` (a transformers causal LM whose layers
    all use full attention: Qwen3, Qwen2, Llama), else why not (one line)."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return "the model has no Hugging Face config"
    kinds = set(getattr(_text_config(cfg), "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        return f"layer types {sorted(kinds)} (static decoding supports full attention only)"
    return None


def _decode_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """Attention for our calls (registered with transformers as `envace_static`), whatever the
    model's own implementation; `attention_mask` is our boolean mask.

    One query token (the decode step): grouped-query attention as two batched products over the
    cache as it is: each key/value head is read once for its group of query heads, in the
    model's dtype, scores softmaxed in float32 (as transformers' eager attention). With a mask,
    transformers' SDPA path cannot pass grouped-query heads to SDPA on CUDA and copies each
    key/value head once per query head every step (docs/benchmarks.md, 2026-11-30).
    Several query tokens (the prefill): transformers' SDPA attention with the mask."""
    b, h, q, d = query.shape
    if q > 1:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
        return sdpa(  # type: ignore[no-any-return]
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    kv_heads, length = key.shape[1], key.shape[2]
    group = h // kv_heads
    scale = scaling if scaling is not None else d**-0.5
    qg = query.reshape(b, kv_heads, group, d)
    scores = torch.matmul(qg, key.transpose(-1, -2)).float() * scale  # (B, KV, G, L)
    scores = scores.masked_fill(~attention_mask.view(b, 1, 1, length), float("-inf"))
    probs = scores.softmax(-1).to(value.dtype)
    out = torch.matmul(probs, value)  # (B, KV, G, D): query head kv * G + g, as repeat_kv
    return out.reshape(b, 1, h, d), None


ATTENTION = "envace_static"


@contextlib.contextmanager
def _attention(config: Any, name: str) -> Iterator[None]:
    """Route the model's attention through `name` for the duration (the trainer shares the
    model, so the implementation is put back)."""
    before = config._attn_implementation_internal
    config._attn_implementation_internal = name
    try:
        yield
    finally:
        config._attn_implementation_internal = before


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass
class _Slot:
    """One (batch, cache length) shape: its cache, input buffers and (CUDA) graph."""

    cache: Any  # transformers StaticCache
    tok: torch.Tensor  # (B, 1) the token fed at this step
    pos: torch.Tensor  # (B, 1) its position id
    mask: torch.Tensor  # (B, 1, 1, L) which cache slots the step may attend to
    graph: Any = None  # torch.cuda.CUDAGraph once captured
    logits: torch.Tensor | None = None  # the graph's output
    held: PrefixIndex | None = None  # the sequences whose keys/values the cache holds
    weights: tuple[int, torch.Tensor] | None = None  # `_weights()` when `held` was computed


def _rewind(cache: Any, length: int) -> None:
    """Point every cache layer's write position at `length` (transformers' StaticLayer keeps it
    in `cumulative_length`, a device tensor; a layout without it fails here, loudly, rather
    than decoding from the wrong positions)."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", True):  # not yet allocated: nothing to rewind
            layer.cumulative_length.fill_(length)


def _allocate(layer: Any, like: torch.Tensor, batch: int) -> None:
    """Allocate a cache layer before its first write (transformers allocates at the first
    update; a gathered prefix comes first), shaped as `like` (B', H, L', D) for `batch` rows."""
    if getattr(layer, "is_initialized", True):
        return
    shape = (batch, like.shape[1], 1, like.shape[3])
    states = torch.empty(shape, dtype=like.dtype, device=like.device)
    if len(inspect.signature(layer.lazy_initialization).parameters) >= 2:
        layer.lazy_initialization(states, states)
    else:  # transformers before the value-states argument
        layer.lazy_initialization(states)


@dataclass
class _Source:
    """A prefix of a prompt held in a cache: its first `count` tokens are row `row` of `cache`."""

    cache: Any
    row: int
    kv: RowKV
    count: int


@dataclass
class Plan:
    """How one call's prompts get their keys and values (see `StaticDecoder.plan`)."""

    prompts: list[list[int]]
    sources: list[_Source | None]  # what each prompt finds in earlier calls' caches
    leaders: list[int]  # prompts prefilled first, in a scratch cache (empty: no scratch)
    follow: dict[int, tuple[int, int]]  # prompt -> (leader number, tokens shared with it)
    width: int  # columns of the final prefill's layout (held prefixes + computed suffixes)
    weights: tuple[int, torch.Tensor] | None = None  # `_weights()` when planned (prefix cache on)


def _count(source: _Source | None) -> int:
    return source.count if source is not None else 0


def _clip(source: _Source | None, limit: int) -> _Source | None:
    """`source` holding at most `limit` tokens."""
    if source is None or source.count <= limit:
        return source
    return _Source(source.cache, source.row, source.kv, limit) if limit > 0 else None


def _worth(prompts: list[list[int]], sources: list[_Source | None]) -> list[_Source | None]:
    """The held prefixes worth copying. Copied prefixes sit left of the computed columns, so a
    call mixing long held prefixes with long remainders would widen every row (cache memory
    and attention reads) and save nothing: keep the prefixes of at least `t` tokens for the
    `t` that computes the fewest columns (rows x longest remainder) while the layout stays
    within `FOLLOW_SUFFIX` columns of the longest prompt."""
    longest = max(len(p) for p in prompts)
    best, best_todo = 0, longest  # t = inf: nothing held, the longest prompt computed
    for t in sorted({_count(s) for s in sources} - {0}):
        counts = [c if (c := _count(s)) >= t else 0 for s in sources]
        held, todo = _layout(prompts, counts)
        if held + todo <= longest + FOLLOW_SUFFIX and todo < best_todo:
            best, best_todo = t, todo
    return [s if best and _count(s) >= best else None for s in sources]


def _layout(prompts: list[list[int]], counts: list[int]) -> tuple[int, int]:
    """(C, S): prefixes held are right-aligned in columns [0, C), the tokens to compute in
    [C, C + S)."""
    return max(counts), max(len(p) - c for p, c in zip(prompts, counts, strict=True))


class StaticDecoder:
    """Batched sampling over a static KV cache (CUDA graphs on CUDA); see the module doc.

    prefix_cache: reuse keys/values of prompt prefixes computed before (in this call: the n
    rollouts of a task; in earlier calls while their caches are kept: the conversation so far).
    max_slots: shapes kept (None: 2 on CUDA, where each is large, 4 elsewhere, enough for a
    caller call's cache to survive the rehearsal calls before the next one).
    attention: the decode step's attention: `grouped` (`_decode_attention`) or `sdpa`
    (transformers' SDPA path with our mask, the first version's; kept for the benchmark's
    comparison: bench/gpu.py's `static-sdpa` decoder).
    compile_step: run the one-token step through `torch.compile` (dynamic shapes: one compile
    serves every bucket; on CUDA the compiled step is what the graph captures). It fuses the
    step's many small elementwise kernels (norms, rotary, casts); the first call pays the
    compile (~20 s for tiny-4m on 2 CPU cores). The prefill stays eager.
    """

    def __init__(
        self,
        model: Any,
        eos_id: int,
        pad_id: int,
        use_graphs: bool | None = None,
        max_slots: int | None = None,
        bucket: bool | None = None,
        max_cache_bytes: int | None = None,
        prefix_cache: bool = True,
        attention: str = "grouped",
        compile_step: bool = False,
    ) -> None:
        why = static_decode_supported(model)
        if why is not None:
            raise ValueError(f"static decoding is not available for this model: {why}")
        self.model = model
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.use_graphs = model.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and model.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.bucket = self.use_graphs if bucket is None else bucket
        self.max_cache_bytes = max_cache_bytes
        self.max_slots = max_slots or (2 if model.device.type == "cuda" else 4)
        self.prefix_cache = prefix_cache
        if attention not in ("grouped", "sdpa"):
            raise ValueError(f"attention {attention!r}: use grouped or sdpa")
        self._attention_name = ATTENTION if attention == "grouped" else "sdpa"
        self._check_every = 1 if model.device.type == "cpu" else CHECK_EVERY
        self._compiled = torch.compile(self._model_step, dynamic=True) if compile_step else None
        # the cache keyword: `cache` (transformers >= 5.2x), `past_key_values` before
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(base.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._text_config = _text_config(model.config)
        from transformers import AttentionInterface

        AttentionInterface.register(ATTENTION, _decode_attention)
        self._slots: OrderedDict[tuple[Any, ...], _Slot] = OrderedDict()
        self.captures = 0  # graphs captured so far (a metric for the benchmark and tests)
        # prompt tokens seen, and those whose keys/values were computed (the rest were reused)
        self.counts: dict[str, int] = {"prompt_tokens": 0, "computed_tokens": 0}
        # profile: synchronise at phase boundaries and add their wall times to `timings`
        # (prefill, capture, decode steps incl. sampling); off in normal runs (no extra syncs)
        self.profile = False
        self.timings: dict[str, float] = {"prefill_s": 0.0, "capture_s": 0.0, "steps_s": 0.0}

    # --- shapes ----------------------------------------------------------------------------
    def _shape(self, batch: int, length: int) -> tuple[int, int]:
        if not self.bucket:  # eager: no graph to reuse, so no padding to pay
            return batch, length
        b = _round_up(batch, 8) if batch <= 64 else _round_up(batch, 32)
        return b, _round_up(length, 128)

    def cache_bytes(self, batch: int, length: int) -> int:
        """Bytes of the static cache (keys and values of every layer) for this call's shape."""
        b, n = self._shape(batch, length)
        cfg = self._text_config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim
        return b * n * per_token * self.model.dtype.itemsize  # type: ignore[no-any-return]

    def budget(self) -> int | None:
        """Bytes a cache may take: `max_cache_bytes`, else on CUDA 80 % of what is free once our
        own slots are dropped (free memory + the allocator's unused reserve + our caches); None
        (no limit) on the CPU."""
        if self.max_cache_bytes is not None:
            return self.max_cache_bytes
        if self.model.device.type != "cuda":
            return None
        free, _total = torch.cuda.mem_get_info(self.model.device)
        unused = torch.cuda.memory_reserved(self.model.device) - torch.cuda.memory_allocated(
            self.model.device
        )
        ours = sum(
            layer.keys.nbytes + layer.values.nbytes
            for slot in self._slots.values()
            for layer in slot.cache.layers
            if getattr(layer, "is_initialized", False)
        )
        return int(0.8 * (free + unused + ours))

    def fits(self, batch: int, length: int) -> bool:
        budget = self.budget()
        return budget is None or self.cache_bytes(batch, length) <= budget

    def release(self) -> None:
        """Drop every cache and graph (the trainer calls this after its rollouts, so the update
        has the memory; the next call re-creates what it needs)."""
        self._slots.clear()

    def _weights(self) -> tuple[int, torch.Tensor]:
        """Fingerprint of the weights: their addresses and in-place update counters, and 8 values
        of each (`p.data.copy_`, as DeepSpeed writes its updated weights back, leaves the
        counters alone). Held prefixes are reused only under the weights that computed them."""
        params = list(self.model.parameters())
        flat = [p.detach().reshape(-1) for p in params if p.numel()]
        probe = torch.cat([f[:: max(1, f.numel() // 8)].float() for f in flat] or [torch.zeros(0)])
        return hash(tuple((p.data_ptr(), p._version) for p in params)), probe

    def _same_weights(self, slot: _Slot, now: tuple[int, torch.Tensor]) -> bool:
        return (
            slot.weights is not None
            and slot.weights[0] == now[0]
            and torch.equal(slot.weights[1], now[1])
        )

    def _slot(self, batch: int, length: int, keep: set[int]) -> _Slot:
        """The slot for this shape (most recently used last). Making room drops the least
        recently used slots, except those whose caches are in `keep` (ids of the caches this
        call copies prefixes from: `_trim` drops them after the prefill)."""
        weights = tuple(p.data_ptr() for p in self.model.parameters())
        key = (batch, length, self.model.dtype, hash(weights))
        slot = self._slots.get(key)
        if slot is not None:
            self._slots.move_to_end(key)
            return slot
        for old in [k for k, s in self._slots.items() if id(s.cache) not in keep]:
            if len(self._slots) < self.max_slots:
                break
            del self._slots[old]
        from transformers import StaticCache

        device = self.model.device
        slot = _Slot(
            cache=StaticCache(config=self.model.config, max_cache_len=length),
            tok=torch.zeros((batch, 1), dtype=torch.long, device=device),
            pos=torch.zeros((batch, 1), dtype=torch.long, device=device),
            mask=torch.zeros((batch, 1, 1, length), dtype=torch.bool, device=device),
        )
        self._slots[key] = slot
        log.debug("static decode slot %s x %s (graphs: %s)", batch, length, self.use_graphs)
        return slot

    def _trim(self) -> None:
        while len(self._slots) > self.max_slots:
            self._slots.popitem(last=False)

    # --- prefixes --------------------------------------------------------------------------
    def plan(self, prompts: Sequence[Sequence[int]]) -> Plan:
        """Where each prompt's keys and values come from.

        Each prompt first looks for its longest prefix held by a kept cache (computed with the
        current weights). Then, within the call, a prompt that shares at least a block more
        with an earlier prompt (a "leader") and leaves at most `FOLLOW_SUFFIX` tokens to compute
        follows it: the leaders are prefilled first (all but their last token, in a scratch
        cache), and every prompt then copies its prefix from its leader (itself, for a leader)
        and computes only the rest. Without any follower there is no scratch round."""
        lists = [list(p) for p in prompts]
        sources: list[_Source | None] = [None] * len(lists)
        leaders: list[int] = []
        follow: dict[int, tuple[int, int]] = {}
        now = self._weights() if self.prefix_cache else None
        if now is not None:
            held = [
                (slot.cache, slot.held)
                for slot in self._slots.values()
                if slot.held is not None and self._same_weights(slot, now)
            ]
            for i, p in enumerate(lists):
                for cache, kept in held:
                    row, count = kept.match(p, len(p) - 1)
                    if count > _count(sources[i]):
                        sources[i] = _Source(cache, row, kept.rows[row], count)
            index = PrefixIndex()
            for i, p in enumerate(lists):
                number, count = index.match(p, len(p) - 1)
                gain = count - _count(sources[i])
                if number >= 0 and gain >= BLOCK and len(p) - count <= FOLLOW_SUFFIX:
                    follow[i] = (number, count)
                elif len(p) > 1:
                    index.add(RowKV(p[:-1]))
                    leaders.append(i)
            if not follow:  # no scratch round: the held prefixes worth their columns
                leaders, sources = [], _worth(lists, sources)
        lead = set(leaders)
        counts = [
            len(p) - 1 if i in lead else follow[i][1] if i in follow else _count(sources[i])
            for i, p in enumerate(lists)
        ]
        return Plan(lists, sources, leaders, follow, sum(_layout(lists, counts)), now)

    def _gather(self, cache: Any, batch: int, sources: list[_Source | None], start: int) -> None:
        """Copy each row's held prefix into columns [start - count, start) of `cache`."""
        groups: dict[int, list[tuple[int, _Source]]] = {}
        for b, src in enumerate(sources):
            if src is not None and src.count > 0:
                groups.setdefault(id(src.cache), []).append((b, src))
        # a cache that is also the target is read first, before any row of it is overwritten
        for group in sorted(groups.values(), key=lambda g: g[0][1].cache is not cache):
            source = group[0][1].cache
            device = self.model.device
            dst_rows = torch.cat([torch.full((s.count,), b) for b, s in group]).to(device)
            dst_cols = torch.cat([torch.arange(start - s.count, start) for _, s in group])
            src_rows = torch.cat([torch.full((s.count,), s.row) for _, s in group]).to(device)
            src_cols = torch.cat([s.kv.slots(s.count) for _, s in group]).to(device)
            dst_cols = dst_cols.to(device)
            for dst, src_layer in zip(cache.layers, source.layers, strict=True):
                _allocate(dst, src_layer.keys, batch)
                dst.keys[dst_rows, :, dst_cols] = src_layer.keys[src_rows, :, src_cols]
                dst.values[dst_rows, :, dst_cols] = src_layer.values[src_rows, :, src_cols]

    def _prefill(
        self, cache: Any, prompts: list[list[int]], sources: list[_Source | None]
    ) -> tuple[torch.Tensor, torch.Tensor, list[RowKV]]:
        """Fill `cache` with the prompts' keys/values: held prefixes copied (right-aligned in
        [0, C)), the rest computed (right-aligned in [C, C + S)). Returns the logits after each
        prompt (B, V), which columns are real (B, C + S) and each row's layout."""
        batch = len(prompts)
        counts = [_count(s) for s in sources]
        held, todo = _layout(prompts, counts)
        width = held + todo
        device = self.model.device
        self._gather(cache, batch, sources, held)
        ids = torch.full((batch, todo), self.pad_id, dtype=torch.long)
        real = torch.zeros((batch, width), dtype=torch.bool)
        rows: list[RowKV] = []
        for b, (p, c) in enumerate(zip(prompts, counts, strict=True)):
            rest = len(p) - c
            ids[b, todo - rest :] = torch.tensor(p[c:], dtype=torch.long)
            real[b, held - c : held] = True
            real[b, width - rest :] = True
            rows.append(RowKV(p, [(held - c, c), (width - rest, rest)]))
        ids, real = ids.to(device), real.to(device)
        # causal over the layout's columns, holes and padding hidden; a pad query sees itself
        length = cache.layers[0].max_cache_len
        keys = torch.arange(length, device=device)
        queries = torch.arange(held, width, device=device)
        visible = torch.zeros((batch, length), dtype=torch.bool, device=device)
        visible[:, :width] = real
        allowed = ((keys[None, :] <= queries[:, None])[None] & visible[:, None, :]) | (
            keys[None, :] == queries[:, None]
        )[None]
        positions = (real.long().cumsum(-1) - 1).clamp_min(0)
        _rewind(cache, held)
        logits = self._forward(cache, ids, positions[:, held:], allowed[:, None])
        return logits, real, rows

    # --- model calls -----------------------------------------------------------------------
    def _model_step(
        self, cache: Any, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        return out.logits[:, -1]  # type: ignore[no-any-return]

    def _forward(
        self,
        cache: Any,
        ids: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor,
        step: bool = False,
    ) -> Any:
        """The model over `ids` with our attention; the compiled step for a `step` with
        `compile_step` (whatever stance the caller set for layers compiled for training)."""
        compiled = self._compiled if step else None
        with (
            _attention(self._text_config, self._attention_name),
            torch.compiler.set_stance("default") if compiled else contextlib.nullcontext(),
        ):
            return (compiled or self._model_step)(cache, ids, pos, mask)

    def _feed(self, slot: _Slot) -> Any:
        """The one-token step over the slot's own buffers (run eagerly or captured)."""
        return self._forward(slot.cache, slot.tok, slot.pos, slot.mask, step=True)

    def _step(self, slot: _Slot) -> torch.Tensor:
        """Logits (B, V) after feeding `slot.tok` (replayed when captured)."""
        if slot.graph is not None:
            slot.graph.replay()
            assert slot.logits is not None
            return slot.logits
        return self._feed(slot)  # type: ignore[no-any-return]

    def _now(self) -> float:
        """The time, after a device sync when profiling (so phases are not blurred)."""
        if self.profile and self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)
        return time.perf_counter()

    def _lap(self, phase: str, since: float) -> float:
        """With `profile` on: add the time since `since` to `phase`."""
        now = self._now()
        if self.profile:
            self.timings[phase] += now - since
        return now

    def _capture(self, slot: _Slot, prompt_len: int) -> None:
        """Capture the one-token step (after two warm-up runs on a side stream, which write
        cache slots the real steps overwrite), then rewind the cache to the prompt."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._feed(slot)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            slot.logits = self._feed(slot)
        slot.graph = graph
        _rewind(slot.cache, prompt_len)
        self.captures += 1

    def run_steps(self, steps: int, graph: bool = True) -> tuple[int, int]:
        """Run `steps` one-token steps over the newest slot's buffers as a call runs them (the
        captured graph replayed where there is one; `graph=False`: the step called from Python,
        eager or compiled), no sampling: for benchmarks and profilers (a step costs the same
        whatever the tokens). The cache's contents are overwritten, so what it held is
        forgotten. Returns the slot's (batch, cache length)."""
        if not self._slots:
            raise RuntimeError("run_steps: no cache yet; generate once first")
        slot = next(reversed(self._slots.values()))
        batch, length = slot.mask.shape[0], slot.mask.shape[-1]
        if not 0 < steps < length:
            raise ValueError(f"run_steps: steps must be in [1, {length - 1}], got {steps}")
        slot.held = None
        with torch.inference_mode():
            _rewind(slot.cache, length - steps)  # every write lands inside the cache
            for _ in range(steps):
                if graph:
                    self._step(slot)
                else:
                    self._feed(slot)
        return batch, length

    # --- decoding --------------------------------------------------------------------------
    def generate(
        self,
        plan: Plan,
        params: SamplingParams,
        warp: Callable[[torch.Tensor], torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample up to `params.max_new_tokens` after each of `plan.prompts` (see `plan`).
        Returns the new ids (B, T) (pad after a row's end of turn) and their
        log-probabilities (B, T) under `warp(float logits)`."""
        prompts = plan.prompts
        batch, new = len(prompts), params.max_new_tokens
        device = self.model.device
        b_slot, l_slot = self._shape(batch, plan.width + new)
        lap = self._now()
        sources, computed = self._scratch_round(plan)
        slot = self._slot(b_slot, l_slot, {id(s.cache) for s in sources if s is not None})
        slot.held = None  # overwritten from here on
        extra = b_slot - batch  # bucket rows: copies of row 0, ended from the start
        logits, real, rows = self._prefill(
            slot.cache, prompts + [prompts[0]] * extra, sources + [sources[0]] * extra
        )
        computed += sum(len(p) - _count(s) for p, s in zip(prompts, sources, strict=True))
        del sources  # the scratch cache and the sources' slots can go
        self._trim()
        self.counts["prompt_tokens"] += sum(len(p) for p in prompts)
        self.counts["computed_tokens"] += computed
        width = real.shape[1]
        slot.mask.zero_()
        slot.mask[:, 0, 0, :width] = real
        slot.pos.copy_(real.long().sum(-1, keepdim=True) - 1)
        lap = self._lap("prefill_s", lap)
        if self.use_graphs and slot.graph is None:
            self._capture(slot, width)
            lap = self._lap("capture_s", lap)

        greedy = params.temperature <= 0
        out_ids = torch.full((b_slot, new), self.pad_id, dtype=torch.long, device=device)
        out_logp = torch.zeros((b_slot, new), dtype=torch.float32, device=device)
        done = torch.zeros(b_slot, dtype=torch.bool, device=device)
        done[batch:] = True
        steps = 0
        for t in range(new):
            if t > 0:  # feed the token sampled at t - 1 into cache slot width + t - 1
                slot.tok.copy_(out_ids[:, t - 1 : t])
                slot.pos.add_(1)
                slot.mask[:, 0, 0, width + t - 1] = True
                logits = self._step(slot)
            scores = warp(logits.float())
            if greedy:
                nxt = scores.argmax(-1)
            else:
                nxt = torch.multinomial(scores.softmax(-1), num_samples=1).squeeze(1)
            logp = scores.log_softmax(-1).gather(-1, nxt[:, None]).squeeze(1)
            nxt = torch.where(done, torch.full_like(nxt, self.pad_id), nxt)
            out_ids[:, t] = nxt
            out_logp[:, t] = logp
            done |= nxt == self.eos_id
            steps = t + 1
            if steps % self._check_every == 0 and bool(done.all()):
                break
        self._lap("steps_s", lap)
        if plan.weights is not None:
            self._hold(slot, rows[:batch], out_ids[:batch, :steps], width, plan.weights)
        return out_ids[:batch, :steps], out_logp[:batch, :steps]

    def _scratch_round(self, plan: Plan) -> tuple[list[_Source | None], int]:
        """Prefill the leaders' prompts but their last token in a scratch cache (with what
        they hold from earlier calls); returns every prompt's source for the final prefill
        and the tokens computed here."""
        sources = list(plan.sources)
        if not plan.leaders:
            return sources, 0
        from transformers import StaticCache

        heads = [plan.prompts[i][:-1] for i in plan.leaders]
        clipped = _worth(
            heads, [_clip(sources[i], len(h) - 1) for i, h in zip(plan.leaders, heads, strict=True)]
        )
        length = sum(_layout(heads, [_count(s) for s in clipped]))
        scratch = StaticCache(config=self.model.config, max_cache_len=length)
        _, _, lead = self._prefill(scratch, heads, clipped)
        for n, i in enumerate(plan.leaders):
            sources[i] = _Source(scratch, n, lead[n], len(heads[n]))
        for i, (n, count) in plan.follow.items():
            sources[i] = _Source(scratch, n, lead[n], count)
        return sources, sum(len(h) - _count(s) for h, s in zip(heads, clipped, strict=True))

    def _hold(
        self,
        slot: _Slot,
        rows: list[RowKV],
        out_ids: torch.Tensor,
        width: int,
        weights: tuple[int, torch.Tensor],
    ) -> None:
        """Index what the slot's cache now holds for later calls (computed under `weights`):
        each prompt and the generated tokens fed back (all but the last sampled one; nothing
        after end of turn)."""
        steps = out_ids.shape[1]
        index = PrefixIndex()
        for row, ids in zip(rows, out_ids.cpu().tolist(), strict=True):
            if self.eos_id in ids:
                ids = ids[: ids.index(self.eos_id) + 1]
            fed = min(len(ids), steps - 1)
            index.add(RowKV(row.tokens + ids[:fed], [*row.segments, (width, fed)]))
        slot.held, slot.weights = index, weights
