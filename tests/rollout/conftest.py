"""Tasks and scripted policies for rollout tests (scripted policies play roles; real worlds)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from envace.policy.chat import ChatRenderer
from envace.policy.types import Generation, SamplingParams
from envace.rollout.policies import GenRequest, Policy
from envace.tasks.generate import generate_splits
from envace.tasks.io import task_from_dict
from envace.tasks.model import Task


class ScriptedPolicy(Policy):
    """Answers each request with `script(request)`; tokenised when a renderer is given."""

    def __init__(
        self,
        script: Callable[[GenRequest], str],
        renderer: ChatRenderer | None = None,
        trainable: bool = True,
    ) -> None:
        self.script = script
        self.renderer = renderer
        self.trainable = trainable
        self.requests: list[GenRequest] = []

    def generate(self, requests: Sequence[GenRequest], params: SamplingParams) -> list[Generation]:
        out = []
        for r in requests:
            self.requests.append(r)
            text = self.script(r)
            ids = [*self.renderer.encode(text), self.renderer.eos_id] if self.renderer else []
            out.append(Generation(ids, [0.0] * len(ids), text, "stop"))
        return out


@pytest.fixture(scope="session")
def splits() -> Any:
    return generate_splits(12, 6, seed=5)


@pytest.fixture(scope="session")
def train_tasks(splits: Any) -> list[Task]:
    return [task_from_dict(t) for t in splits.train]


@pytest.fixture(scope="session")
def test_tasks(splits: Any) -> list[Task]:
    return [task_from_dict(t) for t in splits.test]
