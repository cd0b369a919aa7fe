"""URIs and keys: parsing, joining, and rejection of hostile keys before any I/O."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envace.errors import UserInputError
from envace.storage import InvalidKeyError, LocalStore, join_key, join_uri, parse_uri, validate_key

HOSTILE_KEYS = [
    "../etc/passwd",
    "a/../../b",
    "a/..",
    "./a",
    "a/./b",
    "/abs/path",
    "a//b",
    "a/",
    "a\\b",
    "a\x00b",
    "line\nbreak",
    "tab\there",
    "esc\x1b[31m",
    "del\x7f",
    "c1\x85",
    "x" * 1025,
    "é" * 513,  # 1026 bytes of UTF-8
    "bad\udc80surrogate",
]


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_hostile_keys_are_rejected(key: str) -> None:
    with pytest.raises(InvalidKeyError) as info:
        validate_key(key)
    assert "\x00" not in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "key",
    [
        "a",
        "run1/iter_000010/model.safetensors",
        "données/été.json",
        "日本語/キー",
        "emoji/🚀.bin",
        "spaces are fine/a b",
        "x" * 1024,
        "a..b/c.d",
        "?query=like&chars#frag",
    ],
)
def test_ordinary_and_unicode_keys_pass_unchanged(key: str) -> None:
    assert validate_key(key) == key


def test_empty_key_only_where_allowed() -> None:
    assert validate_key("", allow_empty=True) == ""
    with pytest.raises(InvalidKeyError):
        validate_key("")


def test_parse_object_uris() -> None:
    uri = parse_uri("minio://envace/runs/exp1/")
    assert (uri.scheme, uri.bucket, uri.key) == ("minio", "envace", "runs/exp1")
    assert str(uri) == "minio://envace/runs/exp1"
    root = parse_uri("s3://my.bucket-1")
    assert (root.scheme, root.bucket, root.key, str(root)) == (
        "s3",
        "my.bucket-1",
        "",
        "s3://my.bucket-1",
    )
    assert parse_uri("MINIO://envace/k").scheme == "minio"


def test_parse_local_paths(tmp_path: Path) -> None:
    assert parse_uri(str(tmp_path)).path == str(tmp_path)
    assert parse_uri(f"file://{tmp_path}").path == str(tmp_path)
    rel = parse_uri("runs/store")
    assert rel.is_local and rel.path == os.path.abspath("runs/store")


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("gs://bucket/key", "unsupported URI scheme 'gs'"),
        ("minio://Bad_Bucket/key", "bad bucket name"),
        ("minio://ab/key", "bad bucket name"),
        ("s3:///key", "bad bucket name"),
        ("file://relative/path", "must be absolute"),
        ("", "empty artifact URI"),
    ],
)
def test_bad_uris_say_what_to_do(uri: str, fragment: str) -> None:
    with pytest.raises(UserInputError, match=fragment):
        parse_uri(uri)


@pytest.mark.parametrize("uri", ["minio://b0b/../x", "s3://bucket/a//b", "minio://bucket/a\nb"])
def test_hostile_object_uris_are_rejected(uri: str) -> None:
    with pytest.raises(InvalidKeyError):
        parse_uri(uri)


def test_join() -> None:
    assert join_key("run", "", "/iter_000001/", "a.bin") == "run/iter_000001/a.bin"
    assert join_key() == ""
    assert (
        join_uri("minio://envace/run", "ckpt", "iter_000002")
        == "minio://envace/run/ckpt/iter_000002"
    )
    assert join_uri("minio://envace", "x") == "minio://envace/x"
    assert join_uri("/data/store", "a/b") == "/data/store/a/b"
    with pytest.raises(InvalidKeyError):
        join_uri("minio://envace/run", "..", "other")


@given(st.text(min_size=1, max_size=60))
def test_any_accepted_key_stays_inside_a_local_store(key: str) -> None:
    """Whatever text passes validation maps to a path under the store root."""
    store = LocalStore(Path("/srv/store"))
    try:
        validate_key(key)
    except InvalidKeyError:
        return
    resolved = os.path.normpath(store.path(key))
    assert resolved.startswith("/srv/store/")
