"""The artifact manifest: the commit record of an artifact directory.

`MANIFEST.json` is written last, after every file it lists is stored. Its presence is what makes
an artifact complete; its sizes and sha256 digests are what readers check. Format (version 1):

    {"format_version": 1, "created": "2026-11-29T20:15:00Z",
     "files": [{"path": "config.json", "size": 612, "sha256": "<64 hex>"}, ...]}

`path` is relative with '/' separators, sorted, unique, and never the manifest itself.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from envace.storage.base import is_temp_name
from envace.storage.errors import ArtifactIntegrityError, InvalidKeyError, UnsafeTreeError
from envace.storage.uri import validate_key

__all__ = ["FORMAT_VERSION", "MANIFEST_NAME", "Manifest", "ManifestEntry", "scan_dir"]

log = logging.getLogger(__name__)

MANIFEST_NAME = "MANIFEST.json"
FORMAT_VERSION = 1
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ManifestEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    files: tuple[ManifestEntry, ...]
    created: str
    format_version: int = FORMAT_VERSION

    @classmethod
    def build(cls, entries: list[ManifestEntry]) -> Manifest:
        created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return cls(files=tuple(sorted(entries, key=lambda e: e.path)), created=created)

    @property
    def total_size(self) -> int:
        return sum(e.size for e in self.files)

    def to_json(self) -> bytes:
        doc = {
            "format_version": self.format_version,
            "created": self.created,
            "files": [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in self.files],
        }
        return (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes, source: str) -> Manifest:
        """Parse and validate; ArtifactIntegrityError naming `source` when anything is off."""
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ArtifactIntegrityError(
                f"corrupt manifest at {source}: not valid JSON ({exc}); re-commit the artifact"
            ) from exc
        return _manifest_from_doc(doc, source)


def _bad(source: str, what: str) -> ArtifactIntegrityError:
    return ArtifactIntegrityError(f"corrupt manifest at {source}: {what}; re-commit the artifact")


def _entry_from_doc(item: Any, source: str) -> ManifestEntry:
    if not isinstance(item, dict):
        raise _bad(source, f"file entry {item!r} is not an object")
    path, size, sha = item.get("path"), item.get("size"), item.get("sha256")
    if not isinstance(path, str) or path == MANIFEST_NAME:
        raise _bad(source, f"bad file path {path!r}")
    try:
        validate_key(path)
    except InvalidKeyError as exc:
        raise _bad(source, str(exc)) from exc
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise _bad(source, f"file {path!r} has bad size {size!r}")
    if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
        raise _bad(source, f"file {path!r} has bad sha256 {sha!r}")
    return ManifestEntry(path, size, sha)


def _manifest_from_doc(doc: Any, source: str) -> Manifest:
    if not isinstance(doc, dict):
        raise _bad(source, "top level is not an object")
    version = doc.get("format_version")
    if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise _bad(
            source,
            f"format_version {version!r} is not supported (this envace reads 1..{FORMAT_VERSION})",
        )
    created = doc.get("created")
    files = doc.get("files")
    if not isinstance(created, str) or not isinstance(files, list):
        raise _bad(source, "'created' must be a string and 'files' a list")
    entries = tuple(_entry_from_doc(item, source) for item in files)
    paths = [e.path for e in entries]
    if len(set(paths)) != len(paths):
        raise _bad(source, "a file path is listed twice")
    return Manifest(files=entries, created=created, format_version=version)


@dataclass
class _Scan:
    """What a walk of a folder found, besides the files it will store."""

    files: list[tuple[str, Path]] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # "rel -> target", not followed
    broken: list[str] = field(default_factory=list)  # dangling links and link loops
    special: list[str] = field(default_factory=list)  # sockets, pipes, devices
    temps: list[str] = field(default_factory=list)


def _shown(items: list[str]) -> str:
    return ", ".join(items[:5]) + (f", ... ({len(items)} in all)" if len(items) > 5 else "")


def _link_text(path: Path, rel: str) -> str:
    try:
        return f"{rel} -> {os.readlink(path)}"
    except OSError:
        return rel


def _walk(scan: _Scan, root: Path, follow: bool) -> None:
    """Add every entry under `root` to `scan`. Iterative (a deep tree is no RecursionError);
    each folder carries the real paths of the folders above it, so a link back up is a loop,
    not an endless walk."""
    stack: list[tuple[Path, str, frozenset[str]]] = [
        (root, "", frozenset({os.path.realpath(root)}))
    ]
    while stack:
        folder, rel, seen = stack.pop()
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            path, key = Path(entry.path), f"{rel}{entry.name}"
            if is_temp_name(entry.name):
                scan.temps.append(key)
            elif entry.is_symlink() and not follow:
                scan.links.append(_link_text(path, key))
            elif entry.is_symlink() and not path.exists():
                scan.broken.append(_link_text(path, key) + " (dangling)")
            elif entry.is_dir():  # follows a link here (`follow`, checked above)
                real = os.path.realpath(path)
                if real in seen:
                    scan.broken.append(_link_text(path, key) + " (a loop)")
                else:
                    stack.append((path, f"{key}/", seen | {real}))
            elif entry.is_file():
                if key != MANIFEST_NAME:
                    scan.files.append((validate_key(key), path))
            else:
                scan.special.append(key)


def _refuse(local_dir: Path, scan: _Scan) -> None:
    if scan.links:
        raise UnsafeTreeError(
            f"cannot commit {local_dir}: it holds {len(scan.links)} symbolic link(s):"
            f" {_shown(scan.links)}. An artifact stores files, not links, and following one can"
            " upload files from outside the folder: remove them, or pass --follow-symlinks"
            " (follow_symlinks=True) to store the content they point to"
        )
    if scan.broken:
        raise UnsafeTreeError(
            f"cannot commit {local_dir}: {len(scan.broken)} link(s) lead nowhere to store:"
            f" {_shown(scan.broken)}; remove or fix them (the artifact would be incomplete)"
        )
    if scan.special:
        raise UnsafeTreeError(
            f"cannot commit {local_dir}: {len(scan.special)} entr(ies) are not regular files"
            f" (sockets, pipes, devices): {_shown(scan.special)}; move them out of the folder"
        )


def scan_dir(local_dir: Path, *, follow_symlinks: bool = False) -> list[tuple[str, Path]]:
    """(relative key, path) of every regular file under `local_dir`, sorted by key.

    The folder's own manifest and temporary files of interrupted writes (`is_temp_name`; named
    in a warning) are left out. Anything else that cannot be stored as it is is refused
    (UnsafeTreeError) before a byte moves, so an artifact is never committed incomplete: a
    symbolic link (unless `follow_symlinks`: then its target's content is stored under the
    link's name), a dangling link or link loop, a socket, pipe or device. Names that are not
    valid keys (control characters, ...) raise InvalidKeyError.
    """
    scan = _Scan()
    try:
        _walk(scan, local_dir, follow_symlinks)
    except OSError as exc:  # an unreadable sub-folder
        raise UnsafeTreeError(
            f"cannot commit {local_dir}: cannot read {exc.filename}: {exc.strerror or exc};"
            " fix its permissions or move it out"
        ) from exc
    _refuse(local_dir, scan)
    if scan.temps:
        log.warning(
            "%s: left out %d temporary file(s) of interrupted writes: %s",
            local_dir,
            len(scan.temps),
            _shown(scan.temps),
        )
    return sorted(scan.files)
