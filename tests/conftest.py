"""Shared fixtures. Tests mirror the package: tests/<module>/test_*.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.helpers.mlflow_server import Server

# Keep torch from oversubscribing the 2 CI cores when several workers run.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests need CUDA: skip them, saying so, on machines without one."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip = pytest.mark.skipif(not has_cuda, reason="needs a CUDA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_CORPUS = [
    "<|im_start|>user\nMove 50 dollars from ACC-1 to ACC-2<|im_end|>\n<|im_start|>assistant\n"
    '<tool_call>\n{"name": "transfer", "arguments": {"amount": 50, "to": "ACC-2"}}\n</tool_call>'
    "<|im_end|>\n",
    '<tool_response>\n{"ok":true,"balance":120}\n</tool_response>',
    '<execution_result>\n{"status": "ok", "id": "ORD-7"}\n</execution_result>',
    "Candidate tools (whitelist): Current conversation history: User: Assistant: Tool[",
    "You are a precise tool simulator. # Tools You may call one or more functions",
]


@pytest.fixture(scope="session")
def tiny_tokenizer():  # type: ignore[no-untyped-def]
    """A byte-level BPE tokenizer trained in ~1 s with the project's chat template."""
    from envace.policy.tiny import build_tokenizer

    return build_tokenizer(_CORPUS * 20, vocab_size=600)


@pytest.fixture(scope="session")
def micro_model(tiny_tokenizer):  # type: ignore[no-untyped-def]
    """A randomly initialised 2-layer Qwen3 model (the `test-micro` preset)."""
    from envace.policy.tiny import build_tiny_model

    return build_tiny_model(tiny_tokenizer, "test-micro", seed=0)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One real MLflow tracking server (basic auth, sqlite) for the session: each test logs into
    an experiment of its own name."""
    from tests.helpers.mlflow_server import serve_mlflow

    with serve_mlflow(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server


@pytest.fixture
def mlflow_credentials(mlflow_server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The server's admin credentials in the environment (as a Secret would put them)."""
    from tests.helpers.mlflow_server import USER

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", mlflow_server.password)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return mlflow_server


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ENVACE_CACHE folder holding SmolLM2-135M-Instruct converted from the wheel's GGUF
    (once a session: the conversion is the slow part of every test that loads the real model)."""
    from envace.policy import pretrained

    cache = tmp_path_factory.mktemp("envace-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENVACE_CACHE", str(cache))
        pretrained.ensure_smollm2()
    return cache
