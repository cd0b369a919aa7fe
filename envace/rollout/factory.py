"""Build a policy from a command-line spec: `oracle`, `random`, or a checkpoint path / hub id."""

from __future__ import annotations

from pathlib import Path

from envace.rollout.policies import ModelPolicy, OraclePolicy, Policy, RandomPolicy

__all__ = ["CHECKPOINT_FORMS", "POLICY_FORMS", "build_policy", "load_model_policy"]


CHECKPOINT_FORMS = (
    "a Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer files) or a hub id "
    "(name or namespace/name)"
)
POLICY_FORMS = f"oracle, random, {CHECKPOINT_FORMS}"


def load_model_policy(
    path: str | Path,
    enable_thinking: bool = False,
    max_batch_size: int = 64,
    trainable: bool = True,
    *,
    hint: str | None = None,
) -> ModelPolicy:
    """A `ModelPolicy` over a Hugging Face checkpoint (safetensors + config + tokenizer).

    A missing or corrupt checkpoint raises `UserInputError` from the loader; `hint` (what the
    caller's option accepts) ends its message.
    """
    from envace.policy.chat import ChatRenderer
    from envace.policy.hf_backend import TransformersBackend, load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(path, hint=hint)
    renderer = ChatRenderer(tokenizer, enable_thinking=enable_thinking)
    backend = TransformersBackend(model, tokenizer, max_batch_size=max_batch_size)
    return ModelPolicy(backend, renderer, trainable=trainable)


def build_policy(
    spec: str, seed: int = 0, enable_thinking: bool = False, *, forms: str = POLICY_FORMS
) -> Policy:
    """`oracle` | `random` | a checkpoint directory or hub id.

    forms: the accepted values of the caller's --policy, named when a checkpoint is missing or
    cannot be loaded (a CLI may accept more than this factory, e.g. `empty`).
    """
    if spec == "oracle":
        return OraclePolicy()
    if spec == "random":
        return RandomPolicy(seed=seed)
    hint = f"point --policy at {forms}"
    return load_model_policy(spec, enable_thinking=enable_thinking, trainable=False, hint=hint)
