"""Credentials without static keys in the environment: key files (a Secret mounted as files) and
web-identity tokens exchanged at STS (EKS IRSA, MinIO's STS with an OpenID provider).

The STS is moto's, behind the storage tests' proxy (`FaultPlan.sts_token`): moto answers
AssumeRoleWithWebIdentity, the proxy only moves minio's URL parameters into the form body moto's
server routes by and refuses tokens it was not given. No MinIO server (with an OpenID provider)
or AWS STS can run here; the client code is the one production uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envace.errors import ConfigError, UserInputError
from envace.storage import S3Settings, open_store
from envace.storage.errors import StoreAccessError

TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6ZW52YWNlIn0.c2ln-SECRET"
ROLE = "arn:aws:iam::123456789012:role/envace-store"


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_key_files_sit_between_the_envace_and_the_aws_variables(tmp_path: Path) -> None:
    env = {
        "ENVACE_S3_ENDPOINT": "minio:9000",
        "ENVACE_S3_ACCESS_KEY_FILE": _write(tmp_path / "access", "from-file\n"),
        "ENVACE_S3_SECRET_KEY_FILE": _write(tmp_path / "secret", "  s3cr3t-from-file \n"),
        "ENVACE_S3_SESSION_TOKEN_FILE": _write(tmp_path / "session", "sess"),
        "AWS_ACCESS_KEY_ID": "aws-key",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
    }
    s = S3Settings.from_env(env)
    assert (s.access_key, s.secret_key, s.session_token) == (
        "from-file",
        "s3cr3t-from-file",
        "sess",
    )
    assert "s3cr3t" not in repr(s)
    s = S3Settings.from_env({**env, "ENVACE_S3_ACCESS_KEY": "direct"})
    assert (s.access_key, s.secret_key) == ("direct", "s3cr3t-from-file")


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "cannot read the file"), ("\n", "the file is empty"), ("x" * 70_000, "over 65536")],
)
def test_an_unusable_key_file_names_the_variable_and_the_path(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "secret"
    if content is not None:
        path.write_text(content)
    env = {"ENVACE_S3_ENDPOINT": "minio:9000", "ENVACE_S3_SECRET_KEY_FILE": str(path)}
    with pytest.raises(ConfigError, match=f"ENVACE_S3_SECRET_KEY_FILE={path}: {problem}"):
        S3Settings.from_env(env)


def test_a_token_file_replaces_the_keys_and_the_sts_endpoint_has_a_default() -> None:
    token_only = {"ENVACE_S3_ENDPOINT": "http://minio:9000", "AWS_WEB_IDENTITY_TOKEN_FILE": "/t"}
    s = S3Settings.from_env(token_only).require("minio://b/x")
    assert s.uses_web_identity and s.sts_url == "http://minio:9000"  # MinIO's own STS
    aws = S3Settings.from_env({**token_only, "ENVACE_S3_ENDPOINT": "https://s3.amazonaws.com"})
    assert aws.sts_url == "https://sts.amazonaws.com"
    regional = S3Settings.from_env(
        {
            **token_only,
            "ENVACE_S3_ENDPOINT": "s3.eu-west-3.amazonaws.com",
            "AWS_REGION": "eu-west-3",
        }
    )
    assert regional.sts_url == "https://sts.eu-west-3.amazonaws.com"
    explicit = S3Settings.from_env({**token_only, "AWS_ENDPOINT_URL_STS": "https://sts.corp:8443/"})
    assert explicit.sts_url == "https://sts.corp:8443"
    with pytest.raises(ConfigError, match=r"AWS_ENDPOINT_URL_STS='sts\.corp': give the scheme"):
        S3Settings.from_env({**token_only, "AWS_ENDPOINT_URL_STS": "sts.corp"})
    keys = {**token_only, "ENVACE_S3_ACCESS_KEY": "k", "ENVACE_S3_SECRET_KEY": "s"}
    assert not S3Settings.from_env(keys).uses_web_identity  # static keys win
    with pytest.raises(UserInputError, match="AWS_WEB_IDENTITY_TOKEN_FILE"):
        S3Settings.from_env({"ENVACE_S3_ENDPOINT": "minio:9000"}).require("minio://b/x")


def _web_identity_env(monkeypatch: pytest.MonkeyPatch, proxy: Any, token_file: Path | str) -> None:
    for name in ("ENVACE_S3_ACCESS_KEY", "ENVACE_S3_SECRET_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("ENVACE_S3_ENDPOINT", proxy.endpoint.url)
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("AWS_ROLE_ARN", ROLE)


def test_a_web_identity_token_gets_the_credentials_every_request_is_signed_with(
    env_s3: Any, flaky_proxy: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token file's content goes to STS with the role; the temporary key STS issued signs
    every S3 request; an upload and a download through the store work."""
    flaky_proxy.plan.sts_token = TOKEN
    _web_identity_env(monkeypatch, flaky_proxy, _write(tmp_path / "token", TOKEN + "\n"))
    store, prefix = open_store(f"minio://{bucket}/runs")
    src = tmp_path / "weights.bin"
    src.write_bytes(b"\x00\x01" * 5000)
    store.put_file(src, f"{prefix}/weights.bin")
    store.get_file(f"{prefix}/weights.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    assert flaky_proxy.plan.sts_calls == [("AssumeRoleWithWebIdentity", TOKEN, ROLE)]
    signed = set(flaky_proxy.plan.signed_by)
    assert len(signed) == 1 and len(flaky_proxy.plan.signed_by) >= 3
    assert signed != {"envace-test-access"}  # not the static test key: STS's temporary one


@pytest.mark.parametrize("case", ["refused", "unreadable"])
def test_a_refused_or_unreadable_token_is_an_access_error_that_never_shows_the_token(
    env_s3: Any,
    flaky_proxy: Any,
    bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    flaky_proxy.plan.sts_token = "the-token-sts-expects"
    token_file = tmp_path / "token"
    if case == "refused":
        token_file.write_text(TOKEN)
    _web_identity_env(monkeypatch, flaky_proxy, token_file)
    store, prefix = open_store(f"minio://{bucket}/runs")
    with pytest.raises(StoreAccessError) as caught:
        store.exists(f"{prefix}/x")
    message = str(caught.value)
    assert TOKEN not in message and "c2ln-SECRET" not in message
    if case == "refused":
        assert "AssumeRoleWithWebIdentity failed (HTTP 403)" in message
        assert ROLE in message and str(token_file) in message
    else:
        assert f"AWS_WEB_IDENTITY_TOKEN_FILE={token_file}: cannot read the file" in message
        assert flaky_proxy.plan.sts_calls == []
