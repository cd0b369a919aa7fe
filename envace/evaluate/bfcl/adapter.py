"""BFCL through EnvACE's rollout engine, graded by bfcl-eval's own checkers (in the worker).

Each BFCL entry becomes a `Task`: its user turns, its function docs as tools (BFCL names kept, as
bfcl-eval's Qwen3 function-calling handler passes them; BFCL types mapped to JSON Schema) and its
ground truth as expected calls (for the oracle replay only; grading is bfcl-eval's).

- Single-turn categories (simple, multiple, parallel, parallel_multiple): one caller response,
  as in BFCL; its tool calls are the model output the AST checker grades. Nothing executes.
- multi_turn_base: the caller acts over several steps per user turn; every call runs in
  bfcl-eval's executable classes inside the worker, in instances private to the episode
  (dropped when the episode is graded); the state + response checker grades the episode.

Only parsed calls (a name and a JSON arguments object) go to the worker.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envace.envs.base import tool_error
from envace.errors import UserInputError
from envace.evaluate.bfcl.client import BfclWorker
from envace.rollout.engine import RolloutConfig, RolloutEngine, TurnContext, TurnGrade, TurnHook
from envace.rollout.policies import Policy
from envace.rollout.types import EndReason, Trajectory
from envace.tasks.model import ExpectedCall, Task, Turn

__all__ = [
    "CATEGORY_ALIASES",
    "SUPPORTED_CATEGORIES",
    "BfclEnvironment",
    "BfclEpisode",
    "CategoryScore",
    "bfcl_rollout_config",
    "episode_output",
    "load_bfcl_tasks",
    "parse_categories",
    "run_bfcl",
    "summarize_bfcl",
    "task_from_record",
]

# BFCL v4 file names of the supported categories; "simple" is the Python one (simple_python).
SUPPORTED_CATEGORIES = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "multi_turn_base",
)
CATEGORY_ALIASES = {"simple": "simple_python", "all": ",".join(SUPPORTED_CATEGORIES)}
MULTI_TURN_CATEGORIES = ("multi_turn_base",)
# A BFCL parallel answer or multi-turn turn can hold many calls in one message.
_MAX_CALLS_PER_MESSAGE = 32
# Engine ends that bfcl-eval would count as a force-terminated multi-turn entry.
_FORCE_TERMINATED = (
    EndReason.STEP_LIMIT,
    EndReason.CONTEXT_LIMIT,
    EndReason.CALL_LIMIT,
    EndReason.SIM_PROMPT_TOO_LONG,
)


def parse_categories(spec: str) -> list[str]:
    """`simple,multi_turn_base` | `all` -> BFCL category names, in the given order."""
    names: list[str] = []
    for raw in spec.split(","):
        name = raw.strip()
        if not name:
            continue
        for part in CATEGORY_ALIASES.get(name, name).split(","):
            if part not in SUPPORTED_CATEGORIES:
                raise UserInputError(
                    f"BFCL category {name!r} is not supported; choose from simple, "
                    f"{', '.join(SUPPORTED_CATEGORIES[1:])} or all"
                )
            if part not in names:
                names.append(part)
    if not names:
        raise UserInputError("--benchmark bfcl: names no category, e.g. bfcl:simple,multiple")
    return names


def task_from_record(record: dict[str, Any]) -> Task:
    """A worker task record -> Task (meta carries the BFCL category)."""
    turns = tuple(
        Turn(
            user=user,
            expected_calls=tuple(ExpectedCall(c["name"], dict(c["arguments"])) for c in calls),
        )
        for user, calls in zip(record["turns"], record["expected"], strict=True)
    )
    return Task(
        id=record["id"],
        tools=tuple(record["tools"]),
        turns=turns,
        system=record.get("system"),
        meta={
            "benchmark": "bfcl",
            "category": record["category"],
            "multi_turn": bool(record["multi_turn"]),
        },
    )


def load_bfcl_tasks(
    worker: BfclWorker, categories: Sequence[str], limit: int | None = None
) -> dict[str, list[Task]]:
    """Tasks per category; `limit` takes that many evenly spaced entries of each category."""
    return {
        cat: [task_from_record(r) for r in worker.request("load", category=cat, limit=limit)]
        for cat in categories
    }


def _is_multi_turn(task: Task) -> bool:
    return bool(task.meta.get("multi_turn"))


class BfclEnvironment:
    """`Environment` for one BFCL episode; multi-turn calls execute in the worker."""

    name = "bfcl"

    def __init__(self, worker: BfclWorker, task: Task, episode: str) -> None:
        self.worker = worker
        self.task = task
        self.episode = episode

    def tools(self) -> list[dict[str, Any]]:
        return list(self.task.tools)

    def reset(self, initial_state: dict[str, Any]) -> None:
        """Drops the episode's instances; the worker rebuilds them from the entry's config."""
        self.close()

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if not _is_multi_turn(self.task):  # single-turn BFCL grades calls, never runs them
            return {"status": "recorded"}
        reply = self.worker.request(
            "call", episode=self.episode, id=self.task.id, name=name, arguments=arguments
        )
        if reply.get("refused"):
            return tool_error("UNKNOWN_TOOL", str(reply["refused"]))
        return _result_object(str(reply["result"]))

    def snapshot(self) -> dict[str, Any]:
        if not _is_multi_turn(self.task):
            return {}
        state: dict[str, Any] = self.worker.request("snapshot", episode=self.episode)
        return state

    def close(self) -> None:
        if _is_multi_turn(self.task):
            self.worker.request("end", episode=self.episode)


def _result_object(text: str) -> dict[str, Any]:
    """bfcl-eval returns strings: JSON objects pass through, the rest is wrapped."""
    if text.startswith("Error during execution:"):
        return tool_error("EXECUTION_ERROR", text)
    try:
        value = json.loads(text)
    except ValueError:
        return {"result": text}
    return value if isinstance(value, dict) else {"result": value}


class _EpisodeGrader:
    """BFCL grades whole episodes after they end; every turn passes with a neutral 0.0."""

    def grade(self, contexts: Sequence[TurnContext]) -> list[TurnGrade]:
        return [TurnGrade(0.0) for _ in contexts]


def bfcl_rollout_config(cfg: RolloutConfig, multi_turn: bool) -> RolloutConfig:
    """Real-mode knobs for BFCL: single-turn entries get exactly one caller response."""
    return dataclasses.replace(
        cfg,
        mode="real",
        probe_fidelity=False,
        grounding=False,
        max_steps_per_turn=cfg.max_steps_per_turn if multi_turn else 1,
        max_calls_per_message=max(cfg.max_calls_per_message, _MAX_CALLS_PER_MESSAGE),
    )


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function", c)
        out.append({"name": fn["name"], "arguments": fn["arguments"]})
    return out


def episode_output(traj: Trajectory, multi_turn: bool) -> list[Any]:
    """The model output bfcl-eval grades, as parsed calls.

    single-turn: the calls of the first assistant response. multi-turn: per user turn reached,
    the list of steps (assistant messages) with their calls.
    """
    turns: list[list[list[dict[str, Any]]]] = []
    for msg in traj.messages:
        if msg.get("role") == "user":
            turns.append([])
        elif msg.get("role") == "assistant" and turns:
            turns[-1].append(_calls(msg))
    if not multi_turn:
        first = turns[0] if turns else []
        return first[0] if first else []
    return turns


@dataclass
class BfclEpisode:
    """One graded BFCL episode."""

    task_id: str
    category: str
    valid: bool
    error_type: str | None
    error: Any
    trajectory: Trajectory


def _grade(worker: BfclWorker, traj: Trajectory) -> BfclEpisode:
    task = traj.task
    multi = _is_multi_turn(task)
    category = str(task.meta.get("category", ""))
    if multi and traj.end_reason in _FORCE_TERMINATED:
        verdict: dict[str, Any] = {
            "valid": False,
            "error_type": "multi_turn:force_terminated",
            "error": f"the episode ended with {traj.end_reason}",
        }
    else:
        verdict = worker.request("grade", id=task.id, output=episode_output(traj, multi))
    valid = bool(verdict["valid"])
    traj.reward = 1.0 if valid else 0.0
    traj.success = valid
    return BfclEpisode(task.id, category, valid, verdict["error_type"], verdict["error"], traj)


class _EnvFactory:
    """Builds one environment per episode with a unique episode key; closes them all."""

    def __init__(self, worker: BfclWorker) -> None:
        self.worker = worker
        self.counter = itertools.count()
        self.envs: list[BfclEnvironment] = []

    def __call__(self, task: Task) -> BfclEnvironment:
        env = BfclEnvironment(self.worker, task, f"{task.id}-{next(self.counter)}")
        env.reset({})
        self.envs.append(env)
        return env

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs.clear()


def run_bfcl(
    policy: Policy,
    tasks: Sequence[Task],
    cfg: RolloutConfig,
    worker: BfclWorker,
    *,
    progress: bool = False,
    before_turn: TurnHook | None = None,
) -> list[BfclEpisode]:
    """Committed execution of `policy` on BFCL tasks, then bfcl-eval's verdict per episode.

    before_turn: runs before each committed turn (test-time rehearsal, `TurnRehearsal`)."""
    episodes: list[BfclEpisode] = []
    factory = _EnvFactory(worker)
    for multi in (False, True):
        group = [t for t in tasks if _is_multi_turn(t) is multi]
        if not group:
            continue
        engine = RolloutEngine(
            policy,
            bfcl_rollout_config(cfg, multi),
            _EpisodeGrader(),
            make_env=factory,
            before_turn=before_turn,
        )
        try:
            trajs = engine.run(group, progress=progress, desc="bfcl")
            episodes.extend(_grade(worker, t) for t in trajs)
        finally:
            factory.close()
    order = {t.id: i for i, t in enumerate(tasks)}
    return sorted(episodes, key=lambda e: order[e.task_id])


@dataclass(frozen=True)
class CategoryScore:
    """BFCL accuracy of one category plus where episodes went wrong."""

    category: str
    n: int
    accuracy: float
    valid_call_rate: float | None  # calls whose name and arguments fit the tool schema
    calls_per_task: float
    format_error_rate: float
    end_reasons: dict[str, int]
    error_types: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize_bfcl(episodes: Sequence[BfclEpisode]) -> dict[str, CategoryScore]:
    """Per-category scores, in first-seen category order."""
    by_cat: dict[str, list[BfclEpisode]] = {}
    for e in episodes:
        by_cat.setdefault(e.category, []).append(e)
    return {cat: _score(cat, eps) for cat, eps in by_cat.items()}


def _score(category: str, eps: Sequence[BfclEpisode]) -> CategoryScore:
    calls = [c for e in eps for c in e.trajectory.calls]
    return CategoryScore(
        category=category,
        n=len(eps),
        accuracy=sum(1 for e in eps if e.valid) / len(eps),
        valid_call_rate=sum(1 for c in calls if c.schema_valid) / len(calls) if calls else None,
        calls_per_task=len(calls) / len(eps),
        format_error_rate=sum(1 for e in eps if e.trajectory.parse_errors) / len(eps),
        end_reasons=dict(Counter(str(e.trajectory.end_reason) for e in eps)),
        error_types=dict(Counter(e.error_type for e in eps if e.error_type)),
    )
