"""Reading task files: regular files only, bounded lines, and a strict JSON parser (no duplicate
keys, NaN or numbers JSON cannot carry exactly)."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from envace.tasks.problems import TaskFormatError, short_value

__all__ = [
    "LONG_LINE",
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "decode_line",
    "open_input_file",
    "parse_json_strict",
    "read_lines",
]

MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_LINE_BYTES = 4 * 1024 * 1024  # one task, as one line of UTF-8


class _JsonValueError(ValueError):
    """Valid JSON syntax whose meaning is ambiguous or non-portable (duplicate key, NaN)."""


def _reject_constant(name: str) -> Any:
    raise _JsonValueError(f"{name} is not allowed; use a finite number")


def _parse_int(text: str) -> int:
    # Python refuses to convert integers this long (CVE-2020-10735) with a hint at
    # sys.set_int_max_str_digits(), which is no help to someone fixing a task file.
    digits = len(text.lstrip("-"))
    most = sys.get_int_max_str_digits()
    if most and digits > most:
        raise _JsonValueError(
            f"a number with {digits} digits is too long (over {most} digits);"
            " it is not a valid task value"
        )
    return int(text)


def _parse_float(text: str) -> float:
    # float() turns 1e999 into inf: the NaN/Infinity rule would be bypassed.
    value = float(text)
    shown = text if len(text) <= 40 else text[:39] + "…"
    if not math.isfinite(value):
        raise _JsonValueError(f"the number {shown} is too large; use a finite number")
    # ... and 1e-400 into 0.0: a value the file does not say. (Only a mantissa of zeros is 0.)
    if value == 0 and re.search(r"[1-9]", re.split(r"[eE]", text, maxsplit=1)[0]):
        raise _JsonValueError(
            f"the number {shown} is too small to represent (it would become 0); write 0 or a "
            "number of at least 1e-308"
        )
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonValueError(f"duplicate key {short_value(key)} in an object")
        out[key] = value
    return out


def parse_json_strict(text: str) -> Any:
    """`json.loads` that refuses NaN/Infinity (also as an overflowing number like 1e999),
    integers too long to convert, and duplicate keys (Python accepts duplicates silently).

    Raises ValueError with a one-line reason on any problem.
    """
    try:
        return json.loads(
            text,
            parse_constant=_reject_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at column {exc.colno}") from exc
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc


_FILE_KINDS = (
    (stat.S_ISFIFO, "a pipe or FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _cannot_read(file: str, what: str, reason: str) -> TaskFormatError:
    return TaskFormatError(file, None, None, "", f"cannot read the {what}: {reason}")


def _check_regular(info: os.stat_result, file: str, what: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise _cannot_read(file, what, f"{os.strerror(errno.EISDIR)}; check the path")
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _FILE_KINDS if test(info.st_mode)), "not a file")
        raise _cannot_read(
            file,
            what,
            f"it is {kind}, not a regular file; give the path of a file on disk (a pipe or a "
            "process substitution can be read only once, a device may never end)",
        )
    if info.st_size > MAX_FILE_BYTES:
        raise _cannot_read(
            file,
            what,
            f"it is {info.st_size} bytes, over the limit of {MAX_FILE_BYTES} "
            f"({MAX_FILE_BYTES // 2**20} MiB); split it into smaller files",
        )


@contextmanager
def open_input_file(
    path: str | os.PathLike[str], file: str, what: str = "task file"
) -> Iterator[BinaryIO]:
    """`path` opened once for reading, as bytes, when it is a regular file of at most
    MAX_FILE_BYTES; else TaskFormatError naming `file` (`what` it is meant to be) and why.

    Opened without blocking, so a FIFO with no writer is refused instead of hanging the open.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise _cannot_read(file, what, f"{exc.strerror or exc}; check the path") from None
    try:
        _check_regular(os.fstat(fd), file, what)
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        try:
            yield handle
        except OSError as exc:
            raise _cannot_read(file, what, exc.strerror or str(exc)) from None


def _skip_rest_of_line(handle: BinaryIO) -> int:
    skipped = 0
    while chunk := handle.readline(1 << 16):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def read_lines(handle: BinaryIO, file: str) -> Iterator[tuple[int, bytes | None]]:
    """(line number, raw bytes) of every non-blank line, split on \\n only (a U+2028 inside a
    string is text); None for a line over MAX_LINE_BYTES, skipped to its end without keeping it.
    Bytes, so that one bad line can be reported."""
    lineno = total = 0
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        lineno += 1
        total += len(raw)
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            total += _skip_rest_of_line(handle)
            yield lineno, None
        elif raw.strip():
            yield lineno, raw
        if total > MAX_FILE_BYTES:  # it grew while being read
            raise TaskFormatError(
                file, lineno, None, "", f"the file grew past {MAX_FILE_BYTES} bytes"
            )


LONG_LINE = (
    f"the line is longer than {MAX_LINE_BYTES} bytes ({MAX_LINE_BYTES // 2**20} MiB), the most "
    "one task may take; shorten its values"
)


def decode_line(raw: bytes, lineno: int) -> Any:
    """The JSON value of one line; raises ValueError with a one-line reason."""
    try:
        # A byte order mark is legal at the very start of a UTF-8 file and nowhere else.
        text = raw.rstrip(b"\r\n").decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"not valid UTF-8 at byte {exc.start + 1} of the line; save the file as UTF-8"
        ) from exc
    try:
        return parse_json_strict(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from exc
