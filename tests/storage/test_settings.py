"""S3Settings: config over ENVACE_S3_* over AWS_*, endpoint parsing, masked secrets."""

from __future__ import annotations

from dataclasses import fields

import pytest

from envace.errors import ConfigError, UserInputError
from envace.storage import S3Settings, open_store
from envace.storage.settings import ENV_VARS

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzSECRET"


def test_envace_variables_win_over_aws_ones() -> None:
    env = {
        "ENVACE_S3_ENDPOINT": "http://minio.envace.svc:9000",
        "ENVACE_S3_ACCESS_KEY": "envace-key",
        "ENVACE_S3_SECRET_KEY": SECRET,
        "ENVACE_S3_REGION": "eu-west-3",
        "AWS_ENDPOINT_URL": "https://ignored.example.com",
        "AWS_ACCESS_KEY_ID": "ignored",
        "AWS_SECRET_ACCESS_KEY": "ignored",
        "AWS_DEFAULT_REGION": "us-west-2",
    }
    s = S3Settings.from_env(env)
    assert (s.endpoint, s.secure, s.access_key, s.secret_key, s.region) == (
        "minio.envace.svc:9000",
        False,
        "envace-key",
        SECRET,
        "eu-west-3",
    )


def test_aws_variables_are_the_fallback() -> None:
    env = {
        "AWS_ENDPOINT_URL": "https://s3.example.com",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-west-2",
        "AWS_SESSION_TOKEN": "token-123",
    }
    s = S3Settings.from_env(env)
    assert (s.endpoint, s.secure, s.access_key, s.region, s.session_token) == (
        "s3.example.com",
        True,
        "AKIAEXAMPLE",
        "us-west-2",
        "token-123",
    )


def test_config_mapping_wins_and_secure_flag_parses() -> None:
    env = {"ENVACE_S3_ENDPOINT": "env-host:9000", "ENVACE_S3_SECURE": "false"}
    s = S3Settings.resolve({"endpoint": "cfg-host:9000", "part_size": 8 * 1024 * 1024}, env)
    assert (s.endpoint, s.secure, s.part_size) == ("cfg-host:9000", False, 8 * 1024 * 1024)
    assert S3Settings.from_env({"ENVACE_S3_ENDPOINT": "h:1"}).secure is True


@pytest.mark.parametrize(
    ("config", "env", "fragment"),
    [
        ({"endpont": "x"}, {}, "unknown key"),
        ({}, {"ENVACE_S3_SECURE": "maybe"}, "ENVACE_S3_SECURE='maybe' is not a boolean"),
        (
            {},
            {"ENVACE_S3_ENDPOINT": "http://h:9000", "ENVACE_S3_SECURE": "true"},
            "make them agree",
        ),
        ({}, {"ENVACE_S3_ENDPOINT": "ftp://h:9000"}, "http(s)://host:port"),
        ({}, {"ENVACE_S3_ENDPOINT": "http://h:9000/path"}, "without a path"),
        ({"part_size": 1024}, {}, "part_size=1024"),
        ({}, {"ENVACE_S3_PART_SIZE": "16MiB"}, "ENVACE_S3_PART_SIZE='16MiB' is not an integer"),
        ({}, {"ENVACE_S3_READ_TIMEOUT_S": "soon"}, "ENVACE_S3_READ_TIMEOUT_S='soon' is not a"),
        ({}, {"ENVACE_S3_CONNECT_TIMEOUT_S": "0"}, "ENVACE_S3_CONNECT_TIMEOUT_S"),
        ({}, {"ENVACE_S3_PARALLEL_UPLOADS": "0"}, "ENVACE_S3_PARALLEL_UPLOADS): must be >= 1"),
        ({}, {"ENVACE_S3_CERT_CHECK": "sometimes"}, "ENVACE_S3_CERT_CHECK='sometimes'"),
        ({"parallel_uploads": True}, {}, "S3Settings.parallel_uploads=True is not a number"),
    ],
)
def test_bad_settings_name_the_key(
    config: dict[str, object], env: dict[str, str], fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        S3Settings.resolve(config, env)
    assert fragment in str(info.value)


def test_repr_masks_secrets() -> None:
    s = S3Settings(
        endpoint="h:9000", access_key="AKIAVISIBLE", secret_key=SECRET, session_token="tok"
    )
    for text in (repr(s), str(s), f"{s}"):
        assert SECRET not in text and "AKIAVISIBLE" not in text and "tok'" not in text
        assert "secret_key='***'" in text and "endpoint='h:9000'" in text


def test_missing_endpoint_or_credentials_name_the_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(UserInputError) as info:
        S3Settings.from_env({"ENVACE_S3_ENDPOINT": "h:9000"}).require("minio://b0b/x")
    message = str(info.value)
    assert "minio://b0b/x" in message
    assert "ENVACE_S3_ACCESS_KEY or ENVACE_S3_ACCESS_KEY_FILE or AWS_ACCESS_KEY_ID" in message
    assert "ENVACE_S3_SECRET_KEY or ENVACE_S3_SECRET_KEY_FILE or AWS_SECRET_ACCESS_KEY" in message
    assert "endpoint (" not in message  # the endpoint was given

    monkeypatch.delenv("ENVACE_S3_ENDPOINT", raising=False)
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(UserInputError, match="ENVACE_S3_ENDPOINT"):
        open_store("s3://bucket/key")


def test_every_field_has_an_environment_variable() -> None:
    """The commands only read the environment: every setting, tuning included, is reachable."""
    env = {
        "ENVACE_S3_ENDPOINT": "https://h:9000",
        "ENVACE_S3_ACCESS_KEY": "a",
        "ENVACE_S3_SECRET_KEY": "s",
        "ENVACE_S3_CERT_CHECK": "false",
        "ENVACE_S3_CONNECT_TIMEOUT_S": "2.5",
        "ENVACE_S3_READ_TIMEOUT_S": "30",
        "ENVACE_S3_PART_SIZE": str(32 * 1024 * 1024),
        "ENVACE_S3_PARALLEL_UPLOADS": "6",
    }
    s = S3Settings.from_env(env)
    assert (s.secure, s.cert_check, s.connect_timeout_s, s.read_timeout_s) == (
        True,
        False,
        2.5,
        30.0,
    )
    assert (s.part_size, s.parallel_uploads) == (32 * 1024 * 1024, 6)
    assert {f.name for f in fields(S3Settings)} == set(ENV_VARS)
