"""S3Store against a real S3-protocol server over HTTP: keys, errors, retries, secrets.

Faults come from a real HTTP proxy in front of the server (see conftest.py): it answers 503
SlowDown, holds responses past the client's read timeout, or cuts a body mid-stream.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envace.storage import (
    InvalidKeyError,
    ObjectInfo,
    ObjectNotFoundError,
    RetryEvent,
    RetryPolicy,
    StoreAccessError,
    StoreUnavailableError,
    commit_dir,
    fetch_dir,
    verify,
)
from envace.storage.base import CHUNK_SIZE
from envace.storage.s3 import S3Store

MiB = 1024 * 1024
UNICODE_KEYS = [
    "données/été.json",
    "日本語/キー.txt",
    "emoji/🚀 launch.bin",
    "sp ace/+plus&amp=%20",
]


def test_unicode_keys_round_trip(s3_settings: Any, bucket: str, tmp_path: Path) -> None:
    store = S3Store(s3_settings, bucket)
    for i, key in enumerate(UNICODE_KEYS):
        store.put_bytes(f"payload {i}".encode(), key)
    assert [o.key for o in store.list("")] == sorted(UNICODE_KEYS)
    for i, key in enumerate(UNICODE_KEYS):
        assert store.exists(key)
        assert store.get_bytes(key) == f"payload {i}".encode()
        assert (
            store.get_file(key, tmp_path / f"{i}.out").sha256
            == hashlib.sha256(f"payload {i}".encode()).hexdigest()
        )


def test_hostile_keys_fail_before_any_request(
    make_settings: Any, flaky_proxy: Any, bucket: str, tmp_path: Path
) -> None:
    store = S3Store(make_settings(flaky_proxy.endpoint), bucket)
    (tmp_path / "f").write_bytes(b"x")
    for key in ("../escape", "/abs", "a//b", "ctl\x07", "x" * 1025):
        with pytest.raises(InvalidKeyError):
            store.put_file(tmp_path / "f", key)
        with pytest.raises(InvalidKeyError):
            store.get_bytes(key)
    assert flaky_proxy.plan.log == []


def test_list_copy_delete(s3_settings: Any, bucket: str) -> None:
    store = S3Store(s3_settings, bucket)
    store.put_bytes(b"12345", "run/x/a.bin")
    store.put_bytes(b"1", "run/y.txt")
    store.put_bytes(b"other", "runner/z.txt")  # shares the string prefix "run", not the folder
    assert store.list("run") == [ObjectInfo("run/x/a.bin", 5), ObjectInfo("run/y.txt", 1)]
    assert store.list("run/", recursive=False) == [
        ObjectInfo("run/x/", 0, is_dir=True),
        ObjectInfo("run/y.txt", 1),
    ]
    store.copy("run/x/a.bin", "run/copy.bin")
    assert store.get_bytes("run/copy.bin") == b"12345"
    assert store.delete_prefix("run") == 3
    assert [o.key for o in store.list("")] == ["runner/z.txt"]
    assert not store.delete("run/y.txt")
    with pytest.raises(ObjectNotFoundError, match=f"minio://{bucket}/run/y.txt"):
        store.get_bytes("run/y.txt")


def test_missing_bucket_fails_at_once(
    make_settings: Any, flaky_proxy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(flaky_proxy.endpoint)
    start = time.monotonic()
    with pytest.raises(StoreAccessError) as info:
        verify("minio://no-such-bucket-here/run", settings)
    message = str(info.value)
    assert "bucket 'no-such-bucket-here' does not exist" in message
    assert flaky_proxy.endpoint.url in message and "Create it" in message
    assert time.monotonic() - start < 2.0
    assert len(flaky_proxy.plan.log) == 1  # one request, no retries
    assert not [r for r in caplog.records if "retry" in r.getMessage()]


# -- credentials: moto checks them only in its IAM-auth mode ---------------------------------


@pytest.fixture
def iam_auth(moto_endpoint: Any, bucket: str) -> Iterator[dict[str, tuple[str, str]]]:
    """Turn on moto's request authentication and create two IAM users.

    moto accepts any credentials by default. Its server-mode switch `POST /moto-api/reset-auth`
    (body: how many requests stay unauthenticated; 0 = check all from now on) makes it verify
    the SigV4 signature against IAM access keys and apply IAM policies, as AWS and MinIO do.
    `allowed` has an s3:* policy, `denied` has none. Depends on `bucket` so that the bucket is
    created before and emptied after authentication is on.
    """
    import boto3

    iam = boto3.client(
        "iam",
        endpoint_url=moto_endpoint.url,
        region_name="us-east-1",
        aws_access_key_id="setup",
        aws_secret_access_key="setup",
    )
    keys = {}
    for role in ("allowed", "denied"):
        user = f"{role}-{uuid.uuid4().hex[:8]}"
        iam.create_user(UserName=user)
        if role == "allowed":
            policy = {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
            }
            iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        keys[role] = (key["AccessKeyId"], key["SecretAccessKey"])

    def set_auth(unauthenticated_requests: str) -> None:
        request = urllib.request.Request(
            f"{moto_endpoint.url}/moto-api/reset-auth",
            data=unauthenticated_requests.encode(),
            headers={"Content-Type": "text/plain"},  # a form type would swallow the body
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as resp:
            assert resp.status == 200

    set_auth("0")
    yield keys
    set_auth("inf")


def test_bad_credentials_fail_at_once_with_a_clear_error(
    moto_endpoint: Any,
    make_settings: Any,
    bucket: str,
    iam_auth: dict[str, tuple[str, str]],
    tmp_path: Path,
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    uri = f"minio://{bucket}/auth"
    access, secret = iam_auth["allowed"]
    good = make_settings(moto_endpoint, access_key=access, secret_key=secret, region="us-east-1")
    commit_dir(tmp_path / "src", uri, good)  # the real keys work: auth is really on
    assert verify(uri, good, deep=True).files[0].path == "a.txt"

    denied_access, denied_secret = iam_auth["denied"]
    # (access key, secret key, S3 error code the server gives on a request with a body)
    cases = {
        "unknown access key": ("AKIANOTAREALKEY00000", secret, "InvalidAccessKeyId"),
        "wrong secret": (access, secret[::-1], "SignatureDoesNotMatch"),
        "no permission": (denied_access, denied_secret, "AccessDenied"),
    }
    slow_retry = RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=1.0, total_budget_s=30)
    for what, (ak, sk, code) in cases.items():
        # region=None: the first request is GetBucketLocation, whose XML body names the code;
        # a fixed region makes it a HEAD, whose bodiless 403 only says AccessDenied.
        for region, expected in ((None, code), ("us-east-1", "AccessDenied")):
            settings = make_settings(moto_endpoint, access_key=ak, secret_key=sk, region=region)
            start = time.monotonic()
            with pytest.raises(StoreAccessError) as info:
                verify(uri, settings, retry=slow_retry)
            assert time.monotonic() - start < 1.0, f"{what}: retried instead of failing"
            message = str(info.value)
            assert f"refused by {moto_endpoint.url}: {expected}" in message, what
            assert "ENVACE_S3_ACCESS_KEY" in message and "AWS_SECRET_ACCESS_KEY" in message
            assert sk not in message


def test_secrets_reach_no_log_record_and_no_error(
    moto_endpoint: Any,
    make_settings: Any,
    bucket: str,
    secret_key: str,
    fast_retry: RetryPolicy,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, urllib3 and moto included
    settings = make_settings(moto_endpoint)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "w.bin").write_bytes(b"w" * (6 * MiB))
    texts = [repr(settings), str(settings)]
    commit_dir(tmp_path / "src", f"minio://{bucket}/s", settings)
    fetch_dir(f"minio://{bucket}/s", tmp_path / "out", settings)
    failures = [
        lambda: verify(f"minio://{bucket}/absent", settings),
        lambda: verify("minio://no-bucket-x/s", settings),
        lambda: verify(
            f"minio://{bucket}/s", settings.with_overrides(endpoint="127.0.0.1:9"), retry=fast_retry
        ),
    ]
    for failure in failures:
        with pytest.raises(Exception) as info:
            failure()
        texts += [str(info.value), repr(info.value), str(info.value.__cause__)]
    texts += [record.getMessage() for record in caplog.records]
    assert len(caplog.records) > 10
    assert not [t for t in texts if secret_key in t]


# -- transient faults through the proxy --------------------------------------------------------


def _proxied(make_settings: Any, proxy: Any, **overrides: Any) -> Any:
    # A fixed region skips the GetBucketLocation request, so the plan's faults hit the requests
    # under test.
    return make_settings(proxy.endpoint, region="us-east-1", **overrides)


def test_5xx_is_retried_then_succeeds(
    make_settings: Any, flaky_proxy: Any, bucket: str, fast_retry: RetryPolicy, tmp_path: Path
) -> None:
    events: list[RetryEvent] = []
    store = S3Store(
        _proxied(make_settings, flaky_proxy), bucket, retry=fast_retry, on_retry=events.append
    )
    flaky_proxy.plan.faults = [("503", 0), ("503", 0)]
    flaky_proxy.plan.only_method = "PUT"
    store.put_bytes(b"survived", "k.txt")
    assert [e.attempt for e in events] == [1, 2]
    assert all("SlowDown" in str(e.error) for e in events)
    assert store.get_bytes("k.txt") == b"survived"


def test_5xx_forever_ends_in_a_clear_error_within_budget(
    make_settings: Any, flaky_proxy: Any, bucket: str, tmp_path: Path
) -> None:
    policy = RetryPolicy(max_attempts=5, base_delay=0.02, max_delay=0.1, total_budget_s=5)
    store = S3Store(_proxied(make_settings, flaky_proxy), bucket, retry=policy)
    store.put_bytes(b"x", "k.txt")
    flaky_proxy.plan.faults = [("503", 0)] * 50
    start = time.monotonic()
    with pytest.raises(StoreUnavailableError) as info:
        store.get_bytes("k.txt")
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert f"read minio://{bucket}/k.txt failed on endpoint {flaky_proxy.endpoint.url}" in message
    assert "after 5 attempt(s)" in message and "SlowDown" in message
    assert len(flaky_proxy.plan.faults) == 45


def test_read_timeout_is_retried(
    make_settings: Any, flaky_proxy: Any, bucket: str, fast_retry: RetryPolicy
) -> None:
    events: list[RetryEvent] = []
    settings = _proxied(make_settings, flaky_proxy, read_timeout_s=0.3)
    store = S3Store(settings, bucket, retry=fast_retry, on_retry=events.append)
    store.put_bytes(b"late", "k.txt")
    flaky_proxy.plan.faults = [("hang", 1.0)]
    flaky_proxy.plan.only_method = "GET"
    assert store.get_bytes("k.txt") == b"late"
    assert len(events) == 1 and "ReadTimeoutError" in type(events[0].error).__name__


def test_download_cut_mid_body_resumes_with_a_range_request(
    make_settings: Any,
    flaky_proxy: Any,
    bucket: str,
    fast_retry: RetryPolicy,
    tmp_path: Path,
    random_file: Any,
) -> None:
    src = random_file(tmp_path / "big.bin", 20 * MiB + 5, seed=7)
    store = S3Store(_proxied(make_settings, flaky_proxy), bucket, retry=fast_retry)
    sent = store.put_file(src, "big.bin")
    flaky_proxy.plan.log.clear()
    flaky_proxy.plan.faults = [("cut", 12 * MiB)]
    flaky_proxy.plan.only_method = "GET"
    moved: list[int] = []
    got = store.get_file("big.bin", tmp_path / "big.out", progress=moved.append)
    assert got == sent and sum(moved) == 20 * MiB + 5
    assert hashlib.sha256((tmp_path / "big.out").read_bytes()).hexdigest() == sent.sha256
    gets = [
        (method, rng, fault) for method, _, rng, fault in flaky_proxy.plan.log if method == "GET"
    ]
    assert gets[0] == ("GET", "", "cut")
    # Whole chunks that arrived before the cut are kept; the retry asks only for the rest.
    resumed_at = int(gets[1][1].removeprefix("bytes=").removesuffix("-"))
    assert gets[1][0] == "GET" and gets[1][2] == ""
    assert 0 < resumed_at <= 12 * MiB and resumed_at % CHUNK_SIZE == 0
