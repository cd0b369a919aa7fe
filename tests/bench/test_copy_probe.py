"""bench/copy_probe.py: the copy probe's arithmetic against a model that copies perfectly and
one that cannot, and its CLI on a micro checkpoint (probe + a short drill)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from tests.bench.bench_testlib import load_bench


@pytest.fixture()
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_bench("copy_probe.py", monkeypatch)


class _Copier(torch.nn.Module):
    """Predicts, in a row of two equal halves, the token one half back: a perfect copier."""

    def __init__(self, vocab: int, shift: int = 0) -> None:
        super().__init__()
        self.vocab, self.shift = vocab, shift

    def forward(self, input_ids: torch.Tensor) -> Any:
        length = input_ids.shape[1] // 2
        src = torch.roll(input_ids, shifts=length - 1 + self.shift, dims=1)  # ids[t + 1 - L]
        return SimpleNamespace(logits=torch.nn.functional.one_hot(src, self.vocab).float())


def test_probe_scores_a_copier_1_and_a_shifted_copier_near_chance(bench: ModuleType) -> None:
    vocab = torch.arange(3, 40)
    assert bench.probe(_Copier(40), vocab, length=10) == 1.0
    off_by_one = bench.probe(_Copier(40, shift=1), vocab, length=10)
    assert off_by_one < 0.1  # copying the wrong position is chance (1 / 37), not credit


def test_cli_probes_a_checkpoint_and_drills_a_fresh_model(
    bench: ModuleType, tmp_path: Path
) -> None:
    from envace.policy.tiny import build_tiny_model, build_tokenizer, save_checkpoint

    tok = build_tokenizer(["I am Nimi, PIN 3724. Move 25 dollars to ACC-19e7."] * 4, 300)
    save_checkpoint(build_tiny_model(tok, "test-micro"), tok, tmp_path / "ckpt")
    out = tmp_path / "probe.json"
    args = ["--checkpoint", str(tmp_path / "ckpt"), "--vocab", "16", "--length", "6"]
    drill = ["--train-steps", "4", "--every", "2", "--preset", "test-micro", "--lengths", "4", "8"]
    saved = tmp_path / "drilled"
    assert bench.main([*args, *drill, "--rows", "4", "--save", str(saved), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["vocab"] == 16 and report["chance"] == pytest.approx(1 / 16, abs=1e-4)
    assert 0 <= report["copy_accuracy"] <= 1
    curve = report["drill"]["curve"]
    assert [c["step"] for c in curve] == [2, 4] and all(c["loss"] > 0 for c in curve)
    from envace.policy.hf_backend import load_model_and_tokenizer

    model, saved_tok = load_model_and_tokenizer(str(saved))  # the drilled model, loadable
    assert model.config.hidden_size == 64 and len(saved_tok) == len(tok)
    with pytest.raises(SystemExit, match="--vocab 5000"):
        bench.main([*args[:2], "--vocab", "5000", "--out", str(out)])


def test_value_pieces_are_the_short_letters_and_digits_tokens(bench: ModuleType) -> None:
    from envace.policy.tiny import build_tokenizer

    tok = build_tokenizer(["I am Nimi, PIN 3724. Move 25 dollars to ACC-19e7."] * 4, 300)
    pieces = [tok.decode([int(i)]) for i in bench.drill_vocab(tok, None, max_chars=1)]
    assert {"3", "7", "2", "4", "N", "e"} <= set(pieces)
    assert all(p.isalnum() and len(p) == 1 for p in pieces)
    every = bench.drill_vocab(tok, None)
    assert len(pieces) < len(every)  # punctuation, spaces and longer merges left out
