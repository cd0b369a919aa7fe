"""DeepSpeed ZeRO engine: 2 real processes over gloo (no GPU, no test double) against the
single-process torch engine on the same rows, plus save/resume and failure behaviour.

The ranks are real DeepSpeed processes started by torchrun (the production launcher) or by
`envace.train.distributed.launch`; this file is also their entry point (`python THIS worker`).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("deepspeed", reason="needs deepspeed (pip install 'envace[deepspeed]')")

ROOT = Path(__file__).resolve().parents[2]
LR = 1e-3
MICRO_ROWS = 2
ITERATIONS = 4
SAVE_AFTER = 2  # iterations before the checkpoint the resumed engine starts from
LORA = {"r": 4, "alpha": 8}

# name -> (train.deepspeed_config, gradient checkpointing)
VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "zero2": ({"zero_optimization": {"stage": 2}}, False),
    "zero3": ({"zero_optimization": {"stage": 3}}, False),
    # CPU offload with torch's AdamW (DeepSpeedCPUAdam would be a ~1 min C++ build here),
    # plus per-layer activation checkpointing.
    "zero3_offload_ckpt": (
        {
            "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
            "zero_force_ds_cpu_optimizer": False,
        },
        True,
    ),
    "zero2_lora": ({"zero_optimization": {"stage": 2}, "lora": LORA}, False),
}


def _rows() -> list[Any]:
    """Eight fixed RL rows: random prompts/responses, fixed advantages (ids < 300)."""
    from envace.train.batch import TrainRow

    rng = random.Random(7)
    advantages = [1.0, -0.5, 0.25, -1.0, 0.75, 0.5, -0.25, -0.75]
    return [
        TrainRow(
            [rng.randrange(3, 300) for _ in range(rng.randint(4, 14))],
            [rng.randrange(3, 300) for _ in range(rng.randint(2, 8))],
            advantage=adv,
        )
        for adv in advantages
    ]


def _hot_batch(pad_id: int, temperature: float = 0.5) -> Any:
    """Two of the rows as one micro-batch scored at `temperature` (rollouts sampled at T)."""
    from envace.train.batch import collate

    return collate(_rows()[:2], pad_id, temperature=temperature)


def rl_iteration(engine: Any, rows: Sequence[Any], pad_id: int) -> list[float]:
    """One RL update as RLTrainer._ppo does it (old log-probs, 2 PPO epochs, weighted
    micro-batch losses, one step per epoch); returns [loss, grad_norm] per epoch."""
    from envace.algo.losses import LossConfig, policy_loss
    from envace.train.batch import make_micro_batches

    mbs = make_micro_batches(rows, MICRO_ROWS, pad_id)
    with torch.no_grad():
        old = [engine.logprobs(mb).detach() for mb in mbs]
    out: list[float] = []
    for _ in range(2):
        total = 0.0
        for mb, old_lp in zip(mbs, old, strict=True):
            w = len(mb.rows) / len(rows)
            loss, _ = policy_loss(
                engine.logprobs(mb), old_lp, mb.advantages, mb.response_mask, LossConfig()
            )
            engine.backward(loss * w)
            total += float(loss.detach()) * w
        out += [total, engine.step()]
    return out


# --- rank side --------------------------------------------------------------------------------
def _options(name: str) -> Any:
    from envace.train.adapters import Trainable
    from envace.train.deepspeed_engine import DeepSpeedOptions, split_deepspeed_config

    raw, ckpt = VARIANTS[name]
    ds, lora = split_deepspeed_config(raw)
    trainable = Trainable("lora", lora=lora) if lora is not None else None
    return DeepSpeedOptions(
        lr=LR, ds_config=ds, trainable=trainable, gradient_checkpointing=ckpt, timeout_s=60
    )


def _engine(name: str, path: Path) -> Any:
    from envace.train.deepspeed_engine import DeepSpeedEngine, load_pretrained

    opts = _options(name)
    model = load_pretrained(path, opts)
    torch.manual_seed(0)  # LoRA adapters' init draws from the global generator
    return DeepSpeedEngine(model, opts)


def _run_variant(name: str, init: Path, out: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from envace.train.distributed import all_reduce_mean, dist_info, shard

    info = dist_info()
    tok = AutoTokenizer.from_pretrained(str(init))
    mine = shard(_rows(), info.rank, info.world_size)
    t0 = time.perf_counter()
    engine = _engine(name, init)
    with torch.no_grad():  # every rank the same rows: ZeRO-3 gathers in the forward
        at_half = engine.logprobs(_hot_batch(tok.pad_token_id)).tolist()
    metrics: list[list[float]] = []
    for it in range(ITERATIONS):
        metrics.append(
            [
                all_reduce_mean(v) if i % 2 == 0 else v
                for i, v in enumerate(rl_iteration(engine, mine, tok.pad_token_id))
            ]
        )
        if it + 1 == SAVE_AFTER:
            engine.save_model(out / name / "mid", tok)
    engine.save_model(out / name / "final", tok)
    resumed_engine = _engine(name, out / name / "mid")
    resumed_engine.load_sharded_state(out / name / "mid")
    steps_at_resume = resumed_engine.steps
    resumed = [
        [
            all_reduce_mean(v) if i % 2 == 0 else v
            for i, v in enumerate(rl_iteration(resumed_engine, mine, tok.pad_token_id))
        ]
        for _ in range(SAVE_AFTER, ITERATIONS)
    ]
    return {
        "metrics": metrics,
        "resumed": resumed,
        "steps_at_resume": steps_at_resume,
        "logprobs_t05": at_half,
        "lr": engine.lr,
        "seconds": time.perf_counter() - t0,
    }


def worker(init: Path, out: Path, names: Sequence[str]) -> None:
    from envace.train.distributed import dist_info, shutdown

    results = {name: _run_variant(name, init, out) for name in names}
    if dist_info().is_main:
        (out / "results.json").write_text(json.dumps(results))
    shutdown(120)


def failing_worker(mode: str, out: Path) -> None:
    """rank 1 fails (`raise`) or hangs (`stuck`); rank 0 must exit non-zero on its own."""
    from envace.train.distributed import barrier, dist_info, init_process_group

    try:
        if mode == "stuck":
            info = init_process_group(timeout_s=60)
            if info.rank == 1:
                time.sleep(120)
            barrier("after warm-up", timeout_s=3)
            return
        engine = _engine("zero2", out / "init")
        rows = _rows()[:2]
        rl_iteration(engine, rows[:1] if dist_info().rank == 0 else rows[1:], 0)
        if dist_info().rank == 1:
            raise RuntimeError("rank 1 failed on purpose")
        for _ in range(3):  # rank 0 keeps training: its next collective must fail, not hang
            rl_iteration(engine, rows[:1], 0)
    except BaseException as exc:
        (out / f"rank{dist_info().rank}.err").write_text(f"{type(exc).__name__}: {exc}")
        raise


# --- test side --------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    from tests.helpers.ranks import rank_env

    return rank_env()


@pytest.fixture(scope="module")
def init_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from envace.policy.tiny import build_tiny_model, build_tokenizer, save_checkpoint

    corpus = ["<|im_start|>user\nmove 50 to ACC-2<|im_end|>", "<tool_call>{}</tool_call>"] * 20
    tok = build_tokenizer(corpus, vocab_size=300)
    model = build_tiny_model(tok, "test-micro", seed=0)
    return save_checkpoint(model, tok, tmp_path_factory.mktemp("ds") / "init")


def _torch_reference(init: Path, lora: bool) -> tuple[list[list[float]], dict[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    from envace.train.adapters import LoraOptions, Trainable
    from envace.train.engine import TorchEngine

    model = AutoModelForCausalLM.from_pretrained(str(init))
    torch.manual_seed(0)  # the same adapter init as the ranks'
    trainable = Trainable("lora", lora=LoraOptions(LORA["r"], LORA["alpha"])) if lora else None
    engine = TorchEngine(model, LR, trainable=trainable)
    metrics = [rl_iteration(engine, _rows(), 0) for _ in range(ITERATIONS)]
    return metrics, {k: v.detach().clone() for k, v in engine.full_state_dict().items()}


def _torch_logprobs(init: Path, *temperatures: float) -> list[torch.Tensor]:
    """The torch engine's log-probs of `_hot_batch` on the initial weights, per temperature."""
    from transformers import AutoModelForCausalLM

    from envace.train.engine import TorchEngine

    engine = TorchEngine(AutoModelForCausalLM.from_pretrained(str(init)), LR)
    with torch.no_grad():
        return [engine.logprobs(_hot_batch(0, t)) for t in temperatures]


