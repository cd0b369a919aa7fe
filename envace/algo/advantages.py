"""Role-wise GRPO advantages on plain sequences (pure Python: no torch, no numpy).

Every training row (one generation of the caller or the simulator) carries a score (the reward of
its trajectory, possibly minus the empty-response penalty, or None when the judge failed), the task
`uid` shared by the n rollouts of a task, its role, and its trajectory id. Rows are grouped by
(uid, role): the two roles never share a baseline, and neither do two tasks.

    A_i = (r_i - b_g) / s_g        s_g = 1 unless normalize_std (then std_g + eps)

See docs/algorithm.md for the formulas, the options and which reference quirks are kept or fixed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "AdvantageResult",
    "Baseline",
    "GroupStats",
    "RoleStats",
    "Singleton",
    "apply_empty_penalty",
    "compute_advantages",
]

Baseline = Literal["row_mean", "trajectory_mean"]
"""row_mean: mean over the group's scored rows (reference). trajectory_mean: mean of per-trajectory
means, so every trajectory weighs the same whatever its number of rows."""

Singleton = Literal["zero_baseline", "zero_advantage"]
"""What a group with a single sample gets. zero_baseline (reference): b = 0 and s = 1, so A = r.
zero_advantage: A = 0, the row carries no learning signal."""

GroupKey = tuple[str, str]  # (uid, role)


@dataclass(frozen=True)
class GroupStats:
    """One (uid, role) group with at least one scored row.

    row_mean and trajectory_mean are both computed whatever the chosen baseline, for logging.
    baseline and scale are what was applied: A = (r - baseline) / scale.
    """

    uid: str
    role: str
    num_rows: int
    num_trajectories: int
    row_mean: float
    trajectory_mean: float
    baseline: float
    scale: float
    singleton: bool


@dataclass(frozen=True)
class RoleStats:
    """Per-role summary. advantage_mean/std are over the role's scored rows (population std)."""

    role: str
    num_rows: int
    num_unscored: int
    num_groups: int
    num_singleton_groups: int
    advantage_mean: float
    advantage_std: float
    mean_row_mean_baseline: float
    mean_trajectory_mean_baseline: float


@dataclass(frozen=True)
class AdvantageResult:
    """Advantages aligned with the input rows (None for unscored rows) and statistics to log."""

    advantages: list[float | None]
    groups: tuple[GroupStats, ...]
    per_role: dict[str, RoleStats]
    num_unscored: int

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def num_singleton_groups(self) -> int:
        return sum(g.singleton for g in self.groups)

    def metrics(self, prefix: str = "adv") -> dict[str, float]:
        """Flat scalars for a metrics logger, e.g. `adv/caller/mean`."""
        out: dict[str, float] = {
            f"{prefix}/num_groups": float(self.num_groups),
            f"{prefix}/num_singleton_groups": float(self.num_singleton_groups),
            f"{prefix}/num_unscored": float(self.num_unscored),
        }
        for role, stats in sorted(self.per_role.items()):
            key = f"{prefix}/{role}"
            out[f"{key}/rows"] = float(stats.num_rows)
            out[f"{key}/unscored"] = float(stats.num_unscored)
            out[f"{key}/groups"] = float(stats.num_groups)
            out[f"{key}/singleton_groups"] = float(stats.num_singleton_groups)
            out[f"{key}/mean"] = stats.advantage_mean
            out[f"{key}/std"] = stats.advantage_std
            out[f"{key}/baseline_row_mean"] = stats.mean_row_mean_baseline
            out[f"{key}/baseline_trajectory_mean"] = stats.mean_trajectory_mean_baseline
        return out


