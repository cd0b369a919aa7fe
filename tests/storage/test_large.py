"""A 100 MB file through a real multipart upload and a streamed download, checked by sha256."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from envace.storage import commit_dir, fetch_dir, verify

MiB = 1024 * 1024
SIZE = 100 * MiB + 12345  # not a multiple of the part size: the last part is short


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 * MiB):
            digest.update(chunk)
    return digest.hexdigest()


@pytest.mark.slow
def test_100mb_multipart_round_trip(
    moto_endpoint: Any,
    make_settings: Any,
    bucket: str,
    raw_s3: Any,
    tmp_path: Path,
    random_file: Any,
) -> None:
    src = tmp_path / "src"
    random_file(src / "model.safetensors", SIZE, seed=42)
    expected = _sha256(src / "model.safetensors")
    settings = make_settings(moto_endpoint, part_size=16 * MiB, parallel_uploads=3)
    uri = f"minio://{bucket}/big/iter_000001"

    manifest = commit_dir(src, uri, settings)
    assert [(e.path, e.size, e.sha256) for e in manifest.files] == [
        ("model.safetensors", SIZE, expected)
    ]
    etag = raw_s3.stat_object(bucket, "big/iter_000001/model.safetensors").etag
    assert etag.endswith("-7")  # S3 marks a multipart object's ETag with its part count

    assert verify(uri, settings, deep=True) == manifest
    fetch_dir(uri, tmp_path / "out", settings)
    assert _sha256(tmp_path / "out" / "model.safetensors") == expected