@pytest.mark.slow
def test_zero2_zero3_two_ranks_match_torch_engine_and_resume_exactly(
    init_checkpoint: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        __file__,
        "worker",
        str(init_checkpoint),
        str(tmp_path),
        *VARIANTS,
    ]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    results = json.loads((tmp_path / "results.json").read_text())
    at_half, at_one = _torch_logprobs(init_checkpoint, 0.5, 1.0)
    assert (at_half - at_one).abs().max() > 0.1  # the temperature changes them
    for name in VARIANTS:
        # the engine scores at the rows' sampling temperature (logits / T), as the torch one
        torch.testing.assert_close(
            torch.tensor(results[name]["logprobs_t05"]), at_half, rtol=1e-4, atol=1e-5
        )
        lora = name.endswith("lora")
        expected, expected_weights = _torch_reference(init_checkpoint, lora)
        got = results[name]
        # Same losses and pre-clip grad norms as one process over all rows, every epoch.
        torch.testing.assert_close(
            torch.tensor(got["metrics"]),
            torch.tensor(expected),
            rtol=2e-4,
            atol=2e-5,
            msg=lambda m, n=name: f"{n}: {m}",  # type: ignore[misc]
        )
        # Epoch 1 of an iteration has ratio 1 (loss = -mean advantage); epoch 2 sees the step.
        assert expected[0][0] == expected[-1][0] != expected[0][2] != expected[-1][2]
        # Resumed from the mid checkpoint == uninterrupted, to float precision.
        assert got["steps_at_resume"] == 2 * SAVE_AFTER
        torch.testing.assert_close(
            torch.tensor(got["resumed"]),
            torch.tensor(got["metrics"][SAVE_AFTER:]),
            rtol=1e-6,
            atol=1e-7,
        )
        # The HF weights gathered at the end (LoRA merged) are the torch engine's weights.
        saved = load_file(str(tmp_path / name / "final" / "model.safetensors"))
        for key, tensor in saved.items():
            torch.testing.assert_close(tensor, expected_weights[key], rtol=1e-4, atol=2e-5)
        assert (tmp_path / name / "final" / "tokenizer.json").exists()
        assert (tmp_path / name / "final" / "deepspeed" / "state").is_dir()


