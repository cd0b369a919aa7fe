"""Episode reward from turn scores, with hand-computed values."""

from __future__ import annotations

import re

import pytest

from envace.reward.episode import episode_reward


@pytest.mark.parametrize(
    ("scores", "n_turns", "expected"),
    [
        ([1.0, 1.0, 1.0], 3, 1.0),
        ([1.0, 0.5, 0.25], 3, 0.5833333333333334),  # 1.75 / 3
        ([1.0, 0.4], 4, 0.35),  # stopped after turn 2: turns 3 and 4 count 0
        ([0.0], 2, 0.0),  # the first turn was interrupted
        ([], 3, 0.0),  # nothing graded
        ([0.7, 0.2, 0.1], 3, 1.0 / 3),
        ([1.0000000001], 1, 1.0),  # float noise of a weight sum is clamped
    ],
)
def test_episode_reward(scores: list[float], n_turns: int, expected: float) -> None:
    assert episode_reward(scores, n_turns) == pytest.approx(expected, abs=1e-12)


def test_an_unscored_turn_makes_the_episode_unscored() -> None:
    assert episode_reward([1.0, None], 3) is None
    assert episode_reward([None], 1) is None


@pytest.mark.parametrize(
    ("scores", "n_turns", "needle"),
    [
        ([1.0], 0, "n_turns must be >= 1"),
        ([1.0, 1.0, 1.0], 2, "3 turn scores for a task of 2 turns"),
        ([1.5], 2, "must lie in [0, 1]"),
        ([-0.2], 1, "must lie in [0, 1]"),
        ([float("nan")], 1, "must lie in [0, 1]"),
    ],
)
def test_bad_input_is_rejected(scores: list[float], n_turns: int, needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        episode_reward(scores, n_turns)
