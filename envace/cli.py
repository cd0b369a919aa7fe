"""The `envace` command.

Each domain module that has commands exposes `register(subparsers)` in its own `cli.py`; this file
only wires them together, so `envace --help` stays cheap (heavy imports happen inside handlers).
Handlers return an exit code. A `UserInputError` becomes a one-line message and exit code 2,
never a traceback; any other `EnvaceError` (a failure EnvACE detected and explained: a
service that keeps failing, inputs of a stage that do not belong together) a one-line message
and exit code 1; an `OSError` (a path that cannot be read or written) a one-line message with
the path and exit code 1 (`-v` re-raises it with its traceback).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from envace import __version__
from envace.errors import EnvaceError, UserInputError

__all__ = ["build_parser", "main"]

# Modules whose `cli.register(subparsers)` adds commands, in `envace --help` order.
_COMMAND_MODULES = (
    "envace.tasks.cli",
    "envace.evaluate.cli",
    "envace.train.cli",
    "envace.storage.cli",
    "envace.cluster.cli",
    "pipelines.cli",
    "envace.config_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="envace",
        description="Train LLM tool-use agents with world rehearsal (act + rehearse, role-wise GRPO).",
    )
    parser.add_argument("--version", action="version", version=f"envace {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real import error inside the module: surface it
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        code: int = args.func(args)
    except UserInputError as exc:
        print(f"envace: error: {exc}", file=sys.stderr)
        return 2
    except EnvaceError as exc:
        # A failure EnvACE detected and explained (a stage's inputs do not match, a service
        # keeps failing, a worker died): its message is the report; -v adds the traceback.
        if args.verbose:
            raise
        print(f"envace: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        # A file or folder the command could not read or write (permissions, a full disk, a
        # path that is a file): say which and why; -v keeps the traceback for a bug report.
        if args.verbose:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        print(f"envace: error: {exc.strerror or exc}{where} (-v shows where)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("envace: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
