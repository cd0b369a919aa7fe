"""Rehearsals scored against the real worlds during RL rollouts, and `algo.simulator_reward`.

Real worlds and the real trainer's reward and advantage code; the policies are scripted (they
write exact texts, so the expected fidelities are known)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from envace.config import load_config
from envace.errors import ConfigError
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.rollout.grading import TaskGrader
from envace.rollout.policies import GenRequest, OraclePolicy
from envace.rollout.types import Role, Row
from envace.run import tool_results
from envace.tasks.model import Task
from envace.train.rl import RLTrainer, row_score

from .conftest import ScriptedPolicy

_OK = '<execution_result>\n{"status": "ok"}\n</execution_result>'


def _sims(trajs: Any) -> list[Row]:
    return [r for t in trajs for r in t.rows if r.role is Role.SIMULATOR]


def _oracle_caller(sim_text: str | None) -> ScriptedPolicy:
    """The oracle's calls and answers; its simulator writes `sim_text` (None: the real result)."""
    oracle = OraclePolicy()

    def script(req: GenRequest) -> str:
        if req.role is Role.SIMULATOR and sim_text is not None:
            return sim_text
        return oracle._text(req)

    return ScriptedPolicy(script)


def test_the_oracles_rehearsals_score_one_against_the_real_world(train_tasks: list[Task]) -> None:
    cfg = RolloutConfig(mode="rehearsal", score_rehearsals=True)
    trajs = RolloutEngine(_oracle_caller(None), cfg, TaskGrader()).run(train_tasks, n=2)
    sims = _sims(trajs)
    assert sims and all(r.fidelity == 1.0 for r in sims)


def test_a_wrong_rehearsal_scores_its_share_of_matching_fields(train_tasks: list[Task]) -> None:
    cfg = RolloutConfig(mode="rehearsal", score_rehearsals=True)
    trajs = RolloutEngine(_oracle_caller(_OK), cfg, TaskGrader()).run(train_tasks)
    checked = 0
    for t in trajs:
        sims = [r for r in t.rows if r.role is Role.SIMULATOR]
        assert len(sims) == len(t.calls)
        for i, row in enumerate(sims):
            real = _replay(t.task, i + 1)
            keys = set(real) | {"status"} if isinstance(real, dict) else set()
            same = 1 if isinstance(real, dict) and real.get("status") == "ok" else 0
            expected = same / len(keys) if keys else 0.0
            assert row.fidelity == pytest.approx(expected), (t.traj_id, real)
            checked += 1
    assert checked and any(r.fidelity is not None and r.fidelity < 1.0 for r in _sims(trajs))


def _replay(task: Task, upto: int) -> Any:
    """The real world's result of the oracle's `upto`-th call of `task` (replayed afresh)."""
    from envace.envs.registry import make_environment

    assert task.environment is not None
    env = make_environment(task.environment.name)
    env.reset(task.environment.initial_state)
    calls = [c for turn in task.turns for c in turn.expected_calls][:upto]
    result: Any = None
    for c in calls:
        result = env.call(c.name, dict(c.arguments))
    return json.loads(json.dumps(result))


def test_malformed_rehearsals_score_zero_and_unscored_modes_leave_none(
    train_tasks: list[Task],
) -> None:
    cfg = RolloutConfig(mode="rehearsal", score_rehearsals=True)
    bad = RolloutEngine(_oracle_caller("the balance is 5"), cfg, TaskGrader()).run(train_tasks[:3])
    assert [r.fidelity for r in _sims(bad)] == [0.0] * 3
    off = RolloutConfig(mode="rehearsal")
    plain = RolloutEngine(_oracle_caller(None), off, TaskGrader()).run(train_tasks[:3])
    assert _sims(plain) and all(r.fidelity is None for r in _sims(plain))


