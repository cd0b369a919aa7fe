"""Plain-text and Markdown tables for results people compare, and the CPU they came from."""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["cpu_model", "fmt", "markdown_table", "text_table"]


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else the architecture: a figure's machine."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine() or "unknown CPU"


def fmt(value: Any, digits: int = 3) -> str:
    """Numbers rounded, None as 'n/a'."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers], *[[fmt(v) for v in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(out)
