"""Errors of the artifact store.

Every store failure is something the operator fixes (a URI, an endpoint, credentials, a bucket, an
artifact that must be re-written), so all of them are `UserInputError`s: the CLI prints the one-line
message instead of a traceback. Messages name the URI or endpoint, the operation and the fix, and
never contain credentials.
"""

from __future__ import annotations

from envace.errors import UserInputError

__all__ = [
    "ArtifactIntegrityError",
    "ArtifactNotFoundError",
    "InvalidKeyError",
    "ObjectNotFoundError",
    "StoreAccessError",
    "StoreError",
    "StoreUnavailableError",
    "UnsafeTreeError",
]


class StoreError(UserInputError):
    """Base class of every artifact-store failure."""


class InvalidKeyError(StoreError):
    """A key or URI is malformed or hostile (`..`, absolute, control characters, too long)."""


class StoreAccessError(StoreError):
    """Wrong credentials, missing permission or a missing bucket: retrying cannot help."""


class StoreUnavailableError(StoreError):
    """Transient failures (refused connections, 5xx, timeouts) outlasted the retry budget."""


class ObjectNotFoundError(StoreError):
    """A single object that was asked for does not exist."""


class ArtifactIntegrityError(StoreError):
    """An artifact is missing, partial (no manifest) or corrupt (size or sha256 mismatch)."""


class ArtifactNotFoundError(ArtifactIntegrityError):
    """Nothing at all is stored at an artifact URI (as opposed to a partial or corrupt one)."""


class UnsafeTreeError(StoreError):
    """A local folder holds what an artifact cannot store faithfully (symbolic links, dangling
    links, sockets, pipes), or a destination path runs through a symbolic link."""
