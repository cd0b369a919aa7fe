"""BFCL through EnvACE's rollout engine, graded by bfcl-eval's own checkers (in the worker).

Each BFCL entry becomes a `Task`: its user turns, its function docs as tools (BFCL names kept, as
bfcl-eval's Qwen3 function-calling handler passes them; BFCL types mapped to JSON Schema) and its
ground truth as expected calls (for the oracle replay only; grading is bfcl-eval's).

- Single-turn categories (AST: simple, multiple, parallel, live...; irrelevance): one caller
  response, as in BFCL; its tool calls are the model output the checker grades. Nothing runs.
- Multi-turn categories: the caller acts for up to bfcl-eval's step limit per user turn; every
  call runs in bfcl-eval's executable classes inside the worker, in instances private to the
  episode (dropped when it ends); the state + response checker grades the episode.
- Memory categories: first each needed scenario's prerequisite conversations run, one after the
  other, each leaving its memory to the next (bfcl-eval's snapshots, private to the run); then
  the questions run on the final memory and bfcl-eval's agentic checker reads the answer.

Only parsed calls (a name and a JSON arguments object) go to the worker.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import uuid
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
    "UNAVAILABLE_CATEGORIES",
    "BfclEnvironment",
    "BfclEpisode",
    "CategoryScore",
    "bfcl_rollout_config",
    "bfcl_settings",
    "episode_output",
    "load_bfcl_tasks",
    "model_context",
    "parse_categories",
    "run_bfcl",
    "summarize_bfcl",
    "task_from_record",
]

log = logging.getLogger(__name__)

# BFCL v4 file names of the supported categories, in bfcl-eval's order (worker.CATEGORIES).
SUPPORTED_CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
    "memory_kv",
    "memory_rec_sum",
)
# Groups, named as bfcl-eval's TEST_COLLECTION_MAPPING where it has one (restricted to what runs
# here); "simple" is the three languages, which BFCL's overall averages into one "simple".
CATEGORY_ALIASES = {
    "all": SUPPORTED_CATEGORIES,
    "simple": ("simple_python", "simple_java", "simple_javascript"),
    "non_live": SUPPORTED_CATEGORIES[:7],
    "live": SUPPORTED_CATEGORIES[7:12],
    "single_turn": SUPPORTED_CATEGORIES[:12],
    "multi_turn": SUPPORTED_CATEGORIES[12:16],
    "memory": SUPPORTED_CATEGORIES[16:],
}
# v4 categories that do not run here, and why.
UNAVAILABLE_CATEGORIES = {
    "web_search_base": "it searches the web (SerpAPI): no network here",
    "web_search_no_snippet": "it searches the web (SerpAPI): no network here",
    "memory_vector": "its memory embeds text with sentence-transformers' all-MiniLM-L6-v2, "
    "downloaded from the Hugging Face hub (and torch): not installed, no network here",
    "live_relevance": "it has no ground truth to replay, and no weight in BFCL's overall",
    "format_sensitivity": "it is for prompting models only, and has no weight in the overall",
}
SINGLE_TURN_KINDS = ("ast", "irrelevance")
# BFCL executes every call of a response (a parallel answer or a multi-turn turn can hold many);
# it has no limit, the generation length bounds them. Ours is only a guard against a runaway.
_MAX_CALLS_PER_MESSAGE = 1024
# Engine ends that bfcl-eval would see as an inference error (no result for the entry).
_INFERENCE_ERRORS = (EndReason.CONTEXT_LIMIT, EndReason.CALL_LIMIT, EndReason.SIM_PROMPT_TOO_LONG)


def parse_categories(spec: str) -> list[str]:
    """`simple,multi_turn_base` | `all` | `live` ... -> BFCL category names, in the given order."""
    names: list[str] = []
    for raw in spec.split(","):
        name = raw.strip()
        if not name:
            continue
        for part in CATEGORY_ALIASES.get(name, (name,)):
            _check_category(part)
            if part not in names:
                names.append(part)
    if not names:
        raise UserInputError("--benchmark bfcl: names no category, e.g. bfcl:simple,multiple")
    return names


def _check_category(name: str) -> None:
    if name in SUPPORTED_CATEGORIES:
        return
    if name in UNAVAILABLE_CATEGORIES:
        raise UserInputError(
            f"BFCL category {name!r} does not run here: {UNAVAILABLE_CATEGORIES[name]}"
        )
    raise UserInputError(
        f"BFCL category {name!r} is not supported; choose from {', '.join(SUPPORTED_CATEGORIES)} "
        f"or the groups {', '.join(CATEGORY_ALIASES)}"
    )


def task_from_record(record: dict[str, Any]) -> Task:
    """A worker task record -> Task (meta: the BFCL category, kind, memory scenario and the
    messages before the first turn's question, if any)."""
    answers = tuple(str(a) for a in record.get("answers", ()))
    turns = tuple(
        Turn(
            user=user,
            expected_calls=tuple(ExpectedCall(c["name"], dict(c["arguments"])) for c in calls),
            answer_facts=answers if i == len(record["turns"]) - 1 else (),
        )
        for i, (user, calls) in enumerate(zip(record["turns"], record["expected"], strict=True))
    )
    return Task(
        id=record["id"],
        tools=tuple(record["tools"]),
        turns=turns,
        system=record.get("system"),
        meta={
            "benchmark": "bfcl",
            "category": record["category"],
            "kind": record["kind"],
            "scenario": record.get("scenario"),
            "history": list(record.get("history") or ()),
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


def _kind(task: Task) -> str:
    return str(task.meta.get("kind", "ast"))


def _stepped(task: Task) -> bool:
    """Entries that run several steps in bfcl-eval's executable classes."""
    return _kind(task) not in SINGLE_TURN_KINDS


class BfclEnvironment:
    """`Environment` for one BFCL episode; multi-step calls execute in the worker.

    run: the evaluation run the episode belongs to (memory snapshots are private to a run)."""

    name = "bfcl"

    def __init__(self, worker: BfclWorker, task: Task, episode: str, run: str = "") -> None:
        self.worker = worker
        self.task = task
        self.episode = episode
        self.run = run
        self.system: str | None = None

    def tools(self) -> list[dict[str, Any]]:
        return list(self.task.tools)

    def reset(self, initial_state: dict[str, Any]) -> None:
        """A fresh episode: bfcl-eval builds its instances from the entry's configuration (a
        memory entry: from its scenario's memory so far) and gives memory entries their system
        prompt (`self.system`)."""
        self.close()
        if _stepped(self.task):
            reply = self.worker.request(
                "start", episode=self.episode, id=self.task.id, run=self.run
            )
            self.system = reply["system"]

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if not _stepped(self.task):  # single-turn BFCL grades calls, never runs them
            return {"status": "recorded"}
        reply = self.worker.request(
            "call", episode=self.episode, id=self.task.id, name=name, arguments=arguments
        )
        if reply.get("refused"):
            return tool_error("UNKNOWN_TOOL", str(reply["refused"]))
        return _result_object(str(reply["result"]))

    def snapshot(self) -> dict[str, Any]:
        if not _stepped(self.task):
            return {}
        state: dict[str, Any] = self.worker.request("snapshot", episode=self.episode)
        return state

    def close(self) -> None:
        """Ends the episode (a memory prerequisite saves its memory for the next one)."""
        if _stepped(self.task):
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


def model_context(policy: Policy) -> int | None:
    """The policy's model context window (its config's max_position_embeddings, which bfcl-eval's
    local handlers read), or None for policies without a model in this process."""
    backend = getattr(policy, "backend", None)
    config = getattr(getattr(backend, "model", None), "config", None)
    window = getattr(config, "max_position_embeddings", None)
    return window if isinstance(window, int) and window > 0 else None


def bfcl_settings(policy: Policy, cfg: RolloutConfig, worker: BfclWorker) -> dict[str, Any]:
    """The run settings BFCL episodes get (for the report)."""
    return {
        "step limit per user turn (bfcl-eval)": int(worker.info["step_limit"]),
        "caller context tokens": model_context(policy) or cfg.max_context_tokens,
        "max new tokens": cfg.caller_sampling.max_new_tokens,
    }


def bfcl_rollout_config(
    cfg: RolloutConfig,
    stepped: bool,
    *,
    step_limit: int,
    max_turns: int = 1,
    context: int | None = None,
) -> RolloutConfig:
    """Real-mode knobs for BFCL: single-turn entries get exactly one caller response; stepped
    ones bfcl-eval's limit (it force-quits a turn after `step_limit` steps with calls, so a
    turn may take step_limit + 1 responses, the last without calls); an undecodable response
    ends only its turn; the context is the model's window when known."""
    steps = step_limit + 1 if stepped else 1
    return dataclasses.replace(
        cfg,
        mode="real",
        probe_fidelity=False,
        grounding=False,
        max_steps_per_turn=steps,
        max_calls_per_message=max(cfg.max_calls_per_message, _MAX_CALLS_PER_MESSAGE),
        max_micro_steps=max(cfg.max_micro_steps, steps * max_turns + 1),
        max_context_tokens=context or cfg.max_context_tokens,
        format_error_ends_turn=True,
    )


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function", c)
        out.append({"name": fn["name"], "arguments": fn["arguments"]})
    return out


def _steps(traj: Trajectory) -> list[list[dict[str, Any]]]:
    """Per user turn reached, its assistant messages."""
    turns: list[list[dict[str, Any]]] = []
    msgs = traj.messages
    start = len(traj.task.meta.get("history") or ()) + int(
        bool(msgs) and msgs[0]["role"] == "system"
    )
    for msg in msgs[start:]:
        if msg.get("role") == "user":
            turns.append([])
        elif msg.get("role") == "assistant" and turns:
            turns[-1].append(msg)
    return turns


def episode_output(traj: Trajectory, kind: str) -> list[Any]:
    """The model output bfcl-eval grades, as parsed calls.

    single-turn (ast, irrelevance): the calls of the first assistant response. multi_turn: per
    user turn reached, the list of steps (assistant messages) with their calls. memory: the
    steps of its one turn, each {"calls", "content"} (the answer is the last step without calls).
    """
    turns = _steps(traj)
    if kind in SINGLE_TURN_KINDS:
        first = turns[0] if turns else []
        return _calls(first[0]) if first else []
    if kind == "multi_turn":
        return [[_calls(m) for m in steps] for steps in turns]
    steps = turns[0] if turns else []
    return [{"calls": _calls(m), "content": str(m.get("content") or "")} for m in steps]


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
    """bfcl-eval's verdict; an episode the engine aborted is graded as bfcl-eval grades an
    entry whose inference failed (its result is the error text)."""
    task = traj.task
    if traj.end_reason in _INFERENCE_ERRORS:
        output: Any = f"Error during inference: the episode ended with {traj.end_reason}"
    else:
        output = episode_output(traj, _kind(task))
    verdict = worker.request("grade", id=task.id, output=output)
    valid = bool(verdict["valid"])
    traj.reward = 1.0 if valid else 0.0
    traj.success = valid
    category = str(task.meta.get("category", ""))
    return BfclEpisode(task.id, category, valid, verdict["error_type"], verdict["error"], traj)


class _EnvFactory:
    """Builds one environment per episode with a unique episode key; closes them all.

    `prepare` starts them before the engine runs: a memory entry's system prompt comes from
    the memory its instance loaded, and the task is given it."""

    def __init__(self, worker: BfclWorker, run: str) -> None:
        self.worker = worker
        self.run = run
        self.counter = itertools.count()
        self.envs: dict[str, BfclEnvironment] = {}

    def prepare(self, tasks: Sequence[Task]) -> list[Task]:
        ready = []
        for task in tasks:
            env = BfclEnvironment(self.worker, task, f"{task.id}-{next(self.counter)}", self.run)
            env.reset({})
            if env.system is not None:
                task = dataclasses.replace(task, system=env.system)
                env.task = task
            self.envs[task.id] = env
            ready.append(task)
        return ready

    def __call__(self, task: Task) -> BfclEnvironment:
        return self.envs[task.id]

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
        self.envs.clear()


@dataclass(frozen=True)
class _Run:
    """What every engine pass of one `run_bfcl` call shares."""

    policy: Policy
    cfg: RolloutConfig
    worker: BfclWorker
    key: str
    progress: bool


def _run_group(run: _Run, tasks: Sequence[Task], before_turn: TurnHook | None) -> list[Trajectory]:
    """One engine pass over `tasks` (all single-turn or all stepped)."""
    if not tasks:
        return []
    factory = _EnvFactory(run.worker, run.key)
    try:
        ready = factory.prepare(tasks)
        cfg = bfcl_rollout_config(
            run.cfg,
            _stepped(tasks[0]),
            step_limit=int(run.worker.info["step_limit"]),
            max_turns=max(len(t.turns) for t in ready),
            context=model_context(run.policy),
        )
        engine = RolloutEngine(
            run.policy, cfg, _EpisodeGrader(), make_env=factory, before_turn=before_turn
        )
        histories = [t.meta.get("history") or [] for t in ready]
        return engine.run(ready, progress=run.progress, desc="bfcl", histories=histories)
    finally:
        factory.close()


def _run_prerequisites(run: _Run, questions: Sequence[Task]) -> None:
    """Each scenario's prerequisite conversations, in order, one per scenario at a time; each
    leaves its memory (a bfcl-eval snapshot of this run) to the next and to the questions.
    They are not graded, and not rehearsed."""
    scenarios = dict.fromkeys((str(t.meta["category"]), str(t.meta["scenario"])) for t in questions)
    chains = [
        [task_from_record(r) for r in run.worker.request("prereqs", category=c, scenario=s)]
        for c, s in scenarios
    ]
    for step in itertools.zip_longest(*chains):
        _run_group(run, [t for t in step if t is not None], None)
    log.info("bfcl: %d memory prerequisite conversations ran", sum(len(c) for c in chains))


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
    run = _Run(policy, cfg, worker, uuid.uuid4().hex[:12], progress)
    single = [t for t in tasks if not _stepped(t)]
    multi = [t for t in tasks if _kind(t) == "multi_turn"]
    memory = [t for t in tasks if _kind(t) == "memory"]
    trajs = _run_group(run, single, before_turn) + _run_group(run, multi, before_turn)
    if memory:
        _run_prerequisites(run, memory)
        trajs += _run_group(run, memory, before_turn)
    episodes = [_grade(worker, t) for t in trajs]
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
