"""The artifact manifest: the commit record of an artifact directory.

`MANIFEST.json` is written last, after every file it lists is stored. Its presence is what makes
an artifact complete; its sizes and sha256 digests are what readers check. Format (version 1):

    {"format_version": 1, "created": "2026-11-29T20:15:00Z",
     "files": [{"path": "config.json", "size": 612, "sha256": "<64 hex>"}, ...]}

`path` is relative with '/' separators, sorted, unique, and never the manifest itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from envace.storage.base import TEMP_SUFFIX
from envace.storage.errors import ArtifactIntegrityError, InvalidKeyError
from envace.storage.uri import validate_key

__all__ = ["FORMAT_VERSION", "MANIFEST_NAME", "Manifest", "ManifestEntry", "scan_dir"]

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


def scan_dir(local_dir: Path) -> list[tuple[str, Path]]:
    """(relative key, path) of every regular file under `local_dir`, sorted by key.

    The directory's own manifest and temporary files of interrupted writes are left out.
    Names that are not valid keys (control characters, ...) raise InvalidKeyError.
    """
    found: list[tuple[str, Path]] = []
    for path in local_dir.rglob("*"):
        if not path.is_file() or path.name.endswith(TEMP_SUFFIX):
            continue
        rel = path.relative_to(local_dir).as_posix()
        if rel == MANIFEST_NAME:
            continue
        found.append((validate_key(rel), path))
    return sorted(found)
