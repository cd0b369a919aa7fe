"""A standing fuzz suite for task files: random mutations of valid tasks either are refused
with the project's clear error (TaskFormatError, a UserInputError) or load, and a task that
loads runs under every scripted policy of `envace evaluate` (oracle, random, empty) and
round-trips through a written file, without any other exception and in bounded time.

The mutations aim at what broke before: values of the wrong JSON type, integers written as
floats, numbers at the edges of a double, lone surrogates, newlines in names, deep nesting,
schemas with remote, recursive or dangling $refs, empty enums, boolean sub-schemas,
backtracking patterns, broken JSON text.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envace.errors import UserInputError
from envace.evaluate.bfcl.policies import EmptyPolicy
from envace.evaluate.runner import evaluate_policy
from envace.rollout.engine import RolloutConfig
from envace.rollout.policies import OraclePolicy, RandomPolicy
from envace.tasks.generate import write_splits
from envace.tasks.io import task_to_dict, write_tasks_jsonl
from envace.tasks.loader import TaskFormatError, load_tasks
from tests.helpers.mutations import FUZZ_SETTINGS, mutate

FIXTURES = Path(__file__).parents[1] / "tasks" / "fixtures"
CONFIG = RolloutConfig(max_steps_per_turn=3)


def _pool() -> list[dict[str, Any]]:
    """Valid tasks of every kind: generated ones in each world, hand-written ones without."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        written = write_splits(Path(folder), n_train=2, n_test=4, seed=7)
        lines = written["test"].read_text("utf-8").splitlines()
        lines += written["train"].read_text("utf-8").splitlines()
    lines += (FIXTURES / "valid_tasks.jsonl").read_text("utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


POOL = _pool()


@st.composite
def _mutated_line(draw: st.DrawFn) -> str:
    data = mutate(draw, copy.deepcopy(draw(st.sampled_from(POOL))))
    line = json.dumps(data, ensure_ascii=draw(st.booleans()))
    if draw(st.integers(0, 9)) == 0:  # now and then, break the JSON text itself
        at = draw(st.integers(0, len(line)))
        line = line[:at] + draw(st.sampled_from(["", "}", '"', ",", "NaN", "1e-400", "\\"]))
    return line


def _runs_cleanly(path: Path, tmp: Path) -> None:
    try:
        tasks = load_tasks(path).tasks
    except TaskFormatError as err:
        assert "\n" not in str(err) and str(err).startswith(str(path))
        return
    for policy in (OraclePolicy(), RandomPolicy(seed=3), EmptyPolicy()):
        try:
            result = evaluate_policy(policy, tasks, CONFIG)
        except UserInputError:
            continue  # a clear error (a task without an environment), never a traceback
        assert len(result.trajectories) == len(tasks)
    write_tasks_jsonl(tmp / "again.jsonl", tasks)
    again = load_tasks(tmp / "again.jsonl").tasks
    assert [task_to_dict(t) for t in again] == [task_to_dict(t) for t in tasks]


@pytest.mark.timeout(120)
@FUZZ_SETTINGS
@given(line=_mutated_line())
def test_a_mutated_task_is_refused_clearly_or_runs(tmp_path: Path, line: str) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_text(line + "\n", encoding="utf-8", errors="surrogatepass")
    _runs_cleanly(path, tmp_path)


def test_every_task_of_the_pool_is_valid_and_runs(tmp_path: Path) -> None:
    """The seeds of the mutations load and run (else the suite would fuzz only refusals)."""
    path = tmp_path / "pool.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in POOL), encoding="utf-8")
    tasks = load_tasks(path).tasks
    assert len(tasks) == len(POOL)
    in_worlds = [t for t in tasks if t.environment is not None]
    assert {t.environment.name for t in in_worlds if t.environment} == {
        "bank",
        "files",
        "inventory",
    }
    assert evaluate_policy(OraclePolicy(), in_worlds, RolloutConfig()).metrics.success_rate == 1.0
