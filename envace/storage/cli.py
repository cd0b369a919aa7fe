"""`envace store ls|put|get|verify|latest`."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from envace.storage.base import ProgressCallback

__all__ = ["register"]


@contextlib.contextmanager
def _progress(desc: str) -> Iterator[ProgressCallback]:
    """A byte-count progress bar on stderr (silent when stderr is not a terminal)."""
    from tqdm import tqdm

    with tqdm(desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=None) as bar:

        def update(n: int) -> None:
            bar.update(n)

        yield update


def _ls(args: argparse.Namespace) -> int:
    from envace.storage.artifacts import open_store

    store, prefix = open_store(args.uri)
    found = store.list(prefix, recursive=args.recursive)
    if not found:
        # Exit 1, like `ls` of a missing path: a typo in URI must not look like an empty listing.
        print(f"envace store ls: nothing at {args.uri}", file=sys.stderr)
        return 1
    for info in found:
        size = "DIR" if info.is_dir else str(info.size)
        print(f"{size:>14}  {store.uri(info.key.rstrip('/'))}{'/' if info.is_dir else ''}")
    return 0


def _put(args: argparse.Namespace) -> int:
    from envace.storage.artifacts import commit_dir

    with _progress("upload") as progress:
        manifest = commit_dir(
            args.local_dir, args.uri, progress=progress, follow_symlinks=args.follow_symlinks
        )
    print(f"committed {args.uri}: {len(manifest.files)} file(s), {manifest.total_size} bytes")
    return 0


def _get(args: argparse.Namespace) -> int:
    from envace.storage.artifacts import fetch_dir

    with _progress("download") as progress:
        manifest = fetch_dir(args.uri, args.local_dir, progress=progress)
    print(f"fetched {args.uri} into {args.local_dir}: {len(manifest.files)} file(s) verified")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from envace.storage.artifacts import verify
    from envace.storage.errors import StoreError

    try:
        with _progress("hash") as progress:
            manifest = verify(args.uri, deep=args.deep, progress=progress)
    except StoreError as exc:
        print(f"envace store verify: FAILED: {exc}", file=sys.stderr)
        return 1
    checked = "sizes and sha256" if args.deep else "sizes"
    print(
        f"OK {args.uri}: {len(manifest.files)} file(s), {manifest.total_size} bytes,"
        f" committed {manifest.created} ({checked} checked)"
    )
    return 0


def _latest(args: argparse.Namespace) -> int:
    from envace.storage.checkpoints import latest_complete

    uri = latest_complete(args.prefix, deep=args.deep)
    if uri is None:
        print(f"envace store latest: no complete checkpoint under {args.prefix}", file=sys.stderr)
        return 1
    print(uri)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "store",
        help="artifact store: list, upload, download and verify artifacts",
        description=(
            "Artifacts live in a local folder or on MinIO / S3 (minio://bucket/key, s3://...)."
            " An artifact is a directory committed with a MANIFEST.json (sizes, sha256) written"
            " last; readers refuse anything without a matching manifest."
        ),
    )
    sub = parser.add_subparsers(dest="store_command", metavar="ACTION", required=True)

    ls = sub.add_parser("ls", help="list objects under a URI (exit 1: nothing there)")
    ls.add_argument("uri", metavar="URI")
    ls.add_argument("-r", "--recursive", action="store_true", help="list every object below")
    ls.set_defaults(func=_ls)

    put = sub.add_parser("put", help="commit a local directory (files, then its manifest)")
    put.add_argument("local_dir", metavar="LOCAL_DIR")
    put.add_argument("uri", metavar="URI")
    put.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="store what symbolic links point to (even outside LOCAL_DIR); default: refuse links",
    )
    put.set_defaults(func=_put)

    get = sub.add_parser("get", help="download a committed artifact, checking every file")
    get.add_argument("uri", metavar="URI")
    get.add_argument("local_dir", metavar="LOCAL_DIR")
    get.set_defaults(func=_get)

    ver = sub.add_parser("verify", help="exit 1 unless the artifact at URI is complete")
    ver.add_argument("uri", metavar="URI")
    ver.add_argument("--deep", action="store_true", help="also re-hash every file (streams it)")
    ver.set_defaults(func=_verify)

    latest = sub.add_parser("latest", help="print the newest complete checkpoint under a prefix")
    latest.add_argument("prefix", metavar="URI")
    latest.add_argument("--deep", action="store_true", help="re-hash before trusting one")
    latest.set_defaults(func=_latest)
