"""Artifacts: directories committed to a store with a manifest written last.

    commit_dir(local_dir, uri)  upload every file (hashing as it streams), then MANIFEST.json
    fetch_dir(uri, local_dir)   download, check every size and sha256, write the manifest last
    verify(uri, deep=False)     manifest present, every file present with its size (deep: sha256)

Several processes can commit one directory together (the ranks of a training job, each with
its own shard files): the writer calls `uncommit`, every process `upload_files` its part, and
the writer then `write_manifest`s the union of their entries.

A commit stores regular files only: symbolic links are refused unless followed on request,
dangling links and special files always, temporary files of killed writers are left out (see
`scan_dir`); a download never writes through a link in its destination.

A reader trusts a directory only when its manifest is present and matches. So a writer killed at
any point leaves nothing a reader accepts: before the manifest lands the directory is "partial",
and re-committing over an existing artifact removes its old manifest first.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from envace.errors import UserInputError
from envace.storage.base import (
    ArtifactStore,
    Digest,
    ProgressCallback,
    atomic_target,
    fsync_files,
)
from envace.storage.errors import (
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    ObjectNotFoundError,
    UnsafeTreeError,
)
from envace.storage.local import LocalStore
from envace.storage.manifest import MANIFEST_NAME, Manifest, ManifestEntry, scan_dir
from envace.storage.retry import RetryPolicy
from envace.storage.settings import S3Settings
from envace.storage.uri import join_key, join_uri, parse_uri

__all__ = [
    "commit_dir",
    "fetch_dir",
    "open_store",
    "read_manifest",
    "uncommit",
    "upload_files",
    "verify",
    "write_manifest",
]

log = logging.getLogger(__name__)


def open_store(
    uri: str, config: S3Settings | None = None, *, retry: RetryPolicy | None = None
) -> tuple[ArtifactStore, str]:
    """Resolve `uri` to a store and the key prefix inside it.

    A local path gives a `LocalStore` rooted at that path (prefix ""). `minio://` and `s3://`
    give an `S3Store` on the bucket; settings default to `S3Settings.from_env()`.
    """
    parsed = parse_uri(uri)
    if parsed.is_local:
        return LocalStore(Path(parsed.path)), ""
    settings = (config or S3Settings.from_env()).require(uri)
    # Imported here: the minio SDK costs ~0.2 s to import, and local runs never need it.
    from envace.storage.s3 import S3Store

    store = S3Store(settings, parsed.bucket, retry=retry, scheme=parsed.scheme)
    return store, parsed.key


def _same_dir(store: ArtifactStore, local_dir: Path) -> bool:
    if not isinstance(store, LocalStore) or not store.root.is_dir() or not local_dir.is_dir():
        return False
    return os.path.samefile(store.root, local_dir)


def _read(store: ArtifactStore, prefix: str, uri: str) -> Manifest:
    try:
        data = store.get_bytes(join_key(prefix, MANIFEST_NAME))
    except ObjectNotFoundError:
        if store.list(prefix):
            raise ArtifactIntegrityError(
                f"partial artifact at {uri}: files are there but no {MANIFEST_NAME}, so it was"
                " never committed (an interrupted upload?). Re-run the step that writes it, or"
                " `envace store put`"
            ) from None
        raise ArtifactNotFoundError(f"no artifact at {uri}: nothing is stored there") from None
    return Manifest.from_json(data, source=join_uri(uri, MANIFEST_NAME))


def read_manifest(
    uri: str, config: S3Settings | None = None, *, retry: RetryPolicy | None = None
) -> Manifest:
    """The manifest of the artifact at `uri` (ArtifactIntegrityError when missing or malformed)."""
    store, prefix = open_store(uri, config, retry=retry)
    return _read(store, prefix, uri)


def uncommit(
    uri: str, config: S3Settings | None = None, *, retry: RetryPolicy | None = None
) -> bool:
    """Remove `uri`'s manifest (if any): from now on readers see a partial artifact."""
    store, prefix = open_store(uri, config, retry=retry)
    removed = store.delete(join_key(prefix, MANIFEST_NAME))
    if removed:
        # Un-commit first: a reader must never accept old manifest + half-replaced files.
        log.info("re-committing %s: removed its old manifest", uri)
    return removed


def _source_files(
    local_dir: str | Path, follow_symlinks: bool
) -> tuple[Path, list[tuple[str, Path]]]:
    """The folder to commit and its files; refused (nothing stored yet) when it is no folder
    or holds what an artifact cannot store (see `scan_dir`)."""
    src = Path(local_dir)
    if not src.is_dir():
        raise UserInputError(f"cannot commit {src}: not a directory")
    return src, scan_dir(src, follow_symlinks=follow_symlinks)