def test_rollout_config_scores_rehearsals_except_in_the_real_worlds() -> None:
    for mode, scored in (("rehearsal", True), ("external", True), ("real", False)):
        cfg = load_config(None, [f"rollout.mode={mode}"])
        assert RolloutConfig.from_config(cfg).score_rehearsals is scored


def _row(role: Role, fidelity: float | None) -> Row:
    return Row(role, "u", "u#0", 0, 0, [1], [2], [0.0], "stop", True, True, fidelity=fidelity)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("task", [0.5, 0.5, 0.5, None]), ("fidelity", [0.5, 0.25, 0.5, 0.25])],
)
def test_row_score(mode: str, expected: list[float | None]) -> None:
    rows = [
        _row(Role.CALLER, None),
        _row(Role.SIMULATOR, 0.25),
        _row(Role.SIMULATOR, None),  # a task without a world: the task reward
    ]
    got = [row_score(r, 0.5, mode) for r in rows]
    got.append(row_score(_row(Role.SIMULATOR, 0.25), None, mode) if mode != "task" else None)
    assert got == expected
    assert row_score(_row(Role.SIMULATOR, 0.25), 0.75, "mixed") == pytest.approx(0.5)
    assert row_score(_row(Role.SIMULATOR, 0.25), None, "mixed") is None
    assert row_score(_row(Role.CALLER, 1.0), 0.75, "fidelity") == 0.75  # callers: the task's


def test_fidelity_reward_drives_the_simulator_advantages(train_tasks: list[Task]) -> None:
    """Through the trainer's rollout half: a simulator that is right in the first of each task's
    two rollouts and wrong in the second. Under the task reward its rows score the trajectory's reward; under
    the fidelity reward their fidelity, so right rehearsals get positive advantages."""
    oracle = OraclePolicy()

    def script(req: GenRequest) -> str:
        if req.role is Role.SIMULATOR and req.episode.sample_index == 1:
            return _OK
        return oracle._text(req)

    def collect(reward: str) -> list[Row]:
        cfg = load_config(
            None,
            [
                "rollout.batch_tasks=12",
                "rollout.n=2",
                f"algo.simulator_reward={reward}",
                "algo.empty_penalty=0",
            ],
        )
        trainer = RLTrainer(cfg, train_tasks, ScriptedPolicy(script), [], TaskGrader())
        rows, metrics = trainer.collect(0)
        assert 0 < metrics["rollout/sim_field_fidelity"] < 1
        return [r for r in rows if r.role is Role.SIMULATOR]

    task_rows = collect("task")
    rewards = {r.traj_id: r.reward for r in task_rows}
    fid_rows = collect("fidelity")
    assert [r.fidelity for r in fid_rows] == [r.fidelity for r in task_rows]
    assert all(r.reward == r.fidelity for r in fid_rows)
    assert any(r.reward != rewards[r.traj_id] for r in fid_rows)
    # within a task's group, a rehearsal better than the group's mean gets a positive advantage
    by_uid: dict[str, list[Row]] = {}
    for r in fid_rows:
        by_uid.setdefault(r.uid, []).append(r)
    mixed = [g for g in by_uid.values() if len({r.fidelity for r in g}) > 1]
    assert mixed
    for g in mixed:
        mean = sum(r.fidelity or 0.0 for r in g) / len(g)
        for r in g:
            assert r.advantage == pytest.approx((r.fidelity or 0.0) - mean)


def test_simulator_reward_needs_rehearsal_mode() -> None:
    load_config(None, ["algo.simulator_reward=mixed"])  # rehearsal: fine
    for mode in ("real", "external"):
        with pytest.raises(ConfigError, match=r"algo\.simulator_reward.*rollout\.mode: rehearsal"):
            load_config(None, [f"rollout.mode={mode}", "algo.simulator_reward=fidelity"])


