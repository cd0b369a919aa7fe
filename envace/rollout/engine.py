"""The batched world-rehearsal rollout: a micro-step state machine over many episodes.

At every micro-step each live episode needs at most one caller generation and, once it has
issued tool calls, one tool result per call. All caller requests of a micro-step go to the policy
as one batch, then all simulator requests as another, so a model backend sees large batches.

Tool results come from, by `RolloutConfig.mode`:
- "rehearsal": the policy itself (the method) — one trainable simulator row per call;
- "real": the task's executable world (the upper-bound baseline, and evaluation);
- "external": another policy (a frozen checkpoint or an HTTP endpoint) — rows not trainable.

User turns are replayed from the task. A malformed caller or simulator output ends the episode
and zeroes the turn; every limit that ends an episode is recorded as its `end_reason`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tqdm import tqdm

from envace.envs.base import Environment
from envace.policy.chat import tool_message_content
from envace.policy.parsing import ParseError, parse_execution_result, parse_tool_calls
from envace.policy.prompts import build_rehearse_messages, compact_tools, grounding_from_reference
from envace.policy.types import Generation, SamplingParams, ToolCall
from envace.reward.fidelity import field_agreement
from envace.rollout.policies import GenRequest, Policy
from envace.rollout.types import CallRecord, EndReason, Role, Row, Trajectory
from envace.rollout.validation import call_is_schema_valid
from envace.tasks.model import Task

if TYPE_CHECKING:
    from envace.config import Config

__all__ = [
    "Episode",
    "RolloutConfig",
    "RolloutEngine",
    "TurnContext",
    "TurnGrade",
    "TurnGrader",
    "TurnHook",
]

log = logging.getLogger(__name__)

Mode = Literal["rehearsal", "real", "external"]


@dataclass(frozen=True)
class RolloutConfig:
    """Rollout knobs. Token budgets are in the policy tokenizer's tokens."""

    mode: Mode = "rehearsal"
    caller_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(256))
    simulator_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(256))
    max_steps_per_turn: int = 8  # caller generations per user turn
    max_calls_per_message: int = 4
    max_context_tokens: int = 4096  # caller prompt + its max_new_tokens
    max_sim_prompt_tokens: int = 4096
    grounding: bool = True  # give the simulator the task's logged real calls and results
    sim_whitelist: Literal["schemas", "names"] = "schemas"
    probe_fidelity: bool = False  # real mode: also let the policy rehearse each real call
    # rehearsal/external modes: score each rehearsed result against the real world's answer to
    # the same calls where the task has a world (`Row.fidelity`, `Episode.shadow_result`)
    score_rehearsals: bool = False
    think_switch: str = ""  # appended to simulator prompts ("/think" for Qwen3 thinking)
    max_micro_steps: int = 200
    # full: the task's tool schemas as given. compact: descriptions, types, enums and required
    # fields only (envace.policy.prompts.compact_tools), for the caller and the simulator alike
    tool_schemas: Literal["full", "compact"] = "full"
    # True: a malformed caller output only ends its user turn (the next turn follows), as
    # BFCL's inference skips an undecodable step; False: it ends the episode
    format_error_ends_turn: bool = False

    @classmethod
    def from_config(cls, cfg: Config, *, eval_mode: bool = False) -> RolloutConfig:
        """The rollout knobs of a run's config, the one place they are read: RL rollouts
        sample with `rollout.temperature`/`top_p`; `eval_mode` (held-out evaluation, also
        during RL) with `eval.temperature` and no nucleus cut."""
        r = cfg.rollout
        temp = cfg.eval.temperature if eval_mode else r.temperature
        top_p = 1.0 if eval_mode else r.top_p
        return cls(
            mode=r.mode,
            caller_sampling=SamplingParams(r.caller_max_new_tokens, temp, top_p),
            simulator_sampling=SamplingParams(r.simulator_max_new_tokens, temp, top_p),
            max_steps_per_turn=r.max_steps_per_turn,
            max_calls_per_message=r.max_calls_per_message,
            max_context_tokens=r.max_context_tokens,
            max_sim_prompt_tokens=r.max_sim_prompt_tokens,
            grounding=r.grounding,
            sim_whitelist=r.sim_whitelist,
            think_switch="/think" if cfg.model.enable_thinking else "",
            tool_schemas=r.tool_schemas,
            score_rehearsals=r.mode != "real",
        )


