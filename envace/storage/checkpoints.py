"""Checkpoints: committed artifacts named `<prefix>/iter_000010/`, newest complete one wins.

A checkpoint exists for readers only once its manifest is written (see `artifacts.py`), so
"latest" is the highest step whose manifest is present and verifies. A run killed while
uploading step 12 leaves `iter_000012/` without a manifest: resume skips it and takes step 10.
A resume (`fetch_latest`) also checks every file's sha256 as it fetches, so a checkpoint whose
bytes were damaged after its commit is skipped the same way, with a warning naming it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from envace.errors import UserInputError
from envace.storage.artifacts import fetch_dir, open_store, verify
from envace.storage.errors import ArtifactIntegrityError
from envace.storage.manifest import MANIFEST_NAME
from envace.storage.retry import RetryPolicy
from envace.storage.settings import S3Settings
from envace.storage.uri import join_uri

__all__ = [
    "checkpoint_name",
    "checkpoint_step",
    "checkpoint_uri",
    "fetch_latest",
    "latest_complete",
    "list_checkpoints",
]

log = logging.getLogger(__name__)
_NAME_RE = re.compile(r"^iter_(\d{6,})$")
T = TypeVar("T")


def checkpoint_name(step: int) -> str:
    """`iter_000010` for step 10 (zero-padded so names also sort by step)."""
    if step < 0:
        raise UserInputError(f"checkpoint step {step} is negative")
    return f"iter_{step:06d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint folder name, or None when it is not one."""
    match = _NAME_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def checkpoint_uri(prefix_uri: str, step: int) -> str:
    return join_uri(prefix_uri, checkpoint_name(step))


def list_checkpoints(
    prefix_uri: str, config: S3Settings | None = None, *, retry: RetryPolicy | None = None
) -> list[tuple[int, str]]:
    """(step, uri) of every checkpoint under `prefix_uri` that has a manifest, by step.

    The manifests are not verified here; `latest_complete` does that.
    """
    store, prefix = open_store(prefix_uri, config, retry=retry)
    found = []
    for info in store.list(prefix):
        rel = info.key[len(prefix) + 1 :] if prefix else info.key
        name, _, rest = rel.partition("/")
        step = checkpoint_step(name)
        if step is not None and rest == MANIFEST_NAME:
            found.append((step, join_uri(prefix_uri, name)))
    return sorted(found)


def _newest_passing(
    prefix_uri: str,
    check: Callable[[str], T],
    config: S3Settings | None,
    retry: RetryPolicy | None,
) -> T | None:
    """`check(uri)` of the newest checkpoint for which it raises no ArtifactIntegrityError;
    each one refused is named in a warning and skipped. None when every one is refused."""
    skipped: list[str] = []
    for step, uri in reversed(list_checkpoints(prefix_uri, config, retry=retry)):
        try:
            result = check(uri)
        except ArtifactIntegrityError as exc:
            log.warning("skipping damaged checkpoint %d (%s): %s", step, uri, exc)
            skipped.append(checkpoint_name(step))
            continue
        if skipped:
            log.warning(
                "using checkpoint %d (%s); skipped the newer damaged one(s): %s",
                step,
                uri,
                ", ".join(skipped),
            )
        return result
    return None


def latest_complete(
    prefix_uri: str,
    config: S3Settings | None = None,
    *,
    deep: bool = False,
    retry: RetryPolicy | None = None,
) -> str | None:
    """URI of the newest checkpoint under `prefix_uri` that verifies (deep: every sha256
    re-hashed), or None when none does. Damaged ones are named in a warning and skipped."""

    def check(uri: str) -> str:
        verify(uri, config, deep=deep, retry=retry)
        return uri

    return _newest_passing(prefix_uri, check, config, retry)


def fetch_latest(
    prefix_uri: str,
    local_parent: Path,
    config: S3Settings | None = None,
    *,
    retry: RetryPolicy | None = None,
) -> tuple[str, Path] | None:
    """(uri, local copy) of the newest checkpoint under `prefix_uri` that arrives whole and
    verified, fetched into `local_parent/<its name>`; None when none does.

    Every candidate is checked as deep as `envace store latest --deep` (each file's size and
    sha256), in one pass: `fetch_dir` hashes what it downloads (and, for a checkpoint already
    in place in a local store, re-hashes it). One that fails is named in a warning and the next
    older one is tried, so a resume survives a damaged newest checkpoint."""

    def check(uri: str) -> tuple[str, Path]:
        local = local_parent / uri.rstrip("/").rsplit("/", 1)[-1]
        fetch_dir(uri, local, config, retry=retry)
        return uri, local

    return _newest_passing(prefix_uri, check, config, retry)
