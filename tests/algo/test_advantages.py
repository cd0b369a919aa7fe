"""Role-wise GRPO advantages on tiny batches whose numbers are worked out by hand in comments."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.algo.advantages import AdvantageResult, apply_empty_penalty, compute_advantages

REPO = Path(__file__).resolve().parents[2]

# Two tasks x two rollouts, rows of both roles ("c" = caller, "s" = simulator):
#   task u1: trajectory a (reward 1.0): 3 caller rows, 2 simulator rows
#            trajectory b (reward 0.0): 1 caller row,  1 simulator row
#   task u2: trajectory c (reward 0.5): 2 caller rows, 1 simulator row
#            trajectory d (judge failed): 1 caller row, 1 simulator row, unscored (None)
ROWS = [
    # (score, uid, role, traj)
    (1.0, "u1", "c", "a"),
    (1.0, "u1", "s", "a"),
    (1.0, "u1", "c", "a"),
    (1.0, "u1", "s", "a"),
    (1.0, "u1", "c", "a"),
    (0.0, "u1", "c", "b"),
    (0.0, "u1", "s", "b"),
    (0.5, "u2", "c", "c"),
    (0.5, "u2", "s", "c"),
    (0.5, "u2", "c", "c"),
    (None, "u2", "c", "d"),
    (None, "u2", "s", "d"),
]


def run(rows: list[tuple[float | None, str, str, str]], **kwargs: object) -> AdvantageResult:
    scores, uids, roles, trajs = (list(col) for col in zip(*rows, strict=True))
    return compute_advantages(scores, uids, roles, trajs, **kwargs)  # type: ignore[arg-type]


def approx(values: Sequence[float | None]) -> list[object]:
    return [None if v is None else pytest.approx(v, abs=1e-12) for v in values]


def test_row_mean_is_the_reference_baseline() -> None:
    # (u1, c): rows 1, 1, 1, 0      -> b = 3/4            -> A = .25, .25, .25, -.75
    # (u1, s): rows 1, 1, 0         -> b = 2/3            -> A = 1/3, 1/3, -2/3
    # (u2, c): rows .5, .5 (d None) -> b = .5 (two rows)  -> A = 0, 0
    # (u2, s): one scored row .5    -> singleton, b = 0   -> A = .5
    result = run(ROWS)
    assert result.advantages == approx(
        [0.25, 1 / 3, 0.25, 1 / 3, 0.25, -0.75, -2 / 3, 0.0, 0.5, 0.0, None, None]
    )


def test_trajectory_mean_weighs_trajectories_equally() -> None:
    # (u1, c): trajectory means a = 1, b = 0 -> b = 1/2 -> A = .5 (a rows), -.5 (b row)
    # (u1, s): a = 1, b = 0                  -> b = 1/2 -> A = .5, .5, -.5
    # (u2, c): one trajectory (c)            -> singleton, b = 0 -> A = .5, .5
    # (u2, s): one trajectory (c)            -> singleton, b = 0 -> A = .5
    result = run(ROWS, baseline="trajectory_mean")
    assert result.advantages == approx(
        [0.5, 0.5, 0.5, 0.5, 0.5, -0.5, -0.5, 0.5, 0.5, 0.5, None, None]
    )
    assert result.num_singleton_groups == 2


def test_both_baselines_are_reported_whichever_is_used() -> None:
    for baseline in ("row_mean", "trajectory_mean"):
        result = run(ROWS, baseline=baseline)
        u1_caller = next(g for g in result.groups if (g.uid, g.role) == ("u1", "c"))
        assert u1_caller.row_mean == pytest.approx(0.75)
        assert u1_caller.trajectory_mean == pytest.approx(0.5)
        assert (u1_caller.num_rows, u1_caller.num_trajectories) == (4, 2)
        metrics = result.metrics()
        # caller groups: (u1, c) 0.75 / 0.5 and (u2, c) 0.5 / 0.5 -> means 0.625 / 0.5
        assert metrics["adv/c/baseline_row_mean"] == pytest.approx(0.625)
        assert metrics["adv/c/baseline_trajectory_mean"] == pytest.approx(0.5)


def test_unscored_rows_are_masked_excluded_and_counted() -> None:
    result = run(ROWS)
    assert result.advantages[10] is None and result.advantages[11] is None
    assert result.num_unscored == 2
    assert result.per_role["c"].num_unscored == 1
    assert result.per_role["s"].num_unscored == 1
    assert result.per_role["c"].num_rows == 6
    # Had d's caller row counted as 0, (u2, c) would have b = 1/3; it is 0.5.
    u2_caller = next(g for g in result.groups if (g.uid, g.role) == ("u2", "c"))
    assert u2_caller.baseline == pytest.approx(0.5)
    assert result.metrics()["adv/num_unscored"] == 2.0


def test_group_with_no_scored_row_forms_no_group() -> None:
    result = compute_advantages([None, None], ["u", "u"], ["c", "c"], ["a", "b"])
    assert result.advantages == [None, None]
    assert result.num_groups == 0
    assert result.per_role["c"].advantage_mean == 0.0


def test_singleton_policies() -> None:
    # One scored row: zero_baseline (reference) gives A = r; zero_advantage gives A = 0.
    reference = compute_advantages([0.7], ["u"], ["c"], ["a"])
    assert reference.advantages == [pytest.approx(0.7)]
    assert reference.groups[0].singleton and reference.groups[0].baseline == 0.0
    muted = compute_advantages([0.7], ["u"], ["c"], ["a"], singleton="zero_advantage")
    assert muted.advantages == [0.0]
    # trajectory_mean: one trajectory with rows .7 and .6 is a singleton group.
    #   zero_baseline -> A = r = .7, .6 ; zero_advantage -> 0, 0
    two_rows = ([0.7, 0.6], ["u", "u"], ["c", "c"], ["a", "a"])
    ref_traj = compute_advantages(*two_rows, baseline="trajectory_mean")
    assert ref_traj.advantages == approx([0.7, 0.6])
    muted_traj = compute_advantages(
        *two_rows, baseline="trajectory_mean", singleton="zero_advantage"
    )
    assert muted_traj.advantages == [0.0, 0.0]
    # ... while for row_mean the same two rows are a real group: b = .65 -> A = .05, -.05
    assert compute_advantages(*two_rows).advantages == approx([0.05, -0.05])


def test_std_normalisation_uses_the_unbiased_std() -> None:
    # rows 1, 0, 0, 0: mean .25; unbiased var = (.75^2 + 3 * .25^2) / 3 = .75 / 3 = .25 -> std .5
    # A = (1 - .25) / .5 = 1.5 and (0 - .25) / .5 = -.5   (population std would give 1.732...)
    eps = 1e-6
    result = compute_advantages(
        [1.0, 0.0, 0.0, 0.0], ["u"] * 4, ["c"] * 4, ["a", "b", "c", "d"], normalize_std=True
    )
    assert result.advantages == approx([0.75 / (0.5 + eps)] + [-0.25 / (0.5 + eps)] * 3)
    assert result.groups[0].scale == pytest.approx(0.5 + eps)


def test_std_normalisation_trajectory_mean_uses_trajectory_values() -> None:
    # trajectory a rows 1, 1, 1 (mean 1); b row 0 -> values 1, 0: mean .5, unbiased std .7071
    # A(a) = .5 / .7071 = .7071, A(b) = -.7071
    result = compute_advantages(
        [1.0, 1.0, 1.0, 0.0],
        ["u"] * 4,
        ["c"] * 4,
        ["a", "a", "a", "b"],
        baseline="trajectory_mean",
        normalize_std=True,
    )
    half_root2 = math.sqrt(0.5)
    expected = 0.5 / (half_root2 + 1e-6)
    assert result.advantages == approx([expected] * 3 + [-expected])


def test_std_normalisation_keeps_singletons_and_constant_groups_finite() -> None:
    # Singleton: scale 1 -> A = r. Constant group (std 0): A = 0 / eps = 0.
    result = compute_advantages(
        [0.4, 0.3, 0.3], ["u1", "u2", "u2"], ["c"] * 3, ["a", "b", "c"], normalize_std=True
    )
    assert result.advantages == approx([0.4, 0.0, 0.0])


def test_roles_never_share_a_baseline() -> None:
    # Same task and trajectories; only the roles differ. Mixed, the baseline would be .5 for all.
    # caller rows 1, 0 -> b .5 -> .5, -.5; simulator rows 1, 1 -> b 1 -> 0, 0
    result = compute_advantages(
        [1.0, 0.0, 1.0, 1.0], ["u"] * 4, ["c", "c", "s", "s"], ["a", "b", "a", "b"]
    )
    assert result.advantages == approx([0.5, -0.5, 0.0, 0.0])
    assert {(g.uid, g.role) for g in result.groups} == {("u", "c"), ("u", "s")}


def test_tasks_never_share_a_baseline() -> None:
    # u1 rows 1, 0 -> b .5 ; u2 rows .2, .4 -> b .3   (mixed, b would be .4)
    result = compute_advantages(
        [1.0, 0.0, 0.2, 0.4], ["u1", "u1", "u2", "u2"], ["c"] * 4, ["a", "b", "c", "d"]
    )
    assert result.advantages == approx([0.5, -0.5, -0.1, 0.1])


def test_per_role_stats() -> None:
    result = run(ROWS)
    caller = result.per_role["c"]
    # caller advantages .25, .25, .25, -.75, 0, 0: mean 0, population var = (3/16 + 9/16) / 6 = 1/8
    assert caller.advantage_mean == pytest.approx(0.0, abs=1e-12)
    assert caller.advantage_std == pytest.approx(math.sqrt(1 / 8))
    assert (caller.num_groups, caller.num_singleton_groups) == (2, 0)
    assert (result.per_role["s"].num_groups, result.per_role["s"].num_singleton_groups) == (2, 1)
    assert result.num_groups == 4 and result.num_singleton_groups == 1


def test_no_row_is_duplicated_or_dropped() -> None:
    result = run(ROWS)
    assert len(result.advantages) == len(ROWS)
    assert sum(g.num_rows for g in result.groups) == len(ROWS) - result.num_unscored


def test_empty_penalty() -> None:
    # valid rows keep their score, invalid ones lose 0.1, unscored stay None
    out = apply_empty_penalty([1.0, 0.5, None, 0.0], [True, False, False, False])
    assert out == approx([1.0, 0.4, None, -0.1])
    assert apply_empty_penalty([0.5], [False], penalty=0.25) == [0.25]


def test_penalised_row_moves_its_group_baseline() -> None:
    # Trajectory a reward 1 with an empty caller row: rows 1, .9 ; trajectory b: 0.
    # row_mean b = 1.9 / 3 = .6333 -> A = .3667, .2667, -.6333
    scores = apply_empty_penalty([1.0, 1.0, 0.0], [True, False, True])
    result = compute_advantages(scores, ["u"] * 3, ["c"] * 3, ["a", "a", "b"])
    assert result.advantages == approx([1 - 1.9 / 3, 0.9 - 1.9 / 3, -1.9 / 3])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"baseline": "median"}, "baseline='median' is unknown"),
        ({"singleton": "drop"}, "singleton='drop' is unknown"),
        ({"eps": 0.0}, "eps must be"),
    ],
)
def test_bad_options_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compute_advantages([1.0], ["u"], ["c"], ["a"], **kwargs)  # type: ignore[arg-type]


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="lengths"):
        compute_advantages([1.0, 0.0], ["u"], ["c", "c"], ["a", "b"])
    with pytest.raises(ValueError, match="score of row 1 is nan"):
        compute_advantages([1.0, math.nan], ["u", "u"], ["c", "c"], ["a", "b"])
    with pytest.raises(ValueError, match="trajectory 'a' appears under uid 'u1'"):
        compute_advantages([1.0, 0.0], ["u1", "u2"], ["c", "c"], ["a", "a"])
    with pytest.raises(ValueError, match="penalty"):
        apply_empty_penalty([1.0], [False], penalty=-0.1)
    with pytest.raises(ValueError, match="lengths"):
        apply_empty_penalty([1.0], [False, True])


def test_importing_advantages_does_not_import_torch() -> None:
    code = (
        "import sys, envace.algo, envace.algo.advantages; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=REPO, env={"PYTHONPATH": str(REPO)}
    )


# -- properties -------------------------------------------------------------------------------

score = st.floats(min_value=-1.0, max_value=1.0, allow_nan=False)
batch = st.lists(
    st.tuples(score, st.sampled_from(["u1", "u2"]), st.sampled_from(["c", "s"]), st.integers(0, 3)),
    min_size=1,
    max_size=30,
)


def _rows(raw: list[tuple[float, str, str, int]]) -> list[tuple[float | None, str, str, str]]:
    # Trajectory ids are made unique per task so a trajectory never spans two uids.
    return [(s, uid, role, f"{uid}-t{t}") for s, uid, role, t in raw]


@settings(max_examples=60, deadline=None)
@given(batch)
def test_row_mean_advantages_sum_to_zero_per_group(raw: list[tuple[float, str, str, int]]) -> None:
    rows = _rows(raw)
    result = run(rows)
    for group in result.groups:
        if group.singleton:
            continue
        members = [
            a
            for a, (_, uid, role, _) in zip(result.advantages, rows, strict=True)
            if (uid, role) == (group.uid, group.role)
        ]
        assert math.fsum(a for a in members if a is not None) == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(batch)
def test_trajectory_mean_advantages_sum_to_zero_over_trajectories(
    raw: list[tuple[float, str, str, int]],
) -> None:
    rows = _rows(raw)
    result = run(rows, baseline="trajectory_mean")
    for group in result.groups:
        if group.singleton:
            continue
        per_traj: dict[str, list[float]] = {}
        for a, (_, uid, role, traj) in zip(result.advantages, rows, strict=True):
            if (uid, role) == (group.uid, group.role) and a is not None:
                per_traj.setdefault(traj, []).append(a)
        traj_means = [math.fsum(v) / len(v) for v in per_traj.values()]
        assert math.fsum(traj_means) == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(batch, st.randoms(use_true_random=False))
def test_advantages_do_not_depend_on_row_order(
    raw: list[tuple[float, str, str, int]], rng: random.Random
) -> None:
    rows = _rows(raw)
    order = list(range(len(rows)))
    rng.shuffle(order)
    straight = run(rows, normalize_std=True).advantages
    shuffled = run([rows[i] for i in order], normalize_std=True).advantages
    for position, i in enumerate(order):
        assert shuffled[position] == pytest.approx(straight[i], abs=1e-9)
