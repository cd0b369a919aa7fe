"""`envace tasks ...`: validate task files, import the reference layout, generate synthetic splits.

Handlers import what they need when they run, so `envace --help` stays cheap.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from envace.errors import UserInputError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `envace tasks` and its subcommands to the top-level parser."""
    parser = subparsers.add_parser(
        "tasks",
        help="validate, import and generate task files",
        description="Work with task files (JSON Lines; see docs/task_format.md).",
    )
    parser.set_defaults(func=lambda _args: _print_help(parser))
    sub = parser.add_subparsers(dest="tasks_command", metavar="SUBCOMMAND")
    _add_validate(sub)
    _add_import(sub)
    _add_generate(sub)


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "validate",
        help="check task files against the task format",
        description=(
            "Check task files. Prints each error to stderr and 'N valid, M invalid' to stdout; "
            "exits 0 when every file holds tasks and every task is valid, 2 otherwise (a file "
            "with no tasks is an error: there is nothing in it to train or evaluate on)."
        ),
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="JSONL task file")
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="check every task of each file (default: stop each file at its first bad task)",
    )
    parser.set_defaults(func=_validate)


def _add_import(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "import",
        help="convert the reference checklist dataset layout to a task file",
        description="Convert a reference-layout file (JSON array, JSONL or parquet) to tasks.",
    )
    parser.add_argument("src", type=Path, metavar="SRC", help="reference-layout file")
    parser.add_argument("--out", type=Path, required=True, help="task file (JSONL) to write")
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="leave out bad records (each reported) instead of stopping at the first",
    )
    parser.set_defaults(func=_import)


def _add_generate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "generate",
        help="generate synthetic train/test task files",
        description="Generate synthetic tasks for the built-in environments (train and test).",
    )
    parser.add_argument("--out", type=Path, required=True, help="directory to write into")
    parser.add_argument("--n-train", type=int, required=True, help="number of train tasks (>= 1)")
    parser.add_argument("--n-test", type=int, required=True, help="number of test tasks (>= 1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--store", default=None, help="also commit the folder to this artifact store URI"
    )
    parser.set_defaults(func=_generate)


@dataclass
class _Tally:
    valid: int = 0
    invalid: int = 0
    not_checked: int = 0
    unreadable: int = 0
    empty: int = 0

    def summary(self) -> str:
        text = f"{self.valid} valid, {self.invalid} invalid"
        if self.not_checked:
            text += (
                f", {self.not_checked} not checked (each file stops at its first bad task; "
                "use --skip-invalid to check them all)"
            )
        if self.unreadable:
            text += f", {self.unreadable} unreadable file(s)"
        if self.empty:
            text += f", {self.empty} empty file(s)"
        return text

    @property
    def ok(self) -> bool:
        return self.invalid == 0 and self.unreadable == 0 and self.empty == 0


def _nonblank_line_numbers(path: Path) -> list[int]:
    with path.open("rb") as handle:
        return [n for n, raw in enumerate(handle, start=1) if raw.strip()]


def _validate_file(path: Path, skip_invalid: bool, tally: _Tally) -> None:
    from envace.tasks.loader import TaskFormatError, scan_tasks

    try:
        # Read once: a file that changes (or is not a regular file) cannot skew the counts.
        result = scan_tasks(path, skip_invalid=skip_invalid)
    except TaskFormatError as err:
        print(err, file=sys.stderr)
        tally.unreadable += 1
        return
    for skipped in result.skipped:
        print(skipped, file=sys.stderr)
    if not result.tasks and not result.skipped:
        print(f"{path}: no tasks (empty file)", file=sys.stderr)
        tally.empty += 1
        return
    tally.valid += len(result.tasks)
    tally.invalid += len(result.skipped)
    tally.not_checked += result.not_checked


def _validate(args: argparse.Namespace) -> int:
    tally = _Tally()
    for path in args.files:
        _validate_file(path, args.skip_invalid, tally)
    print(tally.summary())
    return 0 if tally.ok else 2


def _import(args: argparse.Namespace) -> int:
    from envace.tasks.importer import read_reference
    from envace.tasks.io import write_tasks_jsonl

    result = read_reference(args.src, skip_invalid=args.skip_invalid)
    for skipped in result.skipped:
        print(skipped, file=sys.stderr)
    if not result.tasks:
        raise UserInputError(f"{args.src}: no valid record to import; nothing written")
    count = write_tasks_jsonl(args.out, result.tasks)
    note = f" ({len(result.skipped)} invalid record(s) skipped)" if result.skipped else ""
    print(f"imported {count} task(s) from {args.src} to {args.out}{note}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    for flag, value in (("--n-train", args.n_train), ("--n-test", args.n_test)):
        if value < 1:
            raise UserInputError(f"{flag} must be at least 1, got {value}")
    from envace.tasks.generate import write_splits

    written = write_splits(args.out, n_train=args.n_train, n_test=args.n_test, seed=args.seed)
    for split, path in written.items():
        # Not every split file is a task file (gold trajectories too), so count JSONL records.
        print(f"{split}: {path} ({len(_nonblank_line_numbers(path))} records)")
    if args.store:
        from envace.storage.artifacts import commit_dir

        commit_dir(args.out, args.store)
        print(f"committed {args.out} to {args.store}")
    return 0
