"""`train.trainable`: LoRA adapters or the top decoder layers in the torch engine (the code the
DeepSpeed engine shares), on the 2-layer test-micro model. Checks what trains, that the loss
falls, that checkpoints are plain Hugging Face weights, that a second engine does not stack
adapters, that a resume continues like the uninterrupted run, and the config's errors."""

from __future__ import annotations

import copy
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("peft", reason="needs peft (pip install 'envace[deepspeed]')")

from envace.config import load_config
from envace.errors import ConfigError
from envace.train.adapters import LoraOptions, Trainable, lora_layers
from envace.train.batch import MicroBatch, TrainRow, make_micro_batches
from envace.train.engine import TorchEngine, load_trainer_state

LORA = Trainable("lora", lora=LoraOptions(r=4, alpha=8))
TARGETS = 7  # q, k, v, o, gate, up, down projections per decoder layer
LR = 1e-2


@pytest.fixture
def model(micro_model: Any) -> Any:
    """A private copy of the session's micro model (adapters are added in place)."""
    return copy.deepcopy(micro_model)


def _batches(pad_id: int) -> list[MicroBatch]:
    """Four fixed rows (ids < 300), two micro-batches."""
    rng = random.Random(3)
    rows = [
        TrainRow(
            [rng.randrange(3, 300) for _ in range(rng.randint(4, 10))],
            [rng.randrange(3, 300) for _ in range(rng.randint(3, 6))],
        )
        for _ in range(4)
    ]
    return make_micro_batches(rows, 2, pad_id)


def _sft_step(engine: TorchEngine, batches: list[MicroBatch]) -> float:
    """One optimizer step of the mean response-token NLL; the loss before the step."""
    total = 0.0
    for mb in batches:
        lp = engine.logprobs(mb)
        loss = -(lp * mb.response_mask).sum() / mb.response_mask.sum() / len(batches)
        engine.backward(loss)
        total += float(loss.detach())
    engine.step()
    return total


def _logits(model: Any, batches: list[MicroBatch]) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return torch.cat([model(input_ids=mb.input_ids).logits.flatten() for mb in batches])


