"""`S3Store`: a bucket on MinIO or any S3 endpoint, through the `minio` SDK.

Uploads go through `put_object` with a fixed part size: the SDK reads one part at a time and keeps
at most `parallel_uploads` parts in flight, so memory stays flat for multi-GB shards while the
file is hashed as it is read. Downloads stream the body in chunks into a temporary file; a
transient failure mid-body resumes with a Range request pinned to the first response's ETag.

Failures are sorted once, in `_translate`: transient ones (refused or reset connections,
timeouts, 5xx) are retried by `RetryPolicy`; wrong credentials, missing permission or a missing
bucket fail at once. The SDK's own urllib3 retries are off, so our budget is the only one.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import io
import logging
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import certifi
import urllib3
from minio import Minio
from minio.commonconfig import CopySource
from minio.credentials.credentials import Credentials
from minio.credentials.providers import Provider, WebIdentityProvider
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, S3Error, ServerError
from urllib3.exceptions import HTTPError, ProtocolError
from urllib3.exceptions import TimeoutError as Urllib3TimeoutError

from envace.errors import ConfigError
from envace.storage.base import (
    CHUNK_SIZE,
    Digest,
    HashingReader,
    ObjectInfo,
    ProgressCallback,
    atomic_target,
)
from envace.storage.errors import (
    ObjectNotFoundError,
    StoreAccessError,
    StoreError,
)
from envace.storage.retry import RetryEvent, RetryPolicy, call_with_retry
from envace.storage.settings import ENV_VARS, S3Settings, read_secret_file
from envace.storage.uri import Scheme, StoreURI, validate_key

__all__ = ["S3Store", "is_transient"]

log = logging.getLogger(__name__)
T = TypeVar("T")
MiB = 1024 * 1024

_AUTH_CODES = frozenset(
    {
        "AccessDenied",
        "AccountProblem",
        "AllAccessDisabled",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
    }
)
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "OperationAborted",
        "RequestTimeout",
        "ServiceUnavailable",
        "SlowDown",
        "XMinioServerNotInitialized",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "ResourceNotFound"})
_TRANSIENT_NETWORK = (Urllib3TimeoutError, ProtocolError, ConnectionError, socket.timeout)
_TOKEN_VARS = " / ".join(ENV_VARS["web_identity_token_file"])


def is_transient(exc: BaseException) -> bool:
    """True for failures a later attempt may not meet: network trouble, timeouts, 5xx."""
    if isinstance(exc, S3Error):
        status = getattr(exc.response, "status", 0) or 0
        return exc.code in _TRANSIENT_CODES or status >= 500
    if isinstance(exc, ServerError):
        return bool(exc.status_code >= 500)
    if isinstance(exc, InvalidResponseError):
        # A proxy's HTML 502/503 page arrives as a non-XML response.
        return int(getattr(exc, "_code", 0) or 0) >= 500
    return isinstance(exc, _TRANSIENT_NETWORK)


@functools.lru_cache(maxsize=16)
def _client_for(settings: S3Settings) -> Minio:
    """One client (and connection pool) per settings, shared by every store in the process."""
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=settings.connect_timeout_s, read=settings.read_timeout_s),
        maxsize=max(10, settings.parallel_uploads + 2),
        # No urllib3 retries: RetryPolicy is the only, bounded, retry loop.
        retries=False,
        cert_reqs="CERT_REQUIRED" if settings.cert_check else "CERT_NONE",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
    )
    credentials = _WebIdentity(settings, http) if settings.uses_web_identity else None
    return Minio(
        str(settings.endpoint),
        access_key=settings.access_key,
        secret_key=settings.secret_key,
        session_token=settings.session_token,
        secure=settings.secure,
        region=settings.region,
        http_client=http,
        credentials=credentials,
        cert_check=settings.cert_check,
    )


class _WebIdentity(Provider):  # type: ignore[misc]
    """Temporary credentials from STS `AssumeRoleWithWebIdentity` (EKS IRSA, or MinIO's STS with
    an OpenID provider), renewed by the SDK when they expire. The token file is read at every
    renewal (the kubelet rotates it). A refusal is a `StoreAccessError` naming the variables;
    its text never holds the token (the SDK's own error carries it in the request URL)."""

    def __init__(self, settings: S3Settings, http: urllib3.PoolManager) -> None:
        self._settings = settings
        self._sts = WebIdentityProvider(
            jwt_provider_func=self._token,
            sts_endpoint=settings.sts_url,
            role_arn=settings.role_arn,
            role_session_name="envace",
            http_client=http,
        )

    def _token(self) -> dict[str, str]:
        token = read_secret_file(str(self._settings.web_identity_token_file), _TOKEN_VARS)
        return {"access_token": token, "expires_in": "0"}

    def retrieve(self) -> Credentials:
        try:
            return self._sts.retrieve()
        except _TRANSIENT_NETWORK:
            raise  # the store's retry policy takes these
        except ConfigError as exc:  # the token file
            raise StoreAccessError(f"web-identity credentials: {exc}") from None
        except Exception as exc:  # the SDK raises ValueError, XML parse errors, ...
            status = re.search(r"HTTP status code (\d+)", str(exc))
            why = f"HTTP {status.group(1)}" if status else type(exc).__name__
            s = self._settings
            role = s.role_arn or f"(none: {' / '.join(ENV_VARS['role_arn'])})"
            raise StoreAccessError(
                f"no credentials from {s.sts_url}: AssumeRoleWithWebIdentity failed ({why})"
                f" for role {role} with the token in {s.web_identity_token_file}. Check the"
                " role's trust policy for this service account, the token's audience, and"
                f" {' / '.join(ENV_VARS['sts_endpoint'])}; or set static keys"
                f" ({ENV_VARS['access_key'][0]} / {ENV_VARS['secret_key'][0]})"
            ) from None


@dataclass
class _ReadState:
    """Where a streamed download stands, so a retry resumes instead of restarting."""

    offset: int = 0
    total: int | None = None
    etag: str | None = None


class S3Store:
    """Objects in one bucket of an S3-protocol server; keys are object names."""

    def __init__(
        self,
        settings: S3Settings,
        bucket: str,
        *,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[RetryEvent], None] | None = None,
        scheme: Scheme = "minio",
    ) -> None:
        self.settings = settings
        self.bucket = bucket
        self.retry = retry or RetryPolicy()
        self.on_retry = on_retry
        self._scheme = scheme
        self._client = _client_for(settings)
        self._bucket_checked = False

    def __repr__(self) -> str:
        return f"S3Store(bucket={self.bucket!r}, endpoint={self.settings.endpoint_url!r})"

    def uri(self, key: str = "") -> str:
        return str(StoreURI(self._scheme, self.bucket, validate_key(key, allow_empty=True)))

    # -- error handling ---------------------------------------------------------------------

    def _translate(self, exc: BaseException, operation: str, target: str) -> StoreError:
        endpoint = self.settings.endpoint_url
        if isinstance(exc, S3Error):
            code, message = exc.code or "unknown", exc.message or ""
            if code in _AUTH_CODES:
                keys = " / ".join(ENV_VARS["access_key"][:1] + ENV_VARS["secret_key"][:1])
                return StoreAccessError(
                    f"{operation} {target} refused by {endpoint}: {code} ({message}). Check the"
                    f" credentials ({keys}, or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) and"
                    f" that they may access bucket {self.bucket!r}"
                )
            if code == "NoSuchBucket":
                return self._missing_bucket(operation, target)
            if code in _NOT_FOUND_CODES:
                return ObjectNotFoundError(f"no object at {target} (endpoint {endpoint})")
            return StoreError(f"{operation} {target} failed on {endpoint}: {code}: {message}")
        return StoreError(
            f"{operation} {target} failed on {endpoint}: {type(exc).__name__}: {exc}. Check"
            " ENVACE_S3_ENDPOINT / ENVACE_S3_SECURE and the server's TLS certificate"
        )

    def _missing_bucket(self, operation: str, target: str) -> StoreAccessError:
        return StoreAccessError(
            f"{operation} {target}: bucket {self.bucket!r} does not exist on"
            f" {self.settings.endpoint_url}. Create it (`mc mb`, or the Helm chart's bucket-init"
            " job) or fix the bucket in the URI"
        )

    def _call(self, operation: str, key: str, fn: Callable[[], T]) -> T:
        target = self.uri(key)
        try:
            return call_with_retry(
                fn,
                policy=self.retry,
                is_transient=is_transient,
                operation=operation,
                target=target,
                endpoint=self.settings.endpoint_url,
                on_retry=self.on_retry,
            )
        except (S3Error, ServerError, InvalidResponseError, HTTPError) as exc:
            raise self._translate(exc, operation, target) from exc

    def _run(self, operation: str, key: str, fn: Callable[[], T]) -> T:
        """`_call`, after checking once that the bucket exists and the credentials work."""
        if not self._bucket_checked:
            if not self._call("check bucket", "", lambda: self._client.bucket_exists(self.bucket)):
                raise self._missing_bucket(operation, self.uri(key))
            self._bucket_checked = True
        return self._call(operation, key, fn)

    # -- objects ----------------------------------------------------------------------------

    def put_file(self, local: Path, key: str, progress: ProgressCallback | None = None) -> Digest:
        validate_key(key)
        size = os.stat(local).st_size
        # S3 allows 10,000 parts: grow the part for huge files instead of failing.
        part_size = max(self.settings.part_size, -(-size // (10_000 * MiB)) * MiB)

        def attempt() -> Digest:
            with open(local, "rb") as fh:
                reader = HashingReader(fh, progress)
                try:
                    self._client.put_object(
                        self.bucket,
                        key,
                        reader,
                        size,
                        part_size=part_size,
                        num_parallel_uploads=self.settings.parallel_uploads,
                    )
                except BaseException:
                    if progress is not None and reader.bytes_read:
                        progress(-reader.bytes_read)  # the retry sends these bytes again
                    raise
            digest = reader.digest()
            if digest.size != size:
                raise StoreError(f"{local} changed size while uploading to {self.uri(key)}")
            return digest

        return self._run("upload", key, attempt)

    def _stream(
        self,
        key: str,
        operation: str,
        sink: Callable[[bytes], Any] | None,
        progress: ProgressCallback | None,
    ) -> Digest:
        validate_key(key)
        state = _ReadState()
        hasher = hashlib.sha256()

        def attempt() -> Digest:
            if state.total is not None and state.offset >= state.total:
                return Digest(state.offset, hasher.hexdigest())
            headers = {"If-Match": state.etag} if state.etag else None
            resp = self._client.get_object(
                self.bucket, key, offset=state.offset, request_headers=headers
            )
            try:
                if state.total is None:
                    state.etag = resp.headers.get("ETag")
                    state.total = int(resp.headers.get("Content-Length", "0"))
                for chunk in resp.stream(CHUNK_SIZE):
                    if sink is not None:
                        sink(chunk)
                    hasher.update(chunk)
                    state.offset += len(chunk)
                    if progress is not None:
                        progress(len(chunk))
            finally:
                resp.close()
                resp.release_conn()
            return Digest(state.offset, hasher.hexdigest())

        return self._run(operation, key, attempt)

    def get_file(self, key: str, local: Path, progress: ProgressCallback | None = None) -> Digest:
        with atomic_target(local) as tmp, open(tmp, "wb") as fh:
            return self._stream(key, "download", fh.write, progress)

    def digest(self, key: str, progress: ProgressCallback | None = None) -> Digest:
        return self._stream(key, "hash", None, progress)

    def put_bytes(self, data: bytes, key: str) -> None:
        validate_key(key)

        def attempt() -> None:
            self._client.put_object(self.bucket, key, io.BytesIO(data), len(data))

        self._run("upload", key, attempt)

    def get_bytes(self, key: str) -> bytes:
        validate_key(key)

        def attempt() -> bytes:
            resp = self._client.get_object(self.bucket, key)
            try:
                return bytes(resp.read())
            finally:
                resp.close()
                resp.release_conn()

        return self._run("read", key, attempt)

    def exists(self, key: str) -> bool:
        validate_key(key)

        def attempt() -> bool:
            try:
                self._client.stat_object(self.bucket, key)
            except S3Error as exc:
                if exc.code in _NOT_FOUND_CODES:
                    return False
                raise
            return True

        return self._run("stat", key, attempt)

    def list(self, prefix: str = "", *, recursive: bool = True) -> builtins.list[ObjectInfo]:
        prefix = validate_key(prefix.rstrip("/"), allow_empty=True)

        def attempt() -> builtins.list[ObjectInfo]:
            objects = self._client.list_objects(
                self.bucket, prefix=prefix + "/" if prefix else None, recursive=recursive
            )
            return [ObjectInfo(o.object_name, o.size or 0, bool(o.is_dir)) for o in objects]

        return sorted(self._run("list", prefix, attempt), key=lambda o: o.key)

    def copy(self, src_key: str, dst_key: str) -> None:
        validate_key(src_key)
        validate_key(dst_key)

        def attempt() -> None:
            # The SDK switches to a multipart server-side copy above 5 GiB.
            self._client.copy_object(self.bucket, dst_key, CopySource(self.bucket, src_key))

        self._run("copy", dst_key, attempt)

    def delete(self, key: str) -> bool:
        if not self.exists(key):
            return False
        self._run("delete", key, lambda: self._client.remove_object(self.bucket, key))
        return True

    def delete_prefix(self, prefix: str) -> int:
        keys = [o.key for o in self.list(prefix)]

        def attempt() -> None:
            errors = builtins.list(
                self._client.remove_objects(self.bucket, [DeleteObject(k) for k in keys])
            )
            if errors:
                raise StoreError(
                    f"deleting under {self.uri(prefix)} failed for {len(errors)} object(s),"
                    f" e.g. {errors[0].name}: {errors[0].code}"
                )

        if keys:
            self._run("delete", prefix, attempt)
        return len(keys)
