"""Build a policy from a command-line spec: `oracle`, `random`, or a checkpoint path / hub id."""

from __future__ import annotations

from pathlib import Path

from envace.errors import UserInputError
from envace.rollout.policies import ModelPolicy, OraclePolicy, Policy, RandomPolicy

__all__ = ["build_policy", "load_model_policy"]


def load_model_policy(
    path: str | Path,
    enable_thinking: bool = False,
    max_batch_size: int = 64,
    trainable: bool = True,
) -> ModelPolicy:
    """A `ModelPolicy` over a Hugging Face checkpoint (safetensors + config + tokenizer)."""
    from envace.policy.chat import ChatRenderer
    from envace.policy.hf_backend import TransformersBackend, load_model_and_tokenizer

    p = Path(path)
    if p.exists() and not (p / "config.json").is_file():
        raise UserInputError(
            f"{p} is not a Hugging Face checkpoint (no config.json); pass a directory written by "
            "`envace run`/`envace train` (…/checkpoints/…) or a model id"
        )
    try:
        model, tokenizer = load_model_and_tokenizer(path)
    except OSError as exc:
        raise UserInputError(f"cannot load a model from {path!s}: {exc}") from exc
    renderer = ChatRenderer(tokenizer, enable_thinking=enable_thinking)
    backend = TransformersBackend(model, tokenizer, max_batch_size=max_batch_size)
    return ModelPolicy(backend, renderer, trainable=trainable)


def build_policy(spec: str, seed: int = 0, enable_thinking: bool = False) -> Policy:
    """`oracle` | `random` | a checkpoint directory or hub id."""
    if spec == "oracle":
        return OraclePolicy()
    if spec == "random":
        return RandomPolicy(seed=seed)
    return load_model_policy(spec, enable_thinking=enable_thinking, trainable=False)
