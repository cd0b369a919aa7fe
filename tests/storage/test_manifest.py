"""Manifest format: round trip, and every malformed variant refused with the source named."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from envace.storage import ArtifactIntegrityError, InvalidKeyError, Manifest, ManifestEntry
from envace.storage.manifest import FORMAT_VERSION, scan_dir

SHA = hashlib.sha256(b"x").hexdigest()


def test_round_trip_is_sorted_and_exact() -> None:
    manifest = Manifest.build(
        [
            ManifestEntry("b/z.bin", 10, SHA),
            ManifestEntry("a.json", 1, SHA),
            ManifestEntry("é.txt", 0, SHA),
        ]
    )
    assert [e.path for e in manifest.files] == ["a.json", "b/z.bin", "é.txt"]
    assert manifest.total_size == 11
    doc = json.loads(manifest.to_json())
    assert doc["format_version"] == FORMAT_VERSION == 1
    assert doc["files"][0] == {"path": "a.json", "size": 1, "sha256": SHA}
    assert doc["created"].endswith("Z")
    assert Manifest.from_json(manifest.to_json(), "src") == manifest


def _doc(**changes: object) -> bytes:
    doc: dict[str, object] = {
        "format_version": 1,
        "created": "2026-11-29T00:00:00Z",
        "files": [{"path": "a", "size": 1, "sha256": SHA}],
    }
    doc.update(changes)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "top level is not an object"),
        (_doc(format_version=99), "format_version 99 is not supported"),
        (_doc(files="nope"), "'files' a list"),
        (_doc(files=[{"path": "../x", "size": 1, "sha256": SHA}]), "'..' segment"),
        (_doc(files=[{"path": "MANIFEST.json", "size": 1, "sha256": SHA}]), "bad file path"),
        (_doc(files=[{"path": "a", "size": -1, "sha256": SHA}]), "bad size -1"),
        (_doc(files=[{"path": "a", "size": True, "sha256": SHA}]), "bad size True"),
        (_doc(files=[{"path": "a", "size": 1, "sha256": "abc"}]), "bad sha256"),
        (_doc(files=[{"path": "a", "size": 1, "sha256": SHA}] * 2), "listed twice"),
    ],
)
def test_malformed_manifests_are_refused(data: bytes, fragment: str) -> None:
    with pytest.raises(ArtifactIntegrityError) as info:
        Manifest.from_json(data, "minio://b0b/run/MANIFEST.json")
    assert fragment in str(info.value)
    assert "minio://b0b/run/MANIFEST.json" in str(info.value)


def test_scan_dir_skips_own_manifest_and_temp_files(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.bin").write_bytes(b"1")
    (tmp_path / "sub" / "b.json").write_text("{}")
    (tmp_path / "MANIFEST.json").write_text("{}")
    (tmp_path / ".3f2a.envace-part").write_bytes(b"half")
    assert [rel for rel, _ in scan_dir(tmp_path)] == ["a.bin", "sub/b.json"]
    (tmp_path / "bad\nname").write_bytes(b"")
    with pytest.raises(InvalidKeyError):
        scan_dir(tmp_path)