def test_mask_caller_unscores_only_caller_rows() -> None:
    assert row_score(_row(Role.CALLER, None), 0.5, "task", mask_caller=True) is None
    assert row_score(_row(Role.CALLER, None), 0.5, "task", mask_caller=False) == 0.5
    # the simulator rows of such an episode keep their score, under every simulator reward
    assert row_score(_row(Role.SIMULATOR, None), 0.5, "task", mask_caller=True) == 0.5
    assert row_score(_row(Role.SIMULATOR, 0.25), 0.5, "fidelity", mask_caller=True) == 0.25


def test_mask_sim_errors_masks_the_callers_of_episodes_a_malformed_rehearsal_ended(
    train_tasks: list[Task],
) -> None:
    """Through the trainer's rollout half: the oracle's calls; its simulator writes the real
    result in the first rollout of each task and a malformed one in the second, which ends that
    episode at its current turn. Scored (the default), the second rollout's caller rows get the
    truncated episode's low reward and negative advantages; masked, they get no score and no
    advantage (they do not train), and the first rollout's caller rows, alone in their group,
    a zero baseline's advantage."""
    oracle = OraclePolicy()

    def script(req: GenRequest) -> str:
        if req.role is Role.SIMULATOR and req.episode.sample_index == 1:
            return "the balance is 5"
        return oracle._text(req)

    def collect(mask: bool) -> tuple[list[Row], dict[str, float]]:
        cfg = load_config(
            None,
            [
                "rollout.batch_tasks=4",
                "rollout.n=2",
                f"algo.mask_sim_errors={str(mask).lower()}",
                "algo.empty_penalty=0",
            ],
        )
        trainer = RLTrainer(cfg, train_tasks, ScriptedPolicy(script), [], TaskGrader())
        return trainer.collect(0)

    scored, m_scored = collect(False)
    masked, m_masked = collect(True)
    assert m_scored["end/simulator_format_error"] == m_masked["end/simulator_format_error"] == 4
    assert "reward/caller_masked_episodes" not in m_scored
    assert m_masked["reward/caller_masked_episodes"] == 4.0
    bad = {r.traj_id for r in masked if r.role is Role.SIMULATOR and not r.valid}
    assert len(bad) == 4
    for r in masked:
        if r.role is Role.CALLER and r.traj_id in bad:
            assert r.reward is None and r.advantage is None
        else:
            assert r.reward is not None and r.advantage is not None
    callers = [r for r in scored if r.role is Role.CALLER and r.traj_id in bad]
    assert callers and all(r.advantage is not None and r.advantage < 0 for r in callers)
    # the simulator rows are scored alike either way
    sims = [(r.reward, r.advantage) for r in scored if r.role is Role.SIMULATOR]
    assert sims == [(r.reward, r.advantage) for r in masked if r.role is Role.SIMULATOR]


def test_mask_sim_errors_masks_nothing_in_the_real_worlds(train_tasks: list[Task]) -> None:
    """configs/local.yaml masks for every mode, so `--set rollout.mode=real` must keep working:
    the worlds answer every call, no episode ends on a malformed result, and the rows are
    scored exactly as without masking."""
    oracle = OraclePolicy()

    def collect(mask: bool) -> tuple[list[Row], dict[str, float]]:
        sets = ["rollout.mode=real", "rollout.batch_tasks=4", "rollout.n=2"]
        cfg = load_config(None, [*sets, f"algo.mask_sim_errors={str(mask).lower()}"])
        worlds = tool_results(cfg, None, None, lambda: None)
        policy = ScriptedPolicy(oracle._text)
        return RLTrainer(cfg, train_tasks, policy, [], TaskGrader(), worlds).collect(0)

    masked, metrics = collect(True)
    scored, _ = collect(False)
    assert metrics["reward/caller_masked_episodes"] == 0.0
    assert masked and all(r.role is Role.CALLER for r in masked)
    assert [(r.reward, r.advantage) for r in masked] == [(r.reward, r.advantage) for r in scored]
    assert all(r.reward is not None for r in masked)
