"""Artifact URIs and object keys.

A URI is a local path (`runs/x`, `/abs/path`, `file:///abs/path`), `minio://bucket/key` or
`s3://bucket/key`. Both object-store schemes speak the S3 protocol through the same client; the
endpoint comes from `S3Settings`, never from the URI. URIs are taken literally: no
percent-decoding, so a key may hold any printable unicode character.

Keys are validated before any I/O so that a hostile key can neither escape a local store's root
(`..`, absolute paths) nor smuggle control characters into logs and HTTP requests.
"""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import dataclass
from typing import Literal

from envace.errors import UserInputError
from envace.storage.errors import InvalidKeyError

__all__ = [
    "MAX_KEY_BYTES",
    "StoreURI",
    "join_key",
    "join_uri",
    "parse_uri",
    "redact_url",
    "validate_key",
]

# S3 and MinIO reject object names longer than 1024 bytes of UTF-8.
MAX_KEY_BYTES = 1024

Scheme = Literal["file", "s3", "minio"]
_OBJECT_SCHEMES: dict[str, Scheme] = {"s3": "s3", "minio": "minio"}
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
# S3 bucket naming rules: 3-63 characters, lowercase letters, digits, dots and hyphens.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class StoreURI:
    """A parsed URI. For `file`, `path` is absolute and `bucket`/`key` are empty."""

    scheme: Scheme
    bucket: str = ""
    key: str = ""
    path: str = ""

    def __str__(self) -> str:
        if self.scheme == "file":
            return self.path
        return (
            f"{self.scheme}://{self.bucket}/{self.key}"
            if self.key
            else (f"{self.scheme}://{self.bucket}")
        )

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"


def redact_url(url: str) -> str:
    """`url` without its user:password part (`http://u:p@host:9000/v1` -> `http://host:9000/v1`;
    a bare `u:p@host:9000` -> `host:9000`), so an endpoint can appear in errors and logs.

    Plain string work, no URL parser: it must also clean text no parser accepts (an unclosed
    IPv6 bracket). Everything up to the last '@' before any query or fragment goes, so a
    password holding an unescaped '/' is removed too (at worst, an '@' in a path shortens
    what is shown).
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = min((i for i in (rest.find(c) for c in "?#") if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, end)
    if at < 0:
        return url
    return f"{scheme}{sep}{rest[at + 1 :]}"


def _has_control_char(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in text)


def validate_key(key: str, *, allow_empty: bool = False) -> str:
    """Return `key` unchanged when it is a safe relative object key, else raise InvalidKeyError.

    Rejected: absolute keys, empty, `.` or `..` segments, backslashes (a path separator on some
    systems), control characters, unpaired surrogates and keys over 1024 UTF-8 bytes.
    """
    if key == "":
        if allow_empty:
            return key
        raise InvalidKeyError("empty object key: give a relative key such as 'run1/model.bin'")
    shown = ascii(key) if len(key) <= 80 else ascii(key[:80]) + "..."
    if _has_control_char(key):
        raise InvalidKeyError(f"object key {shown} contains a control character; remove it")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(f"object key {shown} is not valid unicode ({exc.reason})") from exc
    if size > MAX_KEY_BYTES:
        raise InvalidKeyError(
            f"object key {shown} is {size} bytes of UTF-8; the limit is {MAX_KEY_BYTES}"
        )
    if key.startswith("/"):
        raise InvalidKeyError(f"object key {shown} is absolute; keys are relative to the store")
    if "\\" in key:
        raise InvalidKeyError(f"object key {shown} contains a backslash; use '/' between parts")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidKeyError(
                f"object key {shown} has an empty, '.' or '..' segment; give a plain relative key"
            )
    return key


def join_key(*parts: str) -> str:
    """Join key parts with '/', skipping empty ones, and validate the result."""
    return validate_key("/".join(p.strip("/") for p in parts if p.strip("/")), allow_empty=True)


def _parse_object_uri(scheme: Scheme, rest: str, uri: str) -> StoreURI:
    bucket, _, key = rest.partition("/")
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise UserInputError(
            f"bad bucket name {bucket!r} in {uri!r}: use 3-63 lowercase letters, digits, '.' or '-'"
            f" (e.g. {scheme}://envace/runs/exp1)"
        )
    key = key.rstrip("/")
    return StoreURI(scheme=scheme, bucket=bucket, key=validate_key(key, allow_empty=True))


def parse_uri(uri: str) -> StoreURI:
    """Parse an artifact URI; raise UserInputError for empty input or an unsupported scheme."""
    if not uri or not uri.strip():
        raise UserInputError("empty artifact URI: give a local path, minio://bucket/key or s3://")
    if _has_control_char(uri):
        raise InvalidKeyError(f"artifact URI {uri!a} contains a control character")
    match = _SCHEME_RE.match(uri)
    if match is None:
        return StoreURI(scheme="file", path=os.path.abspath(uri))
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        if not rest.startswith("/"):
            raise UserInputError(f"file URI {uri!r} must be absolute: file:///abs/path")
        return StoreURI(scheme="file", path=os.path.abspath(rest))
    object_scheme = _OBJECT_SCHEMES.get(scheme)
    if object_scheme is not None:
        return _parse_object_uri(object_scheme, rest, uri)
    raise UserInputError(
        f"unsupported URI scheme {scheme!r} in {uri!r}: use a local path, minio://bucket/key or"
        " s3://bucket/key"
    )


def join_uri(uri: str, *parts: str) -> str:
    """`uri` with relative key parts appended (`join_uri("minio://b/run", "iter_000001")`)."""
    parsed = parse_uri(uri)
    tail = join_key(*parts)
    if parsed.is_local:
        return os.path.join(parsed.path, *tail.split("/")) if tail else parsed.path
    return str(StoreURI(parsed.scheme, parsed.bucket, join_key(parsed.key, tail)))
