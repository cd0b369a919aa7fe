"""Checkpoints: committed artifacts named `<prefix>/iter_000010/`, newest complete one wins.

A checkpoint exists for readers only once its manifest is written (see `artifacts.py`), so
"latest" is the highest step whose manifest is present and verifies. A run killed while
uploading step 12 leaves `iter_000012/` without a manifest: resume skips it and takes step 10.
"""

from __future__ import annotations

import logging
import re

from envace.errors import UserInputError
from envace.storage.artifacts import open_store, verify
from envace.storage.errors import ArtifactIntegrityError
from envace.storage.manifest import MANIFEST_NAME
from envace.storage.retry import RetryPolicy
from envace.storage.settings import S3Settings
from envace.storage.uri import join_uri

__all__ = [
    "checkpoint_name",
    "checkpoint_step",
    "checkpoint_uri",
    "latest_complete",
    "list_checkpoints",
]

log = logging.getLogger(__name__)
_NAME_RE = re.compile(r"^iter_(\d{6,})$")


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


def latest_complete(
    prefix_uri: str,
    config: S3Settings | None = None,
    *,
    deep: bool = False,
    retry: RetryPolicy | None = None,
) -> str | None:
    """URI of the newest checkpoint under `prefix_uri` that verifies, or None when none does."""
    for step, uri in reversed(list_checkpoints(prefix_uri, config, retry=retry)):
        try:
            verify(uri, config, deep=deep, retry=retry)
        except ArtifactIntegrityError as exc:
            log.warning("skipping checkpoint %d: %s", step, exc)
            continue
        return uri
    return None