def _base(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" not in n}


def _optimized(engine: TorchEngine) -> set[int]:
    return {id(p) for g in engine.optimizer.param_groups for p in g["params"]}


# --- LoRA -------------------------------------------------------------------------------------
def test_lora_trains_only_the_adapters_and_the_loss_goes_down(
    model: Any, tiny_tokenizer: Any
) -> None:
    engine = TorchEngine(model, LR, trainable=LORA)
    assert engine.model is model  # adapters inside the transformers model, no wrapper
    adapters = {n: p for n, p in model.named_parameters() if ".lora_" in n}
    assert len(adapters) == 2 * TARGETS * 2  # A and B per target, 2 layers
    assert _optimized(engine) == {id(p) for p in adapters.values()}
    before = _base(model)
    batches = _batches(tiny_tokenizer.pad_token_id)
    losses = [_sft_step(engine, batches) for _ in range(6)]
    assert losses[-1] < losses[0] - 0.1, losses
    for name, value in _base(model).items():
        assert torch.equal(value, before[name]), f"{name} changed: a frozen base weight"
    assert all(float(p.detach().abs().sum()) > 0 for n, p in adapters.items() if ".lora_B." in n)


def test_lora_checkpoint_loads_without_peft_and_gives_the_trained_logits(
    model: Any, tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    plain_keys = set(model.state_dict())
    engine = TorchEngine(model, LR, trainable=LORA)
    batches = _batches(tiny_tokenizer.pad_token_id)
    for _ in range(3):
        _sft_step(engine, batches)
    engine.save_model(tmp_path / "ckpt", tiny_tokenizer)
    saved = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert not [k for k in saved if "lora" in k or "base_layer" in k]
    assert set(saved) <= plain_keys
    assert not (tmp_path / "ckpt" / "adapter_config.json").exists()
    monkeypatch.setitem(sys.modules, "peft", None)  # any `import peft` now fails
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    assert not lora_layers(reloaded)
    torch.testing.assert_close(
        _logits(reloaded, batches), _logits(model, batches), rtol=1e-5, atol=1e-5
    )
    # what vLLM would load (push_weights) is the same merged set of weights
    full = engine.full_state_dict()
    for key, tensor in saved.items():
        torch.testing.assert_close(full[key], tensor)


def test_the_hf_backend_generates_with_the_adapters(
    model: Any, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """Static decoder and model.generate run through the adapted layers: greedy outputs equal
    those of the merged checkpoint."""
    from transformers import AutoModelForCausalLM

    from envace.policy.hf_backend import TransformersBackend
    from envace.policy.types import SamplingParams

    engine = TorchEngine(model, 5e-2, trainable=LORA)
    batches = _batches(tiny_tokenizer.pad_token_id)
    for _ in range(3):
        _sft_step(engine, batches)
    engine.save_model(tmp_path / "ckpt", tiny_tokenizer)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    prompts = [[5, 17, 42, 8], [9, 3, 77]]
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    for decode in ("static", "generate"):
        ours = TransformersBackend(model, tiny_tokenizer, decode=decode).generate(prompts, greedy)
        theirs = TransformersBackend(merged, tiny_tokenizer, decode=decode).generate(
            prompts, greedy
        )
        assert [g.token_ids for g in ours] == [g.token_ids for g in theirs], decode


def test_a_second_engine_reuses_the_adapters_instead_of_stacking_them(
    model: Any, tiny_tokenizer: Any
) -> None:
    """The warm start's engine, then RL's on the same model: one set of adapters, trained on."""
    batches = _batches(tiny_tokenizer.pad_token_id)
    warm = TorchEngine(model, LR, trainable=LORA)
    for _ in range(2):
        _sft_step(warm, batches)
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}
    logits = _logits(model, batches)
    flags = [p.requires_grad for p in model.parameters()]
    TorchEngine(model, 1.0)  # a save-only engine (as run.py builds) changes nothing
    assert [p.requires_grad for p in model.parameters()] == flags
    rl = TorchEngine(model, LR, trainable=Trainable("lora", lora=LoraOptions(r=4, alpha=8)))
    layers = lora_layers(model)
    assert len(layers) == 2 * TARGETS
    assert not [n for n, m in layers if lora_layers(m.get_base_layer())]  # none nested
    now = {n: p for n, p in model.named_parameters() if ".lora_" in n}
    assert set(now) == set(adapters) and _optimized(rl) == {id(p) for p in now.values()}
    assert all(torch.equal(now[n], adapters[n]) for n in adapters)
    torch.testing.assert_close(_logits(model, batches), logits)
    # Other options: the old adapters are merged into the weights first (same function).
    other = TorchEngine(
        model, LR, trainable=Trainable("lora", lora=LoraOptions(2, 4, 0.0, ("q_proj",)))
    )
    assert len(lora_layers(model)) == 2 and len(_optimized(other)) == 2 * 2
    torch.testing.assert_close(_logits(model, batches), logits, rtol=1e-5, atol=1e-5)


def test_lora_resume_continues_like_the_uninterrupted_run(
    model: Any, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """Saved: merged weights + the engine state (optimizer, adapters). Resumed on a model
    loaded from the merged checkpoint, the next steps match the uninterrupted ones."""
    from transformers import AutoModelForCausalLM

    batches = _batches(tiny_tokenizer.pad_token_id)
    engine = TorchEngine(model, LR, trainable=LORA)
    for _ in range(2):
        _sft_step(engine, batches)
    engine.save_model(tmp_path / "ckpt", tiny_tokenizer)
    torch.save(engine.state_dict(), tmp_path / "trainer_state.pt")
    uninterrupted = [_sft_step(engine, batches) for _ in range(3)]

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    resumed_engine = TorchEngine(loaded, LR, trainable=LORA)
    resumed_engine.load_state_dict(load_trainer_state(tmp_path / "trainer_state.pt"))
    assert resumed_engine.steps == 2
    resumed = [_sft_step(resumed_engine, batches) for _ in range(3)]
    torch.testing.assert_close(
        torch.tensor(resumed), torch.tensor(uninterrupted), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(
        _logits(loaded, batches), _logits(model, batches), rtol=1e-4, atol=1e-5
    )


def test_resuming_with_another_trainable_setting_is_refused(model: Any, tmp_path: Path) -> None:
    state = TorchEngine(model, LR, trainable=LORA).state_dict()
    plain = copy.deepcopy(model)
    with pytest.raises(ConfigError, match=r"train\.trainable: the checkpoint's optimizer state"):
        TorchEngine(plain, LR, trainable=Trainable("top_layers", top_layers=1)).load_state_dict(
            state
        )


# --- top layers and full ------------------------------------------------------------------------
def test_top_layers_trains_the_last_layers_and_the_final_norm_only(
    model: Any, tiny_tokenizer: Any
) -> None:
    engine = TorchEngine(model, LR, trainable=Trainable("top_layers", top_layers=1))
    decoder = model.get_decoder()
    trained = {id(p) for m in (decoder.layers[1], decoder.norm) for p in m.parameters()}
    assert _optimized(engine) == trained
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batches = _batches(tiny_tokenizer.pad_token_id)
    losses = [_sft_step(engine, batches) for _ in range(4)]
    assert losses[-1] < losses[0]
    for name, p in model.named_parameters():
        changed = not torch.equal(p, before[name])
        should = name.startswith(("model.layers.1.", "model.norm."))
        assert changed == should, f"{name}: changed={changed}"
    # the embeddings are the (tied) LM head: frozen both ways
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_top_layers_beyond_the_model_depth_is_a_config_error(model: Any) -> None:
    with pytest.raises(ConfigError, match=r"train\.top_layers: 3 exceeds the model's 2 decoder"):
        TorchEngine(model, LR, trainable=Trainable("top_layers", top_layers=3))


def test_full_after_lora_merges_the_adapters_back(model: Any, tiny_tokenizer: Any) -> None:
    batches = _batches(tiny_tokenizer.pad_token_id)
    lora = TorchEngine(model, 5e-2, trainable=LORA)
    _sft_step(lora, batches)
    _sft_step(lora, batches)
    logits = _logits(model, batches)
    full = TorchEngine(model, LR, trainable=Trainable())
    assert not lora_layers(model) and not hasattr(model, "peft_config")
    assert _optimized(full) == {id(p) for p in model.parameters()}
    torch.testing.assert_close(_logits(model, batches), logits, rtol=1e-5, atol=1e-5)


def test_lora_targets_that_match_nothing_name_the_layers_there_are(model: Any) -> None:
    bad = Trainable("lora", lora=LoraOptions(target_modules=("query",)))
    with pytest.raises(ConfigError, match=r"target_modules: \['query'\] match no layer.*q_proj"):
        TorchEngine(model, LR, trainable=bad)


# --- config -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["train.trainable=adapters"], r"train\.trainable: 'adapters' is not one of 'full'"),
        (["train.trainable=top_layers"], r"train\.top_layers: null, but .*top_layers: 4"),
        (
            ["train.trainable=top_layers", "train.top_layers=0"],
            r"train\.top_layers: 0 must be >= 1",
        ),
        (
            ["train.top_layers=2"],
            r"train\.top_layers: 2 does nothing with train\.trainable: 'full'",
        ),
        (["train.lora.r=8"], r"train\.lora: \{'r': 8\} does nothing .*set train\.trainable: lora"),
        (["train.trainable=lora", "train.lora.rank=8"], r"train\.lora: unknown key 'rank'"),
        (["train.trainable=lora", "train.lora.r=0"], r"train\.lora: need r >= 1"),
        (["train.trainable=lora", "train.lora.r=2.5"], r"train\.lora: r and alpha must be whole"),
        (
            ["train.trainable=lora", "train.lora.target_modules=q_proj"],
            r"train\.lora\.target_modules: expected a list",
        ),
        (
            ["train.trainable=lora", "train.deepspeed_config.lora.r=8"],
            r"deepspeed_config\.lora is the older spelling .* keep one",
        ),
    ],
)
def test_bad_trainable_settings_name_the_key_and_the_fix(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, sets)


def test_trainable_settings_build_the_engine_options() -> None:
    def spec(*sets: str) -> Trainable:
        return Trainable.from_config(load_config(None, list(sets)))

    assert spec() == Trainable()
    got = spec("train.trainable=lora", "train.lora.r=4", "train.lora.target_modules=[q_proj]")
    assert got == Trainable("lora", lora=LoraOptions(r=4, target_modules=("q_proj",)))
    assert got.lora.scaling == 8.0
    assert spec("train.trainable=lora") == Trainable("lora")  # every LoRA default
    assert spec("train.trainable=top_layers", "train.top_layers=3").top_layers == 3
    # the older spelling, kept as an alias
    assert spec("train.deepspeed_config.lora.r=8") == Trainable("lora", lora=LoraOptions(r=8))
