"""The pipeline's train step on 2 ranks, started exactly as a TrainJob starts it
(`torchrun --no-python envace pipeline train-step ...`), with the DeepSpeed engine (ZeRO-2,
2 real processes over gloo; no GPU, no test double).

Two rounds through the store: each rank uploads its own DeepSpeed shard and rank 0 commits the
manifest over all of them; round 2 restores every rank's shard from round 1's checkpoint. The
result equals two updates in one process with the torch engine (losses, gradient norms,
weights), to float tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from envace import stages
from envace.config import load_config
from envace.errors import ConfigError
from envace.policy.hf_backend import load_model_and_tokenizer
from envace.storage.artifacts import verify
from tests.helpers.ranks import rank_env, run_ranks, torchrun
from tests.pipelines.test_stages import _in_process_updates, _rows, _store_rows

pytest.importorskip("deepspeed", reason="needs deepspeed (pip install 'envace[deepspeed]')")

DS_CONFIG = '{"zero_optimization": {"stage": 2}}'


def test_train_step_on_two_ranks_commits_every_shard_and_equals_one_process(
    tmp_path: Path, micro: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 1: the TrainJob's command under torchrun. Round 2: `stages.train(processes=2)`,
    what the pipeline's train step does in a pod with several GPUs."""
    for key, value in rank_env().items():
        monkeypatch.setenv(key, value)
    sets = [*micro, "warm_start.enabled=false", "train.lr_schedule=cosine", "train.lr=1e-2"]
    store = str(tmp_path / "store")
    prepared = stages.prepare(load_config(None, sets), store)
    cfg = load_config(None, [*sets, "train.engine=deepspeed"])
    cfg.train.deepspeed_config = json.loads(DS_CONFIG)
    cfg.train.deepspeed.collective_timeout_s = 120
    config_file = tmp_path / "config.yaml"
    config_file.write_text(stages.config_text(cfg))
    _model, tokenizer = load_model_and_tokenizer(prepared.checkpoint_uri)
    rows = _rows(tokenizer)
    layout = stages.RunLayout(store, "ranks")
    checkpoint, results = prepared.checkpoint_uri, []
    for it in range(2):
        rows_uri = _store_rows(rows, checkpoint, layout.rollout(it), tmp_path / f"rows{it}")
        out = layout.checkpoint(it)
        if it == 0:
            args = stages.train_step_args(checkpoint, rows_uri, out, 2)
            cmd = torchrun("--no-python", "envace", "pipeline", "train-step")
            proc = run_ranks([*cmd, "--config", str(config_file), *args])
            assert proc.returncode == 0, proc.stderr[-6000:]
            log = proc.stderr
        else:
            lines: list[str] = []
            trained = stages.train(
                cfg, checkpoint, rows_uri, out, total_iterations=2, processes=2, emit=lines.append
            )
            assert trained.uri == out
            log = "\n".join(lines)
        assert "DeepSpeed engine: ZeRO-2, 2 rank(s)" in log
        files = {e.path for e in verify(out, deep=True).files}
        for rank in (0, 1):  # each rank's shard made it into the committed checkpoint
            shard = f"policy/deepspeed/state/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
            assert shard in files
        assert {"policy/model.safetensors", "trainer_state.pt", "train_metrics.json"} <= files
        results.append(json.loads((Path(out) / "train_metrics.json").read_text()))
        checkpoint = out
    expected_model, expected = _in_process_updates(
        load_config(None, sets), prepared.checkpoint_uri, rows, 2
    )
    assert results[0] != results[1] and expected[0]["policy/grad_norm"] > 0
    for got, want in zip(results, expected, strict=True):
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=2e-4, abs=2e-5), key
    # Each Adam step moves a weight by up to lr (1e-2); where a gradient is ~0, Adam's
    # normalisation turns float-order differences into ~1e-5 weight differences: atol 1e-4.
    stored, _ = load_model_and_tokenizer(Path(checkpoint) / "policy")
    for (name, want_t), got_t in zip(
        expected_model.state_dict().items(), stored.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(
            got_t, want_t, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}"
        )
    state = torch.load(Path(checkpoint) / "trainer_state.pt", weights_only=False)
    assert state["iteration"] == 2 and state["engines"]["policy"]["steps"] == 2


def test_local_ranks_need_deepspeed_and_report_their_failure(
    tmp_path: Path, micro: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in rank_env().items():
        monkeypatch.setenv(key, value)
    store = tmp_path / "store"
    with pytest.raises(ConfigError, match=r"needs train\.engine: deepspeed"):
        stages.train(load_config(None, micro), "c", "r", str(store / "o"), processes=2)
    cfg = load_config(None, [*micro, "train.engine=deepspeed"])
    missing = str(store / "no-such-rows")
    with pytest.raises(stages.StageError, match=r"2 ranks failed \(exit 1\)") as err:
        stages.train(cfg, str(store / "ckpt"), missing, str(store / "out"), processes=2)
    assert "no-such-rows" in str(err.value)  # the ranks' own error, in the last lines
    assert not (store / "out").exists()