def apply_empty_penalty(
    scores: Sequence[float | None], valid_flags: Sequence[bool], penalty: float = 0.1
) -> list[float | None]:
    """Subtract `penalty` from the score of every row whose response is empty or invalid.

    The reference's invalid-action penalty (verl-agent, coefficient 0.1). Unscored rows (None) stay
    None: a row the judge could not score is masked, not penalised.
    """
    _check_lengths(scores=scores, valid_flags=valid_flags)
    if not (math.isfinite(penalty) and penalty >= 0):
        raise ValueError(
            f"empty-response penalty must be a finite number >= 0 (it is subtracted), got {penalty}"
        )
    return [
        None if score is None else (score if valid else score - penalty)
        for score, valid in zip(scores, valid_flags, strict=True)
    ]


def compute_advantages(
    scores: Sequence[float | None],
    uids: Sequence[str],
    roles: Sequence[str],
    traj_ids: Sequence[str],
    *,
    baseline: Baseline = "row_mean",
    normalize_std: bool = False,
    singleton: Singleton = "zero_baseline",
    eps: float = 1e-6,
) -> AdvantageResult:
    """Role-wise GRPO advantages, one per row, grouped by (uid, role).

    scores[i] None marks an unscored row (failed judge): it is left out of its group's baseline
    and std and gets advantage None, which the trainer masks. No row is ever duplicated.

    A group is a singleton when its baseline averages a single value: one scored row (row_mean)
    or one scored trajectory (trajectory_mean). `singleton` decides what it gets.
    With normalize_std, A = (r - b) / (std + eps), std the unbiased (n - 1) std of the values the
    baseline averages (rows, or per-trajectory means); singletons use a scale of 1.
    """
    _check_lengths(scores=scores, uids=uids, roles=roles, traj_ids=traj_ids)
    _check_options(baseline, singleton, eps)
    _check_scores(scores)
    _check_trajectories(uids, traj_ids)

    groups = _scored_groups(scores, uids, roles)
    advantages: list[float | None] = [None] * len(scores)
    group_stats: list[GroupStats] = []
    for (uid, role), rows in groups.items():
        stats = _group_stats(uid, role, rows, scores, traj_ids, baseline, normalize_std, eps)
        group_stats.append(stats)
        for i in rows:
            advantages[i] = _advantage(_score(scores, i), stats, singleton)
    return AdvantageResult(
        advantages=advantages,
        groups=tuple(group_stats),
        per_role=_role_stats(advantages, roles, group_stats),
        num_unscored=sum(s is None for s in scores),
    )


def _advantage(score: float, stats: GroupStats, singleton: Singleton) -> float:
    if stats.singleton and singleton == "zero_advantage":
        return 0.0
    return (score - stats.baseline) / stats.scale


def _scored_groups(
    scores: Sequence[float | None], uids: Sequence[str], roles: Sequence[str]
) -> dict[GroupKey, list[int]]:
    """Indices of the scored rows of every (uid, role), in first-seen order."""
    groups: dict[GroupKey, list[int]] = {}
    for i, score in enumerate(scores):
        if score is not None:
            groups.setdefault((uids[i], roles[i]), []).append(i)
    return groups


def _group_stats(
    uid: str,
    role: str,
    rows: list[int],
    scores: Sequence[float | None],
    traj_ids: Sequence[str],
    baseline: Baseline,
    normalize_std: bool,
    eps: float,
) -> GroupStats:
    row_values = [_score(scores, i) for i in rows]
    traj_values = _trajectory_means(rows, scores, traj_ids)
    values = _BASELINE_VALUES[baseline](row_values, traj_values)
    is_singleton = len(values) == 1
    # Reference (verl GRPO): a lone sample has nothing to compare to, so b = 0 and sigma = 1.
    if is_singleton:
        center, scale = 0.0, 1.0
    else:
        center = _mean(values)
        scale = _unbiased_std(values) + eps if normalize_std else 1.0
    return GroupStats(
        uid=uid,
        role=role,
        num_rows=len(rows),
        num_trajectories=len(traj_values),
        row_mean=_mean(row_values),
        trajectory_mean=_mean(traj_values),
        baseline=center,
        scale=scale,
        singleton=is_singleton,
    )