@pytest.mark.slow
def test_a_failing_rank_takes_every_rank_down(init_checkpoint: Path, tmp_path: Path) -> None:
    from envace.train.distributed import launch

    (tmp_path / "init").symlink_to(init_checkpoint, target_is_directory=True)
    argv = [sys.executable, __file__, "fail", "raise", str(tmp_path)]
    res = launch(argv, 2, timeout_s=240, grace_s=120, env=_env(), check=False)
    assert res.returncodes[1] != 0 and res.returncodes[0] != 0
    assert res.stopped == [False, False], "rank 0 had to be killed: it hung"
    assert "failed on purpose" in (tmp_path / "rank1.err").read_text()
    assert (tmp_path / "rank0.err").read_text()  # rank 0 saw its collective fail


@pytest.mark.slow
def test_a_stuck_rank_fails_the_barrier_within_its_timeout(tmp_path: Path) -> None:
    from envace.train.distributed import launch

    argv = [sys.executable, __file__, "fail", "stuck", str(tmp_path)]
    res = launch(argv, 2, timeout_s=120, grace_s=2, env=_env(), check=False)
    assert res.returncodes[0] == 1 and not res.stopped[0]
    assert res.stopped[1]  # the stuck rank was stopped by the launcher, not left running
    err = (tmp_path / "rank0.err").read_text()
    assert "RankFailure" in err and "after warm-up" in err
    assert res.wall_s < 60


