"""`envace config show`: the resolved configuration, every field with its documentation."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("config", help="show the resolved configuration and what each field does")
    csub = p.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    show = csub.add_parser(
        "show",
        help="print the config (defaults <- --config file <- --set overrides), validated, "
        "each field followed by its documentation",
    )
    show.add_argument("--config", type=Path, default=None, help="a YAML config (configs/)")
    show.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override one field, e.g. --set train.lr=1e-5 (repeatable)",
    )
    show.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    from envace.config import describe_config, load_config

    print(describe_config(load_config(args.config, args.overrides)), end="")
    return 0