def _links_on_paths(base: Path, rels: Iterable[str]) -> list[str]:
    """The paths under `base` on the way to (or at) one of `rels` that are symbolic links:
    writing there would write wherever the link points."""
    found: list[str] = []
    checked: set[str] = set()
    for rel in rels:
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if sub not in checked:
                checked.add(sub)
                if (base / sub).is_symlink():
                    found.append(f"{base / sub} -> {os.readlink(base / sub)}")
                    break
    return found


def _refuse_links(base: Path, rels: Iterable[str], action: str) -> None:
    links = _links_on_paths(base, rels)
    if links:
        shown = ", ".join(links[:3]) + (", ..." if len(links) > 3 else "")
        raise UnsafeTreeError(
            f"{action}: {shown} is a symbolic link, and writing through it would put files"
            f" outside {base}; remove the link(s) or choose an empty folder"
        )


def _upload(
    src: Path,
    files: list[tuple[str, Path]],
    uri: str,
    config: S3Settings | None,
    retry: RetryPolicy | None,
    progress: ProgressCallback | None,
) -> list[ManifestEntry]:
    store, prefix = open_store(uri, config, retry=retry)
    if isinstance(store, LocalStore) and not _same_dir(store, src):
        keys = [join_key(prefix, rel) for rel, _ in files]
        _refuse_links(
            store.root, [*keys, join_key(prefix, MANIFEST_NAME)], f"cannot store at {uri}"
        )
    entries = []
    for rel, path in files:
        try:
            digest = store.put_file(path, join_key(prefix, rel), progress)
        except OSError as exc:  # an unreadable file, or a full local store
            raise UserInputError(
                f"cannot commit {src} to {uri}: {exc.strerror or exc} at"
                f" {exc.filename or path}; fix it and commit again (nothing was committed)"
            ) from exc
        entries.append(ManifestEntry(rel, digest.size, digest.sha256))
    if isinstance(store, LocalStore):
        # The manifest must never reach the disk before the files it vouches for.
        fsync_files(store.path(join_key(prefix, e.path)) for e in entries)
    return entries


def upload_files(
    local_dir: str | Path,
    uri: str,
    config: S3Settings | None = None,
    *,
    retry: RetryPolicy | None = None,
    progress: ProgressCallback | None = None,
    follow_symlinks: bool = False,
) -> list[ManifestEntry]:
    """Store every file of `local_dir` at `uri` (durably) and return their manifest entries;
    no manifest is written. Symbolic links are refused unless `follow_symlinks` (see
    `scan_dir`)."""
    src, files = _source_files(local_dir, follow_symlinks)
    return _upload(src, files, uri, config, retry, progress)


def write_manifest(
    uri: str,
    entries: list[ManifestEntry],
    config: S3Settings | None = None,
    *,
    retry: RetryPolicy | None = None,
) -> Manifest:
    """Commit `uri`: write MANIFEST.json over `entries` (files already stored)."""
    store, prefix = open_store(uri, config, retry=retry)
    manifest = Manifest.build(entries)
    store.put_bytes(manifest.to_json(), join_key(prefix, MANIFEST_NAME))
    log.info("committed %s: %d file(s), %d bytes", uri, len(entries), manifest.total_size)
    return manifest


def commit_dir(
    local_dir: str | Path,
    uri: str,
    config: S3Settings | None = None,
    *,
    retry: RetryPolicy | None = None,
    progress: ProgressCallback | None = None,
    follow_symlinks: bool = False,
) -> Manifest:
    """Store every file of `local_dir` at `uri`, then write MANIFEST.json last.

    Committing a local folder onto itself only hashes the files and writes the manifest. The
    folder is scanned before anything changes at `uri`: a folder that is refused (symbolic
    links without `follow_symlinks`, dangling links, special files) leaves an artifact already
    there committed as it was.
    """
    src, files = _source_files(local_dir, follow_symlinks)
    uncommit(uri, config, retry=retry)
    entries = _upload(src, files, uri, config, retry, progress)
    return write_manifest(uri, entries, config, retry=retry)


def _local_copy_matches(local_dir: Path, manifest: Manifest) -> bool:
    """True when `local_dir` holds a committed copy of `manifest` (same entries and sizes)."""
    try:
        local = Manifest.from_json((local_dir / MANIFEST_NAME).read_bytes(), str(local_dir))
    except (OSError, ArtifactIntegrityError):
        return False
    if local.files != manifest.files:
        return False
    return all(
        (local_dir / e.path).is_file() and (local_dir / e.path).stat().st_size == e.size
        for e in manifest.files
    )


