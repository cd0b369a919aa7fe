"""bench/rl_drift.py: weight drift against a known perturbation of a micro checkpoint, the
end-of-turn pull against a model that always ends its turn and one that never does, and the
CLI end to end (with a clear error for a file that is not a task file)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from tests.bench.bench_testlib import load_bench

TEXT = ["I am Nimi, PIN 3724. Move 25 dollars to ACC-19e7.<|im_end|>"] * 4


@pytest.fixture()
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_bench("rl_drift.py", monkeypatch)


def _records(n: int) -> list[dict[str, Any]]:
    from envace.tasks.generate import generate_splits

    return list(generate_splits(n, n, 0).test)[:n]


def _tasks(n: int) -> list[Any]:
    from envace.tasks.io import task_from_dict

    return [task_from_dict(r) for r in _records(n)]


class _Ender(torch.nn.Module):
    """Puts all its probability on one token at every position."""

    def __init__(self, vocab: int, token: int) -> None:
        super().__init__()
        self.vocab, self.token = vocab, token

    def forward(self, input_ids: torch.Tensor) -> Any:
        logits = torch.zeros(*input_ids.shape, self.vocab)
        logits[..., self.token] = 50.0
        return SimpleNamespace(logits=logits)


def test_pull_is_1_for_a_model_that_ends_its_turn_and_0_for_one_that_does_not(
    bench: ModuleType,
) -> None:
    from envace.policy.tiny import build_tokenizer

    tok = build_tokenizer(TEXT, 300)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    tasks = _tasks(3)
    ends = bench.first_token_pull(_Ender(len(tok), eos), tok, tasks, "compact")
    assert ends["tasks"] == 3 and ends["greedy_end_first"] == 3
    assert ends["p_end_first"] == pytest.approx(1.0)
    other = bench.first_token_pull(_Ender(len(tok), eos + 1), tok, tasks, "full")
    assert other["greedy_end_first"] == 0 and other["p_end_first"] < 1e-6
    assert other["greedy_first_tokens"] == {tok.decode([eos + 1]): 3}


def test_drift_measures_a_known_change_of_one_layer(bench: ModuleType) -> None:
    before = {
        "model.layers.0.mlp.up_proj.weight": torch.ones(4, 8),
        "model.layers.0.mlp.down_proj.weight": torch.ones(8, 4),
        "model.layers.1.mlp.up_proj.weight": torch.ones(4, 8),
        "model.norm.weight": torch.ones(4),
    }
    after = {k: v.clone() for k, v in before.items()}
    after["model.layers.0.mlp.up_proj.weight"] += 0.003  # 32 weights by 0.003
    after["model.layers.0.mlp.down_proj.weight"][0, 0] -= 0.01  # 1 of 32 weights by 0.01
    drift = bench.weight_drift(before, after)
    assert set(drift["groups"]) == {"layers.0"}  # unchanged tensors are left out
    layer = drift["groups"]["layers.0"]
    d2 = 32 * 0.003**2 + 0.01**2
    assert layer["weights"] == 64 and drift["changed_weights"] == 64
    assert layer["rms_change"] == pytest.approx(math.sqrt(d2 / 64), rel=1e-4)
    assert layer["relative_change"] == pytest.approx(math.sqrt(d2 / 64), rel=1e-4)  # |W| = 1s
    assert layer["max_change"] == pytest.approx(0.01, rel=1e-4)
    with pytest.raises(SystemExit, match="different tensors"):
        bench.weight_drift(before, {"model.norm.weight": torch.ones(4)})


def test_cli_compares_checkpoints_and_names_a_bad_task_file(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from envace.policy.tiny import build_tiny_model, build_tokenizer, save_checkpoint

    tok = build_tokenizer(TEXT, 300)
    torch.manual_seed(0)
    model = build_tiny_model(tok, "test-micro")
    save_checkpoint(model, tok, tmp_path / "before")
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.add_(1e-2)
    save_checkpoint(model, tok, tmp_path / "after")
    tasks = tmp_path / "test.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in _records(2)))
    out = tmp_path / "drift.json"
    args = ["--before", str(tmp_path / "before"), "--after", str(tmp_path / "after")]
    assert bench.main([*args, "--tasks", str(tasks), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    entry = report["after"][str(tmp_path / "after")]
    assert set(entry["drift"]["groups"]) == {"layers.1"}
    assert entry["drift"]["rms_change"] == pytest.approx(1e-2, rel=1e-3)
    for pull in (report["before_pull"], entry["pull"]):
        assert pull["tasks"] == 2 and 0.0 <= pull["p_end_first"] <= 1.0
        assert sum(pull["greedy_first_tokens"].values()) == 2
    assert "p(<|im_end|> first)" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    with pytest.raises(SystemExit, match=r"bad\.jsonl:1 \(id=x\): tools"):
        bench.main([*args, "--tasks", str(bad)])
