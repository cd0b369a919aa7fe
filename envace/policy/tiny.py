"""The embedded default model: a tiny Qwen3-architecture model and a tokenizer trained here.

No hub download is possible (or wanted) on a laptop smoke run, so the project trains a byte-level
BPE tokenizer on its own synthetic corpus and initialises a small `Qwen3ForCausalLM` from a config.
Both are saved with the standard `save_pretrained` API: everything downstream loads them with
`AutoTokenizer` / `AutoModelForCausalLM`, exactly as it would load Qwen/Qwen3-8B.

The tokenizer carries a chat template in the Qwen3 tool-calling format (tools in a `<tools>` block
of the system message, `<tool_call>` / `<tool_response>` blocks), so prompts rendered for the tiny
model and for a real Qwen3 checkpoint have the same shape.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "ADDED_TOKENS",
    "MODEL_PRESETS",
    "SPECIAL_TOKENS",
    "TinyModelPreset",
    "build_tiny_model",
    "build_tokenizer",
    "chat_template",
    "corpus_min_frequency",
]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Tags stay visible after decoding (skip_special_tokens keeps them), as in Qwen3's tokenizer.
ADDED_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<execution_result>",
    "</execution_result>",
)


@dataclass(frozen=True)
class TinyModelPreset:
    """Shape of a tiny Qwen3 model. Parameter counts assume a 4,096-token vocabulary."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int = 4096


MODEL_PRESETS: dict[str, TinyModelPreset] = {
    # ~4.2 M parameters: the CPU smoke-run default (see MEASUREMENTS.md for its speed).
    "tiny-4m": TinyModelPreset(256, 4, 4, 2, 768),
    # ~12.9 M parameters.
    "tiny-13m": TinyModelPreset(384, 6, 6, 2, 1152),
    # For tests: trains and generates in milliseconds.
    "test-micro": TinyModelPreset(64, 2, 2, 1, 128, max_position_embeddings=2048),
}


def chat_template() -> str:
    """The Qwen3 tool-calling chat template shipped with the package."""
    return (resources.files("envace.policy") / "templates" / "qwen3_tool.jinja").read_text()


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2) -> Any:
    """Train a byte-level BPE tokenizer on `corpus` and wrap it as a transformers tokenizer.

    min_frequency: a pair is merged only if it occurs this often. Set it to a good share of the
    corpus (see `corpus_min_frequency`) so that only the ubiquitous scaffolding (chat markup,
    JSON keys, tool schemas, instructions) gets long tokens while entity values (names, ids,
    file names) stay split into short pieces: then a held-out name is made of the same pieces
    as the training names, and the model learns to copy pieces rather than memorise names.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Merges may cross spaces and punctuation (not digits): tool schemas and JSON scaffolding
    # repeat in every prompt, and whole-phrase tokens make prompts ~3x shorter for the tiny model.
    # Digits stay single so numbers are copied from tool results digit by digit.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template(),
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )


def corpus_min_frequency(n_documents: int, share: float = 0.15) -> int:
    """Merge threshold: pairs seen in at least `share` of the documents (on average)."""
    return max(2, int(share * n_documents))


def build_tiny_model(tokenizer: Any, preset: str = "tiny-4m", seed: int = 0) -> Any:
    """A randomly initialised Qwen3ForCausalLM sized by `preset`, matching `tokenizer`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if preset not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {sorted(MODEL_PRESETS)}")
    p = MODEL_PRESETS[preset]
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=p.hidden_size,
        num_hidden_layers=p.num_hidden_layers,
        num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_key_value_heads,
        head_dim=p.hidden_size // p.num_attention_heads,
        intermediate_size=p.intermediate_size,
        max_position_embeddings=p.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def save_checkpoint(model: Any, tokenizer: Any, out_dir: Path) -> Path:
    """Save in Hugging Face format (safetensors + config + tokenizer) so any loader reads it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