def _fetch_one(
    store: ArtifactStore,
    key: str,
    entry: ManifestEntry,
    target: Path,
    uri: str,
    progress: ProgressCallback | None,
) -> None:
    try:
        got = store.get_file(key, target, progress)
    except ObjectNotFoundError:
        raise ArtifactIntegrityError(
            f"corrupt artifact at {uri}: {entry.path} is listed in the manifest but missing;"
            " re-commit the artifact"
        ) from None
    if got != Digest(entry.size, entry.sha256):
        target.unlink(missing_ok=True)
        raise ArtifactIntegrityError(
            f"corrupt artifact at {uri}: {entry.path} has {got.size} bytes, sha256"
            f" {got.sha256[:16]}..., but the manifest says {entry.size} bytes, sha256"
            f" {entry.sha256[:16]}...; re-commit the artifact"
        )


def fetch_dir(
    uri: str,
    local_dir: str | Path,
    config: S3Settings | None = None,
    *,
    retry: RetryPolicy | None = None,
    progress: ProgressCallback | None = None,
) -> Manifest:
    """Download the committed artifact at `uri` into `local_dir`, checking every file.

    Refuses (ArtifactIntegrityError) a missing, partial or corrupt artifact, and (UnsafeTreeError,
    before writing anything) a `local_dir` where a symbolic link sits on the path of a file to
    write: nothing is ever written through a link (`local_dir` itself may be one). The local copy gets
    its manifest last, so it is itself a committed artifact; when `local_dir` already holds a
    committed copy of the same manifest (same files and sizes) nothing is downloaded.
    """
    store, prefix = open_store(uri, config, retry=retry)
    dest = Path(local_dir)
    if dest.exists() and not dest.is_dir():
        raise UserInputError(
            f"cannot fetch {uri} into {dest}: it is a file, not a folder; pass a folder path"
        )
    if _same_dir(store, dest):
        return verify(uri, deep=True, progress=progress)
    manifest = _read(store, prefix, uri)
    _refuse_links(
        dest, [MANIFEST_NAME, *(e.path for e in manifest.files)], f"cannot fetch {uri} into {dest}"
    )
    if _local_copy_matches(dest, manifest):
        log.info("%s already holds %s; nothing to download", dest, uri)
        return manifest
    try:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / MANIFEST_NAME).unlink(missing_ok=True)
        for entry in manifest.files:
            key = join_key(prefix, entry.path)
            _fetch_one(store, key, entry, dest / entry.path, uri, progress)
        fsync_files(dest / e.path for e in manifest.files)
        with atomic_target(dest / MANIFEST_NAME, durable=True) as tmp:
            tmp.write_bytes(manifest.to_json())
    except OSError as exc:
        raise _local_write_error(uri, dest, exc) from exc
    log.info("fetched %s into %s: %d file(s)", uri, dest, len(manifest.files))
    return manifest


def _local_write_error(uri: str, dest: Path, exc: OSError) -> UserInputError:
    """The local side of a download failed (a folder where a file goes, no permission, a full
    disk): name the local path, since the artifact itself is fine. The copy stays without a
    manifest, so nothing reads it as complete."""
    # os.replace reports (temporary file, target): the target is the path the user knows.
    path = exc.filename2 if exc.filename2 is not None else exc.filename
    where = f" at {path}" if path is not None else ""
    return UserInputError(
        f"cannot fetch {uri} into {dest}: {exc.strerror or exc}{where}; pass a writable local"
        " folder (and remove anything in the way)"
    )


def _problems(
    store: ArtifactStore,
    prefix: str,
    manifest: Manifest,
    deep: bool,
    progress: ProgressCallback | None,
) -> list[str]:
    sizes = {o.key: o.size for o in store.list(prefix)}
    problems = []
    for entry in manifest.files:
        key = join_key(prefix, entry.path)
        if key not in sizes:
            problems.append(f"{entry.path} (missing)")
        elif sizes[key] != entry.size:
            problems.append(f"{entry.path} (size {sizes[key]}, manifest says {entry.size})")
        elif deep and store.digest(key, progress).sha256 != entry.sha256:
            problems.append(f"{entry.path} (sha256 differs from the manifest)")
    return problems


def verify(
    uri: str,
    config: S3Settings | None = None,
    *,
    deep: bool = False,
    retry: RetryPolicy | None = None,
    progress: ProgressCallback | None = None,
) -> Manifest:
    """Check the artifact at `uri` in place; return its manifest or raise ArtifactIntegrityError.

    Shallow: the manifest is present and valid, and every file it lists exists with its size.
    Deep: also re-hash every file by streaming it (nothing is kept).
    """
    store, prefix = open_store(uri, config, retry=retry)
    manifest = _read(store, prefix, uri)
    problems = _problems(store, prefix, manifest, deep, progress)
    if problems:
        shown = ", ".join(problems[:5]) + (", ..." if len(problems) > 5 else "")
        raise ArtifactIntegrityError(
            f"corrupt artifact at {uri}: {len(problems)} of {len(manifest.files)} file(s) bad:"
            f" {shown}. Re-commit it from its source"
        )
    return manifest
