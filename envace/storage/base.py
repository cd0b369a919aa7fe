"""The `ArtifactStore` protocol and the streaming helpers both stores share.

A store maps relative keys (`run1/iter_000010/model.safetensors`) to objects. Files move in
fixed-size chunks and are hashed (sha256) while they stream, so memory does not grow with file
size and no file is read twice. Local writes go to a temporary file in the destination folder
and are then renamed over the target: a reader sees the old file or the new one, never half of
one.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

__all__ = [
    "CHUNK_SIZE",
    "TEMP_SUFFIX",
    "ArtifactStore",
    "Digest",
    "HashingReader",
    "ObjectInfo",
    "ProgressCallback",
    "atomic_target",
    "copy_hashing",
    "fsync_files",
    "hash_file",
    "is_temp_name",
]

# 1 MiB: per-chunk Python overhead is already negligible next to hashing and I/O, and larger
# writes measured slower (bench/storage.py): more page-cache dirtying per call, same bytes.
CHUNK_SIZE = 1024 * 1024
# Temporary files end with this; listings and manifests ignore them.
TEMP_SUFFIX = ".envace-part"


def is_temp_name(name: str) -> bool:
    """Whether a file name is a temporary file of an atomic write, left behind when the writer
    was killed: `atomic_target`'s `.<hex>.envace-part`, `envace.tasks.io.atomic_write_text`'s
    `.<name>.<random>.tmp`, the `.<name>.tmp-<pid>` folders of `envace.policy.pretrained`, and
    `.tmp<random>` (tempfile's default prefix). Such files never enter a manifest.

    Only hidden names (a leading '.') count, besides our own suffix, so an ordinary
    `results.tmp` a user means to store is kept."""
    if name.endswith(TEMP_SUFFIX):
        return True
    return name.startswith(".") and (
        name.endswith(".tmp") or ".tmp-" in name or name.startswith(".tmp")
    )


ProgressCallback = Callable[[int], None]
"""Called with the number of bytes just moved (negative when a failed attempt is rewound)."""


@dataclass(frozen=True)
class ObjectInfo:
    """One listing entry. `key` is relative to the store; `is_dir` marks a common prefix."""

    key: str
    size: int
    is_dir: bool = False


@dataclass(frozen=True)
class Digest:
    """Size and sha256 (hex) of bytes that were written or read."""

    size: int
    sha256: str


@runtime_checkable
class ArtifactStore(Protocol):
    """Objects under relative keys. Implementations: `LocalStore`, `S3Store`."""

    def uri(self, key: str = "") -> str:
        """The URI of `key`, for messages and for handing to other stages."""
        ...

    def put_file(self, local: Path, key: str, progress: ProgressCallback | None = None) -> Digest:
        """Stream a local file to `key`; return the digest of what was sent."""
        ...

    def get_file(self, key: str, local: Path, progress: ProgressCallback | None = None) -> Digest:
        """Stream `key` into `local` (atomically); return the digest of what was received."""
        ...

    def put_bytes(self, data: bytes, key: str) -> None:
        """Write a small object (a manifest, a JSON summary)."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """Read a small object whole; ObjectNotFoundError when absent."""
        ...

    def digest(self, key: str, progress: ProgressCallback | None = None) -> Digest:
        """Stream `key` through sha256 without keeping it (deep verification)."""
        ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str = "", *, recursive: bool = True) -> builtins.list[ObjectInfo]:
        """Objects under the folder `prefix` (keys relative to the store, sorted)."""
        ...

    def copy(self, src_key: str, dst_key: str) -> None:
        """Copy one object (server-side on S3)."""
        ...

    def delete(self, key: str) -> bool:
        """Delete one object; return whether it existed."""
        ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under the folder `prefix`; return how many were deleted."""
        ...


class HashingReader:
    """A read-only file wrapper that hashes and reports every byte handed out, in order."""

    def __init__(self, raw: BinaryIO, progress: ProgressCallback | None = None) -> None:
        self._raw = raw
        self._progress = progress
        self._hash = hashlib.sha256()
        self.bytes_read = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        if data:
            self._hash.update(data)
            self.bytes_read += len(data)
            if self._progress is not None:
                self._progress(len(data))
        return data

    def digest(self) -> Digest:
        return Digest(self.bytes_read, self._hash.hexdigest())


def copy_hashing(
    src: BinaryIO, dst: BinaryIO | None, progress: ProgressCallback | None = None
) -> Digest:
    """Copy `src` to `dst` (or just drain it when None) in chunks, hashing as it goes."""
    reader = HashingReader(src, progress)
    while chunk := reader.read(CHUNK_SIZE):
        if dst is not None:
            dst.write(chunk)
    return reader.digest()


def hash_file(path: Path, progress: ProgressCallback | None = None) -> Digest:
    with open(path, "rb") as fh:
        return copy_hashing(fh, None, progress)


@contextlib.contextmanager
def atomic_target(dest: Path, *, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to `dest`; on success rename it over `dest`.

    `durable` fsyncs the data before the rename, for commit records such as a manifest. Bulk
    files skip it here: `fsync_files` flushes them all at once, just before the manifest that
    vouches for them is written. On any error the temporary file is removed and `dest` is left
    as it was.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    # The name does not embed `dest.name`: a long unicode name would exceed NAME_MAX.
    tmp = dest.with_name(f".{uuid.uuid4().hex}{TEMP_SUFFIX}")
    try:
        yield tmp
        if durable:
            _fsync(tmp)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_files(paths: Iterable[Path]) -> None:
    """Flush files and the folders that name them to disk (before a manifest vouches for them)."""
    folders = set()
    for path in paths:
        _fsync(path)
        folders.add(path.parent)
    for folder in sorted(folders):
        _fsync(folder)