@pytest.mark.slow
def test_envace_run_trains_with_the_deepspeed_engine_and_resumes_its_state(tmp_path: Path) -> None:
    """`train.engine: deepspeed` through the main job (a world of one, ZeRO-2): checkpoints
    carry DeepSpeed's state and `--resume` restores it."""
    out = tmp_path / "run"
    sets = [
        "model.preset=test-micro",
        "model.vocab_size=512",
        "model.gradient_checkpointing=true",
        "tasks.n_train=4",
        "tasks.n_test=2",
        "warm_start.enabled=false",
        "rollout.n=2",
        "rollout.batch_tasks=2",
        "rollout.caller_max_new_tokens=12",
        "rollout.simulator_max_new_tokens=12",
        "rollout.max_steps_per_turn=2",
        "train.engine=deepspeed",
        "train.lr=1e-3",
        "train.save_every=1",
        "eval.max_tasks=1",
        "tensorboard=false",
    ]
    base = [sys.executable, "-m", "envace", "run", "--out", str(out)]
    base += [a for kv in sets for a in ("--set", kv)]
    first = subprocess.run(
        [*base, "--set", "train.iterations=1"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode == 0, first.stderr[-4000:]
    ckpt = out / "checkpoints" / "rl" / "iter_000001" / "policy"
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "deepspeed" / "state").is_dir()
    again = subprocess.run(
        [*base, "--set", "train.iterations=2", "--resume"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-4000:]
    assert "resumed RL from" in again.stderr and "at iteration 1" in again.stderr
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in lines if x.strip()] == [1, 2]


def test_deepspeed_config_keys_are_split_and_validated() -> None:
    from envace.errors import ConfigError
    from envace.train.deepspeed_engine import (
        DeepSpeedOptions,
        LoraOptions,
        build_ds_config,
        split_deepspeed_config,
    )

    ds, lora = split_deepspeed_config({"zero_optimization": {"stage": 3}, "lora": {"r": 8}})
    assert ds == {"zero_optimization": {"stage": 3}}
    assert lora == LoraOptions(r=8) and lora.scaling == 4.0
    cfg = build_ds_config(DeepSpeedOptions(lr=1e-5, grad_clip=0.5, ds_config=ds), 4, False)
    assert cfg["zero_optimization"] == {"stage": 3}
    assert cfg["gradient_clipping"] == 0.5 and cfg["train_batch_size"] == 4
    assert cfg["managed_gradient_accumulation"] is False and cfg["bf16"] == {"enabled": False}
    with pytest.raises(ConfigError, match=r"deepspeed_config\.optimizer: .*train\.lr"):
        split_deepspeed_config({"optimizer": {"type": "Adam"}})
    with pytest.raises(ConfigError, match=r"zero_optimization\.stage"):
        split_deepspeed_config({"zero_optimization": {"stage": 4}})
    with pytest.raises(ConfigError, match=r"lora: unknown key 'rank'"):
        split_deepspeed_config({"lora": {"rank": 8}})


@pytest.mark.parametrize("key", ["collective_timeout_s", "cpu_shm_comm", "compile_layers"])
def test_envace_keys_in_the_deepspeed_json_name_their_typed_section(key: str) -> None:
    """EnvACE's own keys moved from train.deepspeed_config to train.deepspeed: the config is
    refused at load time, naming the new key, before anything is written."""
    from envace.config import load_config
    from envace.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"deepspeed_config\.{key}: .*train\.deepspeed\.{key}"):
        load_config(None, [f"train.deepspeed_config={{{key}: 1}}"])


def test_the_typed_deepspeed_section_reaches_the_engine_options() -> None:
    from envace.config import load_config
    from envace.errors import ConfigError
    from envace.train.deepspeed_engine import DeepSpeedOptions

    sets = ["train.deepspeed.collective_timeout_s=90", "train.deepspeed.compile_layers=true"]
    opts = DeepSpeedOptions.from_config(load_config(None, sets))
    assert (opts.timeout_s, opts.compile_layers, opts.cpu_shm_comm) == (90.0, True, False)
    assert DeepSpeedOptions.from_config(load_config(None)).timeout_s == 1800.0
    with pytest.raises(ConfigError, match=r"train\.deepspeed\.collective_timeout_s: 0\.0 must"):
        load_config(None, ["train.deepspeed.collective_timeout_s=0"])
    with pytest.raises(ConfigError, match=r"train\.deepspeed\.compile_layers: expected true"):
        load_config(None, ["train.deepspeed.compile_layers=1"])


def test_merge_lora_state_dict_adds_the_scaled_low_rank_update() -> None:
    from envace.train.deepspeed_engine import merge_lora_state_dict

    w, a, b = torch.randn(3, 4), torch.randn(2, 4), torch.randn(3, 2)
    sd = {
        "base_model.model.layer.q_proj.base_layer.weight": w,
        "base_model.model.layer.q_proj.lora_A.default.weight": a,
        "base_model.model.layer.q_proj.lora_B.default.weight": b,
        "base_model.model.norm.weight": torch.ones(4),
    }
    merged = merge_lora_state_dict(sd, scaling=0.5)
    assert set(merged) == {"layer.q_proj.weight", "norm.weight"}
    torch.testing.assert_close(merged["layer.q_proj.weight"], w + 0.5 * b @ a)


def test_shard_gives_every_rank_the_same_number_of_items() -> None:
    from envace.train.distributed import dist_info, shard

    items = list(range(7))
    assert [shard(items, r, 3) for r in range(3)] == [[0, 3], [1, 4], [2, 5]]
    info = dist_info({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_PORT": "29500"})
    assert (info.rank, info.world_size, info.is_main, info.master_port) == (1, 2, False, 29500)


if __name__ == "__main__":
    # Entry point of the ranks: `worker INIT OUT NAMES...` or `fail MODE OUT`.
    import logging

    logging.basicConfig(level=logging.WARNING)
    if sys.argv[1] == "worker":
        worker(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:])
    else:
        failing_worker(sys.argv[2], Path(sys.argv[3]))
