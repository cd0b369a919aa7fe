"""Copy probe: can a checkpoint copy a token sequence from its context (an induction head)?

    python bench/copy_probe.py --checkpoint runs/local/checkpoints/warm_start
    python bench/copy_probe.py --checkpoint runs/local/checkpoints/init --train-steps 600

Probe: rows of L random tokens (from the tokenizer's non-special vocabulary, its short
letters-and-digits pieces with `--max-chars`, or a random subset of `--vocab` of them) followed by the same L tokens; accuracy = the share of the repeat's
tokens 2..L that the model predicts greedily (the first one cannot be known). About 1 / vocab
for a model that cannot copy, near 1 for one that can. The synthetic tasks need exactly this:
every name, id, PIN and amount of a call is copied from the conversation.

Drill (`--train-steps N`): trains a fresh model of `--preset` (with the checkpoint's tokenizer)
on such rows, L drawn from `--lengths`, with AdamW, and probes it every `--every` steps: how long
the tiny presets take to learn copying from scratch on this machine. `--save DIR` keeps the
drilled model, e.g. to warm-start it (`envace run --set model.path=DIR`).
Prints a table and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envace.report import text_table  # noqa: E402


def copy_rows(
    vocab: torch.Tensor, rows: int, length: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (rows, 2 L), mask of the positions whose next token is a predictable copy)."""
    seg = vocab[torch.randint(0, len(vocab), (rows, length), generator=gen)]
    ids = torch.cat([seg, seg], 1)
    mask = torch.zeros(rows, 2 * length - 1, dtype=torch.bool)
    mask[:, length:] = True  # position t predicts ids[t + 1]: the repeat's tokens 2..L
    return ids, mask


def copy_logprobs(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """Log-probabilities (rows, 2 L - 1, vocab) of each next token."""
    logits = model(input_ids=ids).logits[:, :-1]
    return torch.log_softmax(logits.float(), -1)


@torch.no_grad()
def probe(
    model: Any, vocab: torch.Tensor, length: int = 24, rows: int = 64, seed: int = 123
) -> float:
    """Greedy accuracy on the repeat's predictable tokens."""
    was_training = model.training
    model.eval()
    ids, mask = copy_rows(vocab, rows, length, torch.Generator().manual_seed(seed))
    pred = copy_logprobs(model, ids).argmax(-1)
    model.train(was_training)
    return float((pred[mask] == ids[:, 1:][mask]).float().mean())


def drill(
    model: Any,
    vocab: torch.Tensor,
    steps: int,
    *,
    lr: float,
    rows: int,
    lengths: tuple[int, int],
    every: int,
    seed: int = 0,
) -> list[dict[str, float]]:
    """Train on copy rows; the probe (at the middle length) every `every` steps."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, min(50, steps // 10))
    curve: list[dict[str, float]] = []
    start = time.perf_counter()
    model.train()
    bar = tqdm(range(1, steps + 1), desc="copy drill", unit="step")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, step / warmup)
        length = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=gen))
        ids, mask = copy_rows(vocab, rows, length, gen)
        logp = copy_logprobs(model, ids).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = float(loss.detach())
        if step % every == 0 or step == steps:
            acc = probe(model, vocab, length=sum(lengths) // 2)
            bar.set_postfix(loss=f"{value:.3f}", acc=f"{acc:.3f}")
            curve.append(
                {
                    "step": step,
                    "loss": round(value, 4),
                    "copy_accuracy": round(acc, 4),
                    "seconds": round(time.perf_counter() - start, 1),
                }
            )
    return curve


def drill_vocab(
    tokenizer: Any, size: int | None, max_chars: int | None = None, seed: int = 1
) -> torch.Tensor:
    """The tokenizer's non-special ids (with `max_chars`: only the letters-and-digits tokens of
    at most that many characters, the pieces names, ids and numbers are made of), or a random
    subset of `size` of them."""
    special = set(tokenizer.all_special_ids)
    ids = torch.tensor(
        [
            i
            for i in range(len(tokenizer))
            if i not in special
            and (max_chars is None or _value_piece(tokenizer.decode([i]), max_chars))
        ]
    )
    if len(ids) < 2:
        raise SystemExit(f"--max-chars {max_chars}: fewer than 2 such tokens in this tokenizer")
    if size is not None:
        if not 2 <= size <= len(ids):
            raise SystemExit(f"--vocab {size}: choose 2..{len(ids)} (this tokenizer's ids)")
        ids = ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))[:size]]
    return ids


def _value_piece(text: str, max_chars: int) -> bool:
    return text.isalnum() and len(text) <= max_chars


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, required=True, help="a Hugging Face folder")
    p.add_argument("--vocab", type=int, default=None, help="draw from this many ids (default all)")
    p.add_argument(
        "--max-chars",
        type=int,
        default=None,
        help="only letters-and-digits tokens of at most this many characters",
    )
    p.add_argument("--length", type=int, default=24, help="probe: tokens before the repeat")
    p.add_argument("--train-steps", type=int, default=0, help="drill a fresh --preset model")
    p.add_argument("--preset", default="tiny-4m")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--lengths", type=int, nargs=2, default=(8, 32), metavar=("MIN", "MAX"))
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--save", type=Path, default=None, help="save the drilled model (+ tokenizer) here"
    )
    p.add_argument("--out", type=Path, default=Path("runs/bench-copy-probe.json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    from envace.policy.hf_backend import load_model_and_tokenizer

    if not (args.checkpoint / "config.json").is_file():
        raise SystemExit(f"--checkpoint {args.checkpoint}: no config.json (a Hugging Face folder)")
    model, tok = load_model_and_tokenizer(str(args.checkpoint))
    vocab = drill_vocab(tok, args.vocab, args.max_chars)
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, torch {torch.__version__}",
        "command": " ".join(["python", "bench/copy_probe.py", *(argv or sys.argv[1:])]),
        "checkpoint": str(args.checkpoint),
        "vocab": len(vocab),
        "length": args.length,
        "copy_accuracy": round(probe(model, vocab, args.length), 4),
        "chance": round(1 / len(vocab), 4),
    }
    print(
        f"{args.checkpoint}: copy accuracy {report['copy_accuracy']:.3f} "
        f"(chance {report['chance']:.4f}, {len(vocab)} ids, L = {args.length})"
    )
    if args.train_steps:
        from envace.policy.tiny import build_tiny_model

        torch.manual_seed(args.seed)
        fresh = build_tiny_model(tok, args.preset, seed=args.seed)
        curve = drill(
            fresh,
            vocab,
            args.train_steps,
            lr=args.lr,
            rows=args.rows,
            lengths=tuple(args.lengths),
            every=args.every,
            seed=args.seed,
        )
        if args.save is not None:  # e.g. as `model.path` of an `envace run` (warm start on)
            from envace.policy.tiny import save_checkpoint

            save_checkpoint(fresh, tok, args.save)
        report["drill"] = {
            "preset": args.preset,
            "lr": args.lr,
            "rows": args.rows,
            "lengths": list(args.lengths),
            "curve": curve,
        }
        print(
            text_table(
                ["step", "loss", "copy accuracy", "seconds"],
                [(c["step"], c["loss"], c["copy_accuracy"], c["seconds"]) for c in curve],
            )
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