@dataclass(frozen=True)
class TurnContext:
    """What a grader sees when a user turn ends."""

    task: Task
    turn: int
    calls: list[ToolCall]
    messages: list[dict[str, Any]]
    turn_start: int  # index in `messages` of this turn's user message


@dataclass(frozen=True)
class TurnGrade:
    """score None = could not be graded (the row is masked, never silently 0)."""

    score: float | None
    stop: bool = False  # a required checklist item failed: end the episode


class TurnGrader(Protocol):
    def grade(self, contexts: Sequence[TurnContext]) -> list[TurnGrade]: ...


# Called with the episodes about to make their first caller generation of a user turn (that
# turn's message is already in their history, no later one is); it may give each notes to read
# (`Episode.set_notes`). Test-time private rehearsal is such a hook (envace.evaluate.rehearsal).
TurnHook = Callable[[Sequence["Episode"]], None]


class State(Enum):
    AWAIT_CALLER = auto()
    AWAIT_SIMULATOR = auto()
    TURN_DONE = auto()
    DONE = auto()


class Episode:
    """One trajectory in progress. Scripted policies read it through `GenRequest.episode`."""

    def __init__(
        self,
        task: Task,
        traj_id: str,
        cfg: RolloutConfig,
        caller: Policy,
        simulator: Policy | None,
        env: Environment | None,
        *,
        history: Sequence[dict[str, Any]] = (),
        sample_index: int = 0,
    ) -> None:
        """history: messages that happened before the task's first turn (after its system
        prompt): a rehearsal attempt starts from a real conversation so far. sample_index: which
        of the task's n copies this is (policies that seed each request derive its seed)."""
        self.task = task
        self.cfg = cfg
        self.caller = caller
        self.simulator = simulator
        self.env = env
        self.traj = Trajectory(task=task, traj_id=traj_id)
        self.state = State.AWAIT_CALLER
        self.turn = 0
        self.turn_calls: list[ToolCall] = []
        self.turn_start = 0
        self.steps_in_turn = 0
        self.micro_step = 0
        self.pending: list[ToolCall] = []
        self.cursor = 0
        self.results: list[tuple[ToolCall, Any]] = []
        self.caller_raw = ""
        self.issued: list[ToolCall] = []  # every call of the episode, in order
        self._shadow: Environment | None = None
        self._shadow_results: list[Any] = []  # the real results of `issued`, replayed so far
        self._grounding = grounding_from_reference(task.reference) if cfg.grounding else []
        # What both roles see of the tools (the real worlds always check the full schemas).
        self.tools = compact_tools(task.tools) if cfg.tool_schemas == "compact" else task.tools
        self.sample_index = sample_index
        self.notes = ""
        self.noted_turn = -1  # the last turn a TurnHook has seen
        if task.system:
            self.traj.messages.append({"role": "system", "content": task.system})
        self.traj.messages.extend(dict(m) for m in history)
        # tool-call ids continue after the history's, so the rendered chat never repeats one
        self._id_base = sum(len(m.get("tool_calls") or ()) for m in history)
        self._start_turn()
        r = caller.renderer
        self.caller_ids: list[int] = (
            r.prompt_ids(self.traj.messages, self.tools) if r is not None else []
        )

    # --- requests -----------------------------------------------------------------------------
    def caller_request(self) -> GenRequest | None:
        """The next caller generation, or None when a limit ended the episode."""
        if self.steps_in_turn >= self.cfg.max_steps_per_turn:
            self._end(EndReason.STEP_LIMIT)
            return None
        budget = len(self.caller_ids) + self.cfg.caller_sampling.max_new_tokens
        if self.caller.renderer is not None and budget > self.cfg.max_context_tokens:
            self._end(EndReason.CONTEXT_LIMIT)
            return None
        self.steps_in_turn += 1
        return GenRequest(Role.CALLER, list(self.caller_ids), list(self.traj.messages), self)

    def simulator_request(self) -> GenRequest | None:
        """The rehearsal of the pending call, or None when its prompt cannot fit."""
        assert self.simulator is not None
        r = self.simulator.renderer
        prompt = build_rehearse_messages(
            tools=self.tools,
            grounding=self._grounding,
            history=self.traj.messages[:-1],
            caller_raw=self.caller_raw,
            call=self.pending[self.cursor],
            siblings=[(c, tool_message_content(res)) for c, res in self.results],
            count_tokens=(lambda m: len(r.prompt_ids(m))) if r is not None else None,
            max_tokens=self.cfg.max_sim_prompt_tokens - self.cfg.simulator_sampling.max_new_tokens,
            whitelist=self.cfg.sim_whitelist,
            think_switch=self.cfg.think_switch,
        )
        if not prompt.fits:
            self._end(EndReason.SIM_PROMPT_TOO_LONG)
            return None
        ids = r.prompt_ids(prompt.messages) if r is not None else []
        return GenRequest(Role.SIMULATOR, ids, prompt.messages, self)

    # --- transitions --------------------------------------------------------------------------
    def on_caller(self, req: GenRequest, gen: Generation) -> None:
        parsed = parse_tool_calls(gen.text)
        valid = parsed.error is None and bool(gen.text.strip())
        self._add_row(Role.CALLER, req, gen, self.caller.trainable, valid)
        self._extend_caller_ids(gen.token_ids)
        self.caller_raw = gen.text
        if parsed.error is not None:
            self.traj.parse_errors += 1
            self.traj.messages.append({"role": "assistant", "content": gen.text})
            if self.cfg.format_error_ends_turn:
                self.state = State.TURN_DONE
                return
            self._fail_turn(EndReason.CALLER_FORMAT_ERROR, parsed.error)
            return
        calls = parsed.calls
        self.traj.messages.append(
            {
                "role": "assistant",
                "content": parsed.content,
                **({"tool_calls": self._call_dicts(calls)} if calls else {}),
            }
        )
        if not calls:
            self.state = State.TURN_DONE
            return
        if len(calls) > self.cfg.max_calls_per_message:
            self._end(EndReason.CALL_LIMIT)
            return
        self.pending, self.cursor, self.results = calls, 0, []
        self.turn_calls.extend(calls)
        self.issued.extend(calls)
        self._advance_tools()

    def on_simulator(self, req: GenRequest, gen: Generation) -> None:
        parsed = parse_execution_result(gen.text)
        assert self.simulator is not None
        trainable = self.simulator.trainable and self.cfg.mode != "real"
        self._add_row(Role.SIMULATOR, req, gen, trainable, parsed.error is None)
        if self.cfg.score_rehearsals and self.cfg.mode != "real" and self.task.environment:
            real = self.shadow_result()
            self.traj.rows[-1].fidelity = (
                0.0 if parsed.error is not None else field_agreement(real, parsed.result)
            )
        call = self.pending[self.cursor]
        if self.cfg.mode == "real":  # a fidelity probe: the real world still answers
            result = self._execute_real(call)
            self._record(call, result, "real", rehearsed=parsed.result, error=parsed.error)
        elif parsed.error is not None:
            self.traj.parse_errors += 1
            result = parsed.error.to_tool_content()
            self._record(call, result, self.cfg.mode)
            self.results.append((call, result))
            self._flush_tool_messages()
            self._fail_turn(EndReason.SIMULATOR_FORMAT_ERROR, parsed.error)
            return
        else:
            result = parsed.result
            self._record(call, result, self.cfg.mode)
        self.results.append((call, result))
        self.cursor += 1
        self._advance_tools()

    def context(self) -> TurnContext:
        return TurnContext(
            self.task, self.turn, list(self.turn_calls), list(self.traj.messages), self.turn_start
        )

    def on_graded(self, grade: TurnGrade) -> None:
        self.traj.turn_scores.append(grade.score)
        if grade.score is None:
            self._end(EndReason.UNSCORED)
        elif grade.stop:
            self._end(EndReason.REQUIRED_ITEM_FAILED)
        elif self.turn + 1 >= len(self.task.turns):
            self._end(EndReason.COMPLETED)
        else:
            self.turn += 1
            self._start_turn()
            if self.caller.renderer is not None:
                self.caller_ids.extend(self.caller.renderer.delta_ids(self.traj.messages[-1:]))
                self.caller_ids.extend(self.caller.renderer.generation_prompt_ids)
            self.state = State.AWAIT_CALLER

    def set_notes(self, notes: str, header: str) -> int:
        """Put `notes` (under `header`) in the system prompt for the turns from now on, in
        place of earlier notes; empty notes remove them. Returns the number of characters that
        entered the context. The caller's prompt ids are rendered again from the messages."""
        text = f"{header}\n{notes.strip()}" if notes.strip() else ""
        self.notes = text
        base = self.task.system or ""
        system = f"{base}\n\n{text}" if base and text else (base or text)
        msgs = self.traj.messages
        has_system = bool(msgs) and msgs[0].get("role") == "system"
        if has_system and system:
            msgs[0] = {"role": "system", "content": system}
        elif has_system:
            del msgs[0]
            self.turn_start -= 1
        elif system:
            msgs.insert(0, {"role": "system", "content": system})
            self.turn_start += 1
        r = self.caller.renderer
        if r is not None:
            self.caller_ids = r.prompt_ids(msgs, self.tools)
        return len(text)

    # --- oracle support -----------------------------------------------------------------------
    def shadow_result(self) -> Any:
        """The real result of the pending call, from a private replay of the episode's calls."""
        if self.task.environment is None:
            return {"status": "ok"}
        if self._shadow is None:
            from envace.envs.registry import make_environment

            self._shadow = make_environment(self.task.environment.name)
            self._shadow.reset(self.task.environment.initial_state)
        index = len(self.issued) - len(self.pending) + self.cursor
        while len(self._shadow_results) <= index:
            c = self.issued[len(self._shadow_results)]
            self._shadow_results.append(self._shadow.call(c.name, c.arguments))
        return self._shadow_results[index]

    # --- internals ----------------------------------------------------------------------------
    def _start_turn(self) -> None:
        self.turn_start = len(self.traj.messages)
        self.traj.messages.append({"role": "user", "content": self.task.turns[self.turn].user})
        self.turn_calls = []
        self.steps_in_turn = 0

    def _call_dicts(self, calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
        base = self._id_base + len(self.issued)
        return [c.to_message_dict(f"call_{base + i}") for i, c in enumerate(calls)]

    def _add_row(
        self, role: Role, req: GenRequest, gen: Generation, trainable: bool, valid: bool
    ) -> None:
        self.traj.rows.append(
            Row(
                role=role,
                uid=self.task.id,
                traj_id=self.traj.traj_id,
                turn=self.turn,
                step=self.micro_step,
                prompt_ids=req.prompt_ids,
                response_ids=list(gen.token_ids),
                logprobs=list(gen.logprobs),
                finish_reason=gen.finish_reason,
                trainable=trainable and bool(gen.token_ids),
                valid=valid,
                text=gen.text,
            )
        )

    def _extend_caller_ids(self, response_ids: Sequence[int]) -> None:
        r = self.caller.renderer
        if r is not None:  # token-in / token-out: the sampled ids themselves, never re-encoded
            self.caller_ids.extend(response_ids)
            self.caller_ids.extend(r.close_response(response_ids))

    def _needs_generation(self) -> bool:
        return self.cfg.mode != "real" or self.cfg.probe_fidelity

    def _advance_tools(self) -> None:
        while self.cursor < len(self.pending):
            if self._needs_generation():
                self.state = State.AWAIT_SIMULATOR
                return
            call = self.pending[self.cursor]
            result = self._execute_real(call)
            self._record(call, result, "real")
            self.results.append((call, result))
            self.cursor += 1
        self._flush_tool_messages()
        self.state = State.AWAIT_CALLER

    def _execute_real(self, call: ToolCall) -> Any:
        if self.env is None:
            raise RuntimeError(f"task {self.task.id!r} has no environment for real execution")
        return self.env.call(call.name, call.arguments)

    def _record(
        self,
        call: ToolCall,
        result: Any,
        source: str,
        rehearsed: Any = None,
        error: ParseError | None = None,
    ) -> None:
        self.traj.calls.append(
            CallRecord(
                turn=self.turn,
                call=call,
                result=result,
                source=source,
                schema_valid=call_is_schema_valid(self.task, call),
                rehearsed=rehearsed,
                rehearsal_error=error.code if error is not None else None,
            )
        )

    def _flush_tool_messages(self) -> None:
        new = [
            {
                "role": "tool",
                "tool_call_id": f"call_{self._id_base + len(self.issued) - len(self.pending) + i}",
                "name": c.name,
                "content": tool_message_content(res),
            }
            for i, (c, res) in enumerate(self.results)
        ]
        self.traj.messages.extend(new)
        r = self.caller.renderer
        if r is not None:
            self.caller_ids.extend(r.delta_ids(new))
            self.caller_ids.extend(r.generation_prompt_ids)

    def _fail_turn(self, reason: EndReason, error: ParseError) -> None:
        log.debug("episode %s ends: %s (%s)", self.traj.traj_id, reason, error.message)
        self._end(reason)

    def _end(self, reason: EndReason) -> None:
        if len(self.traj.turn_scores) <= self.turn:  # the current turn was interrupted
            self.traj.turn_scores.append(0.0)
        self.traj.end_reason = reason
        self.state = State.DONE


class RolloutEngine:
    """Runs episodes in lock-step micro-steps.

    policy: the caller (and, in rehearsal mode, the simulator).
    simulator: required in external mode; in real mode it is the fidelity probe (defaults to
        the policy).
    make_env: builds a fresh real world for a task (real mode); None elsewhere.
    before_turn: called before each user turn's first caller generation (see `TurnHook`).
    """

    def __init__(
        self,
        policy: Policy,
        cfg: RolloutConfig,
        grader: TurnGrader,
        simulator: Policy | None = None,
        make_env: Callable[[Task], Environment] | None = None,
        before_turn: TurnHook | None = None,
    ) -> None:
        if cfg.mode == "external" and simulator is None:
            raise ValueError("external mode needs a simulator policy (a frozen model or endpoint)")
        if cfg.mode == "real" and make_env is None:
            raise ValueError("real mode needs make_env to build each task's world")
        self.policy = policy
        self.cfg = cfg
        self.grader = grader
        self.simulator: Policy = simulator or policy
        self.make_env = make_env
        self.before_turn = before_turn

    def run(
        self,
        tasks: Sequence[Task],
        n: int = 1,
        progress: bool = False,
        desc: str = "rollout",
        histories: Sequence[Sequence[dict[str, Any]]] | None = None,
    ) -> list[Trajectory]:
        """n trajectories per task, in task order (the n copies of a task share its uid).

        histories: per task, the conversation before its first turn (see `Episode`)."""
        if histories is not None and len(histories) != len(tasks):
            raise ValueError(f"{len(histories)} histories for {len(tasks)} tasks")
        episodes = [
            Episode(
                task,
                f"{task.id}#{k}",
                self.cfg,
                self.policy,
                self.simulator,
                self._env_for(task),
                history=histories[i] if histories is not None else (),
                sample_index=k,
            )
            for i, task in enumerate(tasks)
            for k in range(n)
        ]
        bar = tqdm(total=len(episodes), desc=desc, unit="ep", disable=not progress, leave=False)
        active = list(episodes)
        step = 0
        while active:
            step += 1
            for e in active:
                e.micro_step = step
            if step > self.cfg.max_micro_steps:
                for e in active:
                    e._end(EndReason.STEP_LIMIT)
            self._turn_hook(active)
            self._caller_phase(active)
            self._simulator_phase(active)
            self._grade_phase(active)
            done = [e for e in active if e.state is State.DONE]
            bar.update(len(done))
            active = [e for e in active if e.state is not State.DONE]
        bar.close()
        return [self._finish(e) for e in episodes]

    def _env_for(self, task: Task) -> Environment | None:
        if self.cfg.mode != "real":
            return None
        assert self.make_env is not None
        return self.make_env(task)

    def _turn_hook(self, active: Sequence[Episode]) -> None:
        if self.before_turn is None:
            return
        starting = [e for e in active if e.state is State.AWAIT_CALLER and e.noted_turn < e.turn]
        for e in starting:
            e.noted_turn = e.turn
        if starting:
            self.before_turn(starting)

    def _caller_phase(self, active: Sequence[Episode]) -> None:
        pairs = [(e, e.caller_request()) for e in active if e.state is State.AWAIT_CALLER]
        reqs = [(e, r) for e, r in pairs if r is not None]
        if not reqs:
            return
        gens = self.policy.generate([r for _, r in reqs], self.cfg.caller_sampling)
        for (e, r), g in zip(reqs, gens, strict=True):
            e.on_caller(r, g)

    def _simulator_phase(self, active: Sequence[Episode]) -> None:
        # Sibling calls of one message are rehearsed one per micro-phase so each sees the
        # previous siblings' results (the reference rehearses them blind to each other).
        while True:
            pairs = [(e, e.simulator_request()) for e in active if e.state is State.AWAIT_SIMULATOR]
            reqs = [(e, r) for e, r in pairs if r is not None]
            if not reqs:
                return
            gens = self.simulator.generate([r for _, r in reqs], self.cfg.simulator_sampling)
            for (e, r), g in zip(reqs, gens, strict=True):
                e.on_simulator(r, g)

    def _grade_phase(self, active: Sequence[Episode]) -> None:
        due = [e for e in active if e.state is State.TURN_DONE]
        if not due:
            return
        grades = self.grader.grade([e.context() for e in due])
        for e, g in zip(due, grades, strict=True):
            e.on_graded(g)

    def _finish(self, e: Episode) -> Trajectory:
        traj = e.traj
        n_turns = len(e.task.turns)
        scores = traj.turn_scores
        traj.reward = (
            None if any(s is None for s in scores) else sum(s or 0.0 for s in scores) / n_turns
        )
        if e.env is not None:
            traj.final_state = e.env.snapshot()
        traj.success = _success(e.task, traj)
        return traj


def _success(task: Task, traj: Trajectory) -> bool | None:
    """The success rule in the real world when there is one (the final state, and every
    information turn's answer stating its facts); otherwise a perfect reward."""
    if traj.reward is None:
        return None
    if task.success and traj.final_state is not None and "final_state" in task.success:
        from envace.envs.state import success_mismatch
        from envace.reward.rules import missing_facts, turn_answers

        answers = turn_answers(traj.messages)
        told = len(answers) >= len(task.turns) and not any(
            missing_facts(turn, answers[i]) for i, turn in enumerate(task.turns)
        )
        return (
            traj.end_reason is EndReason.COMPLETED
            and success_mismatch(task.success, traj.final_state) is None
            and told
        )
    return traj.reward >= 1.0 - 1e-9
