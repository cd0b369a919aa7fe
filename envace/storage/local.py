"""`LocalStore`: a directory on the local file system (the embedded default)."""

from __future__ import annotations

import builtins
import os
import shutil
from pathlib import Path

from envace.storage.base import (
    TEMP_SUFFIX,
    Digest,
    ObjectInfo,
    ProgressCallback,
    atomic_target,
    copy_hashing,
    hash_file,
)
from envace.storage.errors import ObjectNotFoundError
from envace.storage.uri import validate_key

__all__ = ["LocalStore"]


class LocalStore:
    """Objects are files under `root`; a key's '/' separators become sub-folders."""

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.abspath(root))

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def path(self, key: str) -> Path:
        """The file that holds `key` (validated: it cannot escape `root`)."""
        validate_key(key, allow_empty=True)
        return self.root / key if key else self.root

    def uri(self, key: str = "") -> str:
        return str(self.path(key))

    def _existing(self, key: str) -> Path:
        path = self.path(key)
        if not path.is_file():
            raise ObjectNotFoundError(f"no file at {path}")
        return path

    def put_file(self, local: Path, key: str, progress: ProgressCallback | None = None) -> Digest:
        dest = self.path(key)
        if dest.exists() and os.path.samefile(local, dest):
            # Committing a folder in place: the bytes are already where they belong.
            return hash_file(local, progress)
        with open(local, "rb") as src, atomic_target(dest) as tmp, open(tmp, "wb") as dst:
            return copy_hashing(src, dst, progress)

    def get_file(self, key: str, local: Path, progress: ProgressCallback | None = None) -> Digest:
        src_path = self._existing(key)
        with open(src_path, "rb") as src, atomic_target(local) as tmp, open(tmp, "wb") as dst:
            return copy_hashing(src, dst, progress)

    def put_bytes(self, data: bytes, key: str) -> None:
        # Small objects are commit records (manifests): make them durable before they appear.
        with atomic_target(self.path(key), durable=True) as tmp:
            tmp.write_bytes(data)

    def get_bytes(self, key: str) -> bytes:
        return self._existing(key).read_bytes()

    def digest(self, key: str, progress: ProgressCallback | None = None) -> Digest:
        return hash_file(self._existing(key), progress)

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def list(self, prefix: str = "", *, recursive: bool = True) -> builtins.list[ObjectInfo]:
        base = self.path(prefix.rstrip("/"))
        if not base.is_dir():
            return []
        entries = base.rglob("*") if recursive else base.iterdir()
        found = []
        for path in entries:
            if path.name.endswith(TEMP_SUFFIX):
                continue
            key = path.relative_to(self.root).as_posix()
            if path.is_file():
                found.append(ObjectInfo(key, path.stat().st_size))
            elif not recursive and path.is_dir():
                found.append(ObjectInfo(key + "/", 0, is_dir=True))
        return sorted(found, key=lambda o: o.key)

    def copy(self, src_key: str, dst_key: str) -> None:
        src_path = self._existing(src_key)
        dest = self.path(dst_key)
        with open(src_path, "rb") as src, atomic_target(dest) as tmp, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1024 * 1024)

    def delete(self, key: str) -> bool:
        path = self.path(key)
        if not path.is_file():
            return False
        path.unlink()
        return True

    def delete_prefix(self, prefix: str) -> int:
        base = self.path(prefix.rstrip("/"))
        if not base.is_dir():
            return 0
        count = sum(1 for p in base.rglob("*") if p.is_file())
        if base == self.root:
            for child in base.iterdir():
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        else:
            shutil.rmtree(base)
        return count
