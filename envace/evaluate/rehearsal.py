"""Test-time private rehearsal: before each committed turn, imagine it N times, condense, act.

During the single committed execution of a task, at the start of every user turn, the policy
rehearses that turn privately: imagined episodes start from the real conversation so far (real
tool results included) and play the current turn only, in rehearsal mode (the policy writes the
tool calls AND the tool results; no real tool runs, no grounding examples, no grader verdict).
Nothing the user has not said yet reaches any prompt. The attempts are condensed into short
rehearsal notes (expected tool behaviour, pitfalls, a plan) of at most `memory_tokens` tokens,
which go into the committed system prompt for that turn, in place of the previous turn's notes.

- parallel:N   — N independent imagined attempts per turn, condensed once.
- sequential:N — attempt k runs with the notes condensed from attempts < k in its system prompt;
  after each attempt the notes are revised (previous notes + the new attempt), N condensations.

Who writes the memory follows the policy: a model condenses with its own backend (greedy, capped at
`memory_tokens` new tokens), an HTTP chat policy through its client, and scripted policies
(oracle, random, empty) get a deterministic digest of their attempts, truncated to the budget.
Extra cost is counted as generated tokens (imagined attempts, both roles, plus every memory
write) and as generations; the notes' size as the tokens that entered the committed context
(header included). Policies without a tokenizer count 0 tokens. The oracle cannot rehearse: its
simulator role executes calls in a copy of the real world.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from envace.envs.base import is_error_result
from envace.errors import UserInputError
from envace.policy.chat import ChatRenderer
from envace.policy.parsing import strip_thinking
from envace.policy.types import GenerationBackend, SamplingParams
from envace.rollout.engine import Episode, RolloutConfig, RolloutEngine, TurnContext, TurnGrade
from envace.rollout.policies import ChatPolicy, ModelPolicy, Policy
from envace.rollout.types import EndReason, Trajectory
from envace.tasks.model import Task

__all__ = [
    "DEFAULT_MEMORY_PROMPT",
    "MAX_REHEARSAL_N",
    "NOTES_HEADER",
    "ChatMemoryWriter",
    "DigestMemoryWriter",
    "MemoryPrompt",
    "MemoryWriter",
    "ModelMemoryWriter",
    "RehearsalConfig",
    "RehearsalGain",
    "RehearsalOutcome",
    "TaskRehearsal",
    "TurnRehearsal",
    "WrittenMemory",
    "attempt_lines",
    "build_memory_prompt",
    "check_can_rehearse",
    "memory_writer_for",
    "parse_rehearsal",
    "rehearsal_gain",
    "with_memory",
]

RehearsalMode = Literal["parallel", "sequential"]

# Imagined attempts per task. Every attempt is a whole imagined episode per task, kept until it is
# condensed, so a typo such as parallel:99999999 was OOM-killed; the bound makes it a clear error.
MAX_REHEARSAL_N = 64

DEFAULT_MEMORY_PROMPT = """You privately rehearsed a tool-use task before doing it for real. \
In the rehearsal you played both the agent and the tools, so the tool results below are \
imagined, not real.
Write short rehearsal notes for the real attempt:
1. Tool behaviour: what the useful tools need and what they return.
2. Pitfalls: errors and wrong calls to avoid.
3. Plan: the tool calls to make, in order.
Plain text only, no tool calls, a few lines at most."""

_REVISE = "Revise the notes so far with what the new attempt showed; keep what still holds."

NOTES_HEADER = (
    "Rehearsal notes (from your private rehearsal of this task; its tool results were imagined):"
)


@dataclass(frozen=True)
class RehearsalConfig:
    """How a task is rehearsed before its committed execution.

    mode: parallel (independent attempts) or sequential (each attempt sees the notes so far).
    n: imagined attempts per task (>= 1).
    memory_tokens: the memory's budget in the policy's tokens (max new tokens of each memory
        write; scripted digests are cut to it).
    memory_prompt: the system prompt of the condensation request.
    temperature: sampling temperature of the imagined attempts (diversity); seeds derive from
        the evaluation seed, so a rerun imagines the same attempts.
    max_result_chars: each imagined tool result is cut to this many characters in the
        condensation prompt (the prompt is also fitted to the context budget).
    """

    mode: RehearsalMode = "parallel"
    n: int = 2
    memory_tokens: int = 96
    memory_prompt: str = DEFAULT_MEMORY_PROMPT
    temperature: float = 1.0
    max_result_chars: int = 160

    def __post_init__(self) -> None:
        if self.mode not in ("parallel", "sequential"):
            raise UserInputError(f"rehearsal mode {self.mode!r}: use parallel or sequential")
        if not 1 <= self.n <= MAX_REHEARSAL_N:
            raise UserInputError(
                f"rehearsal n={self.n}: use 1 to {MAX_REHEARSAL_N} imagined attempts per task"
            )
        if self.memory_tokens < 1:
            raise UserInputError(f"rehearsal memory_tokens={self.memory_tokens}: must be >= 1")
        if self.temperature < 0:
            raise UserInputError(f"rehearsal temperature={self.temperature}: must be >= 0")
        if not self.memory_prompt.strip():
            raise UserInputError("the rehearsal memory prompt is empty")


def parse_rehearsal(spec: str, **fields: Any) -> RehearsalConfig:
    """`parallel:4` | `sequential:2` (+ other `RehearsalConfig` fields) -> RehearsalConfig.

    N is ASCII digits only (`str.isdigit` also accepts `²`, which `int` refuses) and at most
    `MAX_REHEARSAL_N`: each attempt is a full imagined episode per task, held in memory.
    """
    mode, sep, count = spec.partition(":")
    if not sep or mode not in ("parallel", "sequential") or not re.fullmatch(r"[0-9]+", count):
        raise UserInputError(
            f"--rehearsal {spec!r}: expected parallel:N or sequential:N, e.g. parallel:4"
        )
    digits = count.lstrip("0") or "0"
    n = int(digits) if len(digits) <= 6 else MAX_REHEARSAL_N + 1  # no int() of a huge string
    if not 1 <= n <= MAX_REHEARSAL_N:
        raise UserInputError(
            f"--rehearsal {spec!r}: N must be 1 to {MAX_REHEARSAL_N} imagined attempts per task"
        )
    return RehearsalConfig(mode=mode, n=n, **fields)  # type: ignore[arg-type]


# --- the condensation prompt ---------------------------------------------------------------------
def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def attempt_lines(traj: Trajectory, max_result_chars: int) -> list[str]:
    """One imagined attempt as short lines: calls, imagined results, errors, how it ended."""
    lines = []
    multi = len(traj.task.turns) > 1
    for c in traj.calls:
        where = f"turn {c.turn + 1}: " if multi else ""
        flag = "ERROR " if is_error_result(c.result) else ""
        lines.append(
            f"- {where}{c.call.name}({_dump(c.call.arguments)}) -> "
            f"{flag}{_clip(_dump(c.result), max_result_chars)}"
        )
    answers = [
        m["content"]
        for m in traj.messages
        if m.get("role") == "assistant" and not m.get("tool_calls") and m.get("content")
    ]
    if answers:
        # after a caller format error the last assistant text is the malformed output itself
        malformed = traj.end_reason is EndReason.CALLER_FORMAT_ERROR
        label = "malformed output" if malformed else "answer"
        lines.append(f"- {label}: {_clip(str(answers[-1]), max_result_chars)}")
    if traj.end_reason not in (None, EndReason.COMPLETED):
        lines.append(f"- ended: {traj.end_reason}")
    if not traj.calls and not answers:
        lines.append("- no tool call and no answer")
    return lines


def _task_lines(task: Task) -> list[str]:
    users = [
        f"User{f' (turn {i + 1})' if len(task.turns) > 1 else ''}: {t.user}"
        for i, t in enumerate(task.turns)
    ]
    return [*users, "Tools: " + ", ".join(task.tool_names)]


@dataclass(frozen=True)
class MemoryPrompt:
    """One condensation request: the chat for a model, plus what a scripted writer needs."""

    task: Task
    messages: list[dict[str, Any]]
    attempts: list[Trajectory]  # every attempt so far (the chat may show only the latest)
    previous: str  # notes so far (sequential), "" at first
    fits: bool = True  # False: over budget even with every attempt line dropped


def build_memory_prompt(
    task: Task,
    attempts: Sequence[Trajectory],
    cfg: RehearsalConfig,
    previous: str = "",
    *,
    first_index: int = 1,
    count_tokens: Callable[[list[dict[str, Any]]], int] | None = None,
    max_tokens: int | None = None,
) -> MemoryPrompt:
    """The condensation chat, fitted to `max_tokens` by dropping attempt lines (never the
    instructions, the task or the notes so far). `first_index` numbers the attempts shown."""
    shown = [attempt_lines(t, cfg.max_result_chars) for t in attempts]

    def build() -> list[dict[str, Any]]:
        parts = ["Task:\n" + "\n".join(_task_lines(task))]
        if previous:
            parts.append(f"Notes so far:\n{previous}")
        for i, (t, lines) in enumerate(zip(attempts, shown, strict=True)):
            head = f"Imagined attempt {first_index + i} (ended: {t.end_reason}):"
            parts.append("\n".join([head, *lines]))
        if previous:
            parts.append(_REVISE)
        return [
            {"role": "system", "content": cfg.memory_prompt},
            {"role": "user", "content": "\n\n".join(parts)},
        ]

    messages = build()
    if count_tokens is None or max_tokens is None:
        return MemoryPrompt(task, messages, list(attempts), previous)
    while count_tokens(messages) > max_tokens and any(shown):
        longest = max(shown, key=len)
        longest.pop()
        messages = build()
    fits = count_tokens(messages) <= max_tokens
    return MemoryPrompt(task, messages, list(attempts), previous, fits)


# --- memory writers ----------------------------------------------------------------------------
@dataclass(frozen=True)
class WrittenMemory:
    text: str
    generated_tokens: int


class MemoryWriter(Protocol):
    """Condenses imagined attempts into rehearsal notes (one per prompt, same order)."""

    def count_tokens(self) -> Callable[[list[dict[str, Any]]], int] | None: ...

    def write(
        self, prompts: Sequence[MemoryPrompt], params: SamplingParams
    ) -> list[WrittenMemory]: ...


def _clean(text: str) -> str:
    return strip_thinking(text).strip()


class ModelMemoryWriter:
    """The policy model writes its own notes, at most `params.max_new_tokens` tokens."""

    def __init__(self, backend: GenerationBackend, renderer: ChatRenderer) -> None:
        self.backend = backend
        self.renderer = renderer

    def count_tokens(self) -> Callable[[list[dict[str, Any]]], int] | None:
        return lambda messages: len(self.renderer.prompt_ids(messages))

    def write(self, prompts: Sequence[MemoryPrompt], params: SamplingParams) -> list[WrittenMemory]:
        ids = [self.renderer.prompt_ids(p.messages) for p in prompts]
        gens = self.backend.generate(ids, params)
        return [WrittenMemory(_clean(g.text), len(g.token_ids)) for g in gens]


class ChatMemoryWriter:
    """An OpenAI-compatible endpoint writes the notes (token ids unknown: counted as 0)."""

    def __init__(self, policy: ChatPolicy) -> None:
        self.policy = policy

    def count_tokens(self) -> Callable[[list[dict[str, Any]]], int] | None:
        return None

    def write(self, prompts: Sequence[MemoryPrompt], params: SamplingParams) -> list[WrittenMemory]:
        return [
            WrittenMemory(_clean(self.policy.client.chat(p.messages, params)), 0) for p in prompts
        ]


class DigestMemoryWriter:
    """Deterministic notes for scripted policies: the plan of the cleanest attempt and the
    errors seen, cut to the budget (the renderer's tokens when there is one, else words)."""

    def __init__(self, renderer: ChatRenderer | None = None) -> None:
        self.renderer = renderer

    def count_tokens(self) -> Callable[[list[dict[str, Any]]], int] | None:
        return None

    def write(self, prompts: Sequence[MemoryPrompt], params: SamplingParams) -> list[WrittenMemory]:
        out = []
        for p in prompts:
            text = self._cut(self._digest(p.attempts), params.max_new_tokens)
            tokens = len(self.renderer.encode(text)) if self.renderer is not None and text else 0
            out.append(WrittenMemory(text, tokens))
        return out

    @staticmethod
    def _digest(attempts: Sequence[Trajectory]) -> str:
        def errors(t: Trajectory) -> int:
            return sum(1 for c in t.calls if is_error_result(c.result)) + t.parse_errors

        best = min(attempts, key=lambda t: (errors(t), -len(t.calls)))
        plan = "; ".join(f"{c.call.name}({_dump(c.call.arguments)})" for c in best.calls)
        seen = sorted(
            {
                f"{c.call.name}: {_dump(c.result.get('error', c.result))}"
                for t in attempts
                for c in t.calls
                if is_error_result(c.result) and isinstance(c.result, dict)
            }
        )
        lines = [f"Plan: {plan}." if plan else "Plan: answer without tool calls."]
        if seen:
            lines.append("Pitfalls: " + " | ".join(seen))
        return "\n".join(lines)

    def _cut(self, text: str, budget: int) -> str:
        if self.renderer is None:
            words = text.split(" ")
            return text if len(words) <= budget else " ".join(words[:budget])
        ids = self.renderer.encode(text)
        return text if len(ids) <= budget else self.renderer.decode(ids[:budget])


def memory_writer_for(policy: Policy) -> MemoryWriter:
    """The writer that matches the policy: its own model, its endpoint, or a digest."""
    if isinstance(policy, ModelPolicy) and policy.renderer is not None:
        return ModelMemoryWriter(policy.backend, policy.renderer)
    if isinstance(policy, ChatPolicy):
        return ChatMemoryWriter(policy)
    return DigestMemoryWriter(policy.renderer)


# --- rehearsal ---------------------------------------------------------------------------------
def with_memory(task: Task, memory: str) -> Task:
    """`task` with the notes appended to its system prompt (unchanged when there are none)."""
    if not memory.strip():
        return task
    notes = f"{NOTES_HEADER}\n{memory.strip()}"
    system = f"{task.system}\n\n{notes}" if task.system else notes
    return dataclasses.replace(task, system=system)


@dataclass
class TaskRehearsal:
    """What one task's rehearsals produced and cost (every committed turn of every copy)."""

    task_id: str
    attempts: list[Trajectory] = dataclasses.field(default_factory=list)
    writes: list[WrittenMemory] = dataclasses.field(default_factory=list)  # one per condensation
    attempt_tokens: int = 0  # generated by the imagined attempts, both roles
    generations: int = 0  # imagined generations + memory writes
    episodes: int = 0  # committed executions of the task that rehearsed
    context_tokens: int = 0  # tokens of notes that entered those contexts, header included
    context_chars: int = 0

    @property
    def memory(self) -> str:
        """The last notes written (the ones the last committed turn saw)."""
        return self.writes[-1].text if self.writes else ""

    @property
    def memory_tokens(self) -> int:
        """Tokens generated by every memory write."""
        return sum(w.generated_tokens for w in self.writes)

    @property
    def extra_tokens(self) -> int:
        return self.attempt_tokens + self.memory_tokens


@dataclass
class RehearsalOutcome:
    config: RehearsalConfig
    tasks: dict[str, TaskRehearsal]

    @property
    def extra_tokens(self) -> int:
        return sum(t.extra_tokens for t in self.tasks.values())

    @property
    def extra_generations(self) -> int:
        return sum(t.generations for t in self.tasks.values())

    def memory(self, task_id: str) -> str:
        rehearsal = self.tasks.get(task_id)
        return rehearsal.memory if rehearsal is not None else ""


class _NoVerdict:
    """At test time nobody grades the imagined attempts: every turn passes with 0.0."""

    def grade(self, contexts: Sequence[TurnContext]) -> list[TurnGrade]:
        return [TurnGrade(0.0) for _ in contexts]


def _attempt_config(cfg: RolloutConfig, rcfg: RehearsalConfig, seed: int) -> RolloutConfig:
    def sampling(p: SamplingParams) -> SamplingParams:
        return dataclasses.replace(p, temperature=rcfg.temperature, seed=seed)

    return dataclasses.replace(
        cfg,
        mode="rehearsal",
        grounding=False,  # no logged real calls exist for a task seen at test time
        probe_fidelity=False,
        caller_sampling=sampling(cfg.caller_sampling),
        simulator_sampling=sampling(cfg.simulator_sampling),
    )


def _generated(traj: Trajectory) -> tuple[int, int]:
    return sum(len(r.response_ids) for r in traj.rows), len(traj.rows)


@dataclass(frozen=True)
class _Revealed:
    """What a committed episode has revealed when its turn starts: the real conversation before
    the turn's user message, that message, and nothing later."""

    attempt: Task  # the task cut to the current turn alone (its system without notes)
    shown: Task  # the turns revealed so far, for the condensation prompt
    history: list[dict[str, Any]]  # real messages after the system prompt, before the turn


def _revealed(e: Episode) -> _Revealed:
    msgs = e.traj.messages
    start = 1 if msgs and msgs[0].get("role") == "system" else 0
    turns = e.task.turns
    return _Revealed(
        attempt=dataclasses.replace(e.task, turns=(turns[e.turn],), reference=()),
        shown=dataclasses.replace(e.task, turns=turns[: e.turn + 1], reference=()),
        history=[dict(m) for m in msgs[start : e.turn_start]],
    )


def check_can_rehearse(policy: Policy, what: str) -> None:
    """Refuse a policy whose simulator role executes anything real (the synthetic oracle
    replays calls in a copy of the real world): its "imagined" results would be real ones."""
    if not policy.rehearses_privately:
        raise UserInputError(
            f"{what}: this policy cannot rehearse privately: its simulator role executes the "
            "calls in a copy of the real world, so its notes would hold real results; rehearse "
            "with a model policy (a checkpoint), random or empty, or drop --rehearsal"
        )


class TurnRehearsal:
    """The `TurnHook` of test-time private rehearsal: before each committed turn, imagine it.

    For every committed episode at the start of a user turn, the attempts start from the real
    conversation so far and imagine that turn only, in rehearsal mode (the policy writes the
    calls and the results; no real tool runs, no grounding, no grader verdict); no later user
    turn reaches any prompt. The attempts are condensed into notes that replace the previous
    turn's notes in the committed system prompt. Attempt k of turn t samples with seed
    `seed + t * MAX_REHEARSAL_N + k` (parallel attempts are also the k-th copies of their task,
    so every policy kind draws distinct streams).
    """

    def __init__(
        self,
        policy: Policy,
        rcfg: RehearsalConfig,
        *,
        writer: MemoryWriter | None = None,
        seed: int = 0,
        progress: bool = False,
    ) -> None:
        check_can_rehearse(policy, type(policy).__name__)
        self.policy, self.rcfg = policy, rcfg
        self.writer = writer or memory_writer_for(policy)
        self.seed, self.progress = seed, progress
        self.outcome = RehearsalOutcome(rcfg, {})

    def __call__(self, episodes: Sequence[Episode]) -> None:
        by_turn: dict[int, list[Episode]] = {}
        for e in episodes:
            by_turn.setdefault(e.turn, []).append(e)
        for group in by_turn.values():
            self._rehearse_turn(group)

    def _rehearse_turn(self, episodes: Sequence[Episode]) -> None:
        revealed = [_revealed(e) for e in episodes]
        recs = [
            self.outcome.tasks.setdefault(e.task.id, TaskRehearsal(e.task.id)) for e in episodes
        ]
        cfg, turn = episodes[0].cfg, episodes[0].turn
        notes = [""] * len(episodes)
        if self.rcfg.mode == "parallel":
            groups = self._attempts(cfg, revealed, notes, self.rcfg.n, self._seed(turn, 0))
            for rec, group in zip(recs, groups, strict=True):
                _record(rec, group)
            notes = [w.text for w in self._condense(cfg, revealed, groups, recs, notes, 1)]
        else:
            for k in range(self.rcfg.n):
                groups = self._attempts(cfg, revealed, notes, 1, self._seed(turn, k))
                for rec, group in zip(recs, groups, strict=True):
                    _record(rec, group)
                written = self._condense(cfg, revealed, groups, recs, notes, k + 1)
                notes = [w.text for w in written]
        renderer = self.policy.renderer
        for e, rec, text in zip(episodes, recs, notes, strict=True):
            rec.episodes += 1 if e.turn == 0 else 0
            rec.context_chars += e.set_notes(text, NOTES_HEADER)
            if renderer is not None and e.notes:
                rec.context_tokens += len(renderer.encode(e.notes))

    def _seed(self, turn: int, k: int) -> int:
        return self.seed + turn * MAX_REHEARSAL_N + k

    def _attempts(
        self,
        cfg: RolloutConfig,
        revealed: Sequence[_Revealed],
        notes: Sequence[str],
        n: int,
        seed: int,
    ) -> list[list[Trajectory]]:
        """n imagined attempts per episode (grouped), from its real history."""
        engine = RolloutEngine(self.policy, _attempt_config(cfg, self.rcfg, seed), _NoVerdict())
        trajs = engine.run(
            [with_memory(r.attempt, m) for r, m in zip(revealed, notes, strict=True)],
            n=n,
            progress=self.progress,
            desc="rehearse",
            histories=[r.history for r in revealed],
        )
        return [trajs[i * n : (i + 1) * n] for i in range(len(revealed))]

    def _condense(
        self,
        cfg: RolloutConfig,
        revealed: Sequence[_Revealed],
        shown: Sequence[Sequence[Trajectory]],
        recs: Sequence[TaskRehearsal],
        previous: Sequence[str],
        first_index: int,
    ) -> list[WrittenMemory]:
        budget = cfg.max_context_tokens - self.rcfg.memory_tokens
        prompts = [
            build_memory_prompt(
                r.shown,
                trajs,
                self.rcfg,
                prev,
                first_index=first_index,
                count_tokens=self.writer.count_tokens(),
                max_tokens=budget,
            )
            for r, trajs, prev in zip(revealed, shown, previous, strict=True)
        ]
        params = SamplingParams(self.rcfg.memory_tokens, 0.0, seed=self.seed)
        fitting = [p for p in prompts if p.fits]
        written_iter = iter(self.writer.write(fitting, params) if fitting else [])
        # a request that cannot fit the context gets no notes
        written = [next(written_iter) if p.fits else WrittenMemory("", 0) for p in prompts]
        for rec, w in zip(recs, written, strict=True):
            rec.writes.append(w)
            rec.generations += 1
        return written


def _record(rec: TaskRehearsal, trajs: Sequence[Trajectory]) -> None:
    for t in trajs:
        tokens, gens = _generated(t)
        rec.attempts.append(t)
        rec.attempt_tokens += tokens
        rec.generations += gens


# --- the report --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RehearsalGain:
    """Success with and without rehearsal on the same tasks and seeds, and what it cost."""

    mode: str
    n: int
    n_tasks: int
    success_without: float | None
    success_with: float | None
    gain: float | None  # success_with - success_without (a fraction; x100 for points)
    extra_tokens: int  # generated by the imagined attempts + memory writes, all tasks
    extra_tokens_per_task: float
    extra_generations: int
    # notes that entered the committed contexts (header included), per committed episode,
    # summed over its turns; 0 tokens for policies without a tokenizer
    memory_tokens_per_task: float
    memory_chars_per_task: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _success_by_task(trajs: Sequence[Trajectory]) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for t in trajs:
        if t.success is not None:
            sums.setdefault(t.uid, []).append(1.0 if t.success else 0.0)
    return {k: sum(v) / len(v) for k, v in sums.items()}


def _rate(by_task: Mapping[str, float], ids: Sequence[str]) -> float | None:
    vals = [by_task[i] for i in ids if i in by_task]
    return sum(vals) / len(vals) if vals else None


def rehearsal_gain(
    without: Sequence[Trajectory],
    with_rehearsal: Sequence[Trajectory],
    outcome: RehearsalOutcome,
    task_ids: Sequence[str] | None = None,
) -> RehearsalGain:
    """Compare two committed executions of the same tasks (restricted to `task_ids`)."""
    ids = list(task_ids) if task_ids is not None else list(outcome.tasks)
    base, reh = _success_by_task(without), _success_by_task(with_rehearsal)
    a, b = _rate(base, ids), _rate(reh, ids)
    recs = [outcome.tasks[i] for i in ids if i in outcome.tasks]
    n = max(len(recs), 1)
    episodes = max(sum(r.episodes for r in recs), 1)
    extra = sum(r.extra_tokens for r in recs)
    return RehearsalGain(
        mode=outcome.config.mode,
        n=outcome.config.n,
        n_tasks=len(recs),
        success_without=a,
        success_with=b,
        gain=(b - a) if a is not None and b is not None else None,
        extra_tokens=extra,
        extra_tokens_per_task=extra / n,
        extra_generations=sum(r.generations for r in recs),
        memory_tokens_per_task=sum(r.context_tokens for r in recs) / episodes,
        memory_chars_per_task=sum(r.context_chars for r in recs) / episodes,
    )
