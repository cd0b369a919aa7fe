"""The episode reward: what every training row of a trajectory is credited with."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["episode_reward"]

# Weighted sums of floats can land a hair outside [0, 1]; anything further out is a bug.
_TOLERANCE = 1e-6


def episode_reward(turn_scores: Sequence[float | None], n_turns: int) -> float | None:
    """Sum of the graded turns' scores over the number of reference turns, in [0, 1].

    turn_scores: one score in [0, 1] per turn the episode reached, in order; an interrupted
        turn is 0. Turns never reached are simply absent and count 0, so an episode that stops
        early (a required item failed, a malformed output) earns less.
    n_turns: the task's number of user turns (the denominator, whatever was reached).

    Returns None when any turn is unscored (its judge failed): the trajectory must then be
    masked out of training, not credited with a made-up 0.
    """
    if n_turns < 1:
        raise ValueError(f"n_turns must be >= 1, got {n_turns}")
    if len(turn_scores) > n_turns:
        raise ValueError(f"{len(turn_scores)} turn scores for a task of {n_turns} turns")
    if any(score is None for score in turn_scores):
        return None
    scores = [float(s) for s in turn_scores if s is not None]
    bad = [s for s in scores if not -_TOLERANCE <= s <= 1 + _TOLERANCE]
    if bad:
        raise ValueError(f"turn scores must lie in [0, 1], got {bad}")
    return min(1.0, max(0.0, sum(scores) / n_turns))