def _trajectory_means(
    rows: list[int], scores: Sequence[float | None], traj_ids: Sequence[str]
) -> list[float]:
    """Mean scored-row score of each trajectory of the group, in first-seen order."""
    per_traj: dict[str, list[float]] = {}
    for i in rows:
        per_traj.setdefault(traj_ids[i], []).append(_score(scores, i))
    return [_mean(v) for v in per_traj.values()]


# Which values the baseline (and the std) averages, by baseline name.
_BASELINE_VALUES: dict[str, Callable[[list[float], list[float]], list[float]]] = {
    "row_mean": lambda rows, trajectories: rows,
    "trajectory_mean": lambda rows, trajectories: trajectories,
}


def _role_stats(
    advantages: list[float | None], roles: Sequence[str], groups: list[GroupStats]
) -> dict[str, RoleStats]:
    out: dict[str, RoleStats] = {}
    for role in dict.fromkeys(roles):
        values = [a for a, r in zip(advantages, roles, strict=True) if r == role and a is not None]
        role_groups = [g for g in groups if g.role == role]
        out[role] = RoleStats(
            role=role,
            num_rows=len(values),
            num_unscored=sum(r == role for r in roles) - len(values),
            num_groups=len(role_groups),
            num_singleton_groups=sum(g.singleton for g in role_groups),
            advantage_mean=_mean(values) if values else 0.0,
            advantage_std=_population_std(values) if values else 0.0,
            mean_row_mean_baseline=_mean([g.row_mean for g in role_groups]) if role_groups else 0.0,
            mean_trajectory_mean_baseline=(
                _mean([g.trajectory_mean for g in role_groups]) if role_groups else 0.0
            ),
        )
    return out


def _score(scores: Sequence[float | None], i: int) -> float:
    score = scores[i]
    if score is None:  # callers only pass scored indices; this guards the invariant
        raise AssertionError(f"row {i} is unscored but was used in a baseline")
    return score


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _unbiased_std(values: Sequence[float]) -> float:
    center = _mean(values)
    return math.sqrt(math.fsum((v - center) ** 2 for v in values) / (len(values) - 1))


def _population_std(values: Sequence[float]) -> float:
    center = _mean(values)
    return math.sqrt(math.fsum((v - center) ** 2 for v in values) / len(values))


def _check_lengths(**columns: Sequence[object]) -> None:
    lengths = {name: len(col) for name, col in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"per-row inputs must have one entry per row, got lengths {lengths}; "
            "build them from the same list of rows"
        )


def _check_options(baseline: str, singleton: str, eps: float) -> None:
    if baseline not in get_args(Baseline):
        raise ValueError(f"baseline={baseline!r} is unknown; use one of {get_args(Baseline)}")
    if singleton not in get_args(Singleton):
        raise ValueError(f"singleton={singleton!r} is unknown; use one of {get_args(Singleton)}")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite number > 0 (it keeps std + eps nonzero), got {eps}")


def _check_scores(scores: Sequence[float | None]) -> None:
    for i, score in enumerate(scores):
        if score is not None and not math.isfinite(score):
            raise ValueError(
                f"score of row {i} is {score}; scores must be finite "
                "(use None for a row the judge could not score)"
            )


def _check_trajectories(uids: Sequence[str], traj_ids: Sequence[str]) -> None:
    """A trajectory belongs to one task: a trajectory id under two uids is a bookkeeping bug."""
    owner: dict[str, str] = {}
    for i, (uid, traj) in enumerate(zip(uids, traj_ids, strict=True)):
        first = owner.setdefault(traj, uid)
        if first != uid:
            raise ValueError(
                f"trajectory {traj!r} appears under uid {first!r} and, at row {i}, uid {uid!r}; "
                "every trajectory id must belong to a single task uid"
            )
