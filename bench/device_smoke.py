"""Before the study on a lent GPU (bench/device_study.sh): convert SmolLM2 once into the cache,
load it on the GPU, and check the static decoder (CUDA graphs) against transformers' `generate`
on the same greedy prompts. Prints one JSON line; exit status 0 when the static decoder runs and
agrees on the first tokens, 2 when it fails (the study then decodes with `generate`).

    python bench/device_smoke.py --out smoke.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = (
    "What is the capital of France?",
    "List three prime numbers.",
    "Say hello in Spanish.",
    "Write one sentence about the sea.",
    "What is 12 times 7?",
    "Name a colour of the rainbow.",
    "How many legs does a spider have?",
    "Give me a word that rhymes with cat.",
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--new", type=int, default=32)
    args = p.parse_args(argv)
    import torch

    from envace.policy.hf_backend import TransformersBackend, load_model_and_tokenizer
    from envace.policy.pretrained import ensure_smollm2
    from envace.policy.types import SamplingParams

    rec: dict[str, object] = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    t0 = time.perf_counter()
    folder = ensure_smollm2()
    rec["convert_s"] = round(time.perf_counter() - t0, 1)
    model, tok = load_model_and_tokenizer(folder, "auto", device="auto")
    rec |= {"device": str(model.device), "dtype": str(model.dtype)}
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        for q in PROMPTS
    ]
    prompts = [list(x) if isinstance(x, list) else list(x["input_ids"]) for x in prompts]
    params = SamplingParams(max_new_tokens=args.new, temperature=0.0)
    outs: dict[str, list[list[int]]] = {}
    status = 0
    for decode in ("generate", "static"):
        try:
            backend = TransformersBackend(model, tok, decode=decode)  # type: ignore[arg-type]
            backend.generate(prompts, params)  # warm-up (graph capture)
            t0 = time.perf_counter()
            gens = backend.generate(prompts, params)
            seconds = time.perf_counter() - t0
            backend.release()
            outs[decode] = [g.token_ids for g in gens]
            rec[f"{decode}_tokens_per_s"] = round(sum(len(g) for g in outs[decode]) / seconds, 1)
        except Exception as exc:  # the verdict is the point: a failure is recorded
            traceback.print_exc()
            rec[f"{decode}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            status = 2
    if status == 0:
        # bf16 greedy: the two paths may part after a near-tie; compare the first 8 tokens
        same = [a[:8] == b[:8] for a, b in zip(outs["generate"], outs["static"], strict=True)]
        rec["first8_agree"] = f"{sum(same)}/{len(same)}"
        rec["sample"] = tok.decode(outs["static"][0])
        status = 0 if sum(same) >= len(same) // 2 else 2
    print(json.dumps(rec))
    args.out.write_text(json.dumps(rec, indent=1) + "\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
