"""Bad input to the store: a local path that cannot take a download, a malformed S3 endpoint
or timeout, a server that never answers, a URI with nothing at it. Each ends in one message
naming the input and the fix, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from urllib3.exceptions import ConnectTimeoutError, ProtocolError, ReadTimeoutError

from envace.cli import main
from envace.errors import ConfigError, UserInputError
from envace.storage import RetryPolicy, S3Settings, StoreUnavailableError
from envace.storage.artifacts import commit_dir, fetch_dir
from envace.storage.retry import call_with_retry
from envace.storage.s3 import S3Store, is_transient
from tests.helpers.silent_server import silent_server


def _artifact(tmp_path: Path) -> str:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    uri = str(tmp_path / "art")
    commit_dir(src, uri)
    return uri


# ---------------------------------------------------------------------------------------------
# store get into a local path that cannot take it


def test_get_into_a_file_names_the_local_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = _artifact(tmp_path)
    dest = tmp_path / "afile"
    dest.write_text("keep")
    assert main(["store", "get", uri, str(dest)]) == 2
    err = capsys.readouterr().err
    assert f"cannot fetch {uri} into {dest}: it is a file, not a folder" in err
    assert "Traceback" not in err and dest.read_text() == "keep"


def test_get_with_a_folder_in_the_way_names_it_and_commits_nothing(tmp_path: Path) -> None:
    uri = _artifact(tmp_path)
    dest = tmp_path / "dest"
    (dest / "a.txt").mkdir(parents=True)  # a folder where the artifact has a file
    with pytest.raises(UserInputError) as info:
        fetch_dir(uri, dest)
    assert f"cannot fetch {uri} into {dest}: Is a directory at {dest / 'a.txt'}" in str(info.value)
    assert not (dest / "MANIFEST.json").exists()  # the partial copy is not a committed one
    assert [p.name for p in dest.iterdir()] == ["a.txt"]  # no temporary file left


def test_get_below_a_file_names_the_local_path(tmp_path: Path) -> None:
    uri = _artifact(tmp_path)
    blocker = tmp_path / "afile"
    blocker.write_text("")
    with pytest.raises(UserInputError, match=r"Not a directory at .*afile/x; pass a writable"):
        fetch_dir(uri, blocker / "x")


# ---------------------------------------------------------------------------------------------
# store ls of nothing


def test_ls_of_nothing_says_so_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing"
    assert main(["store", "ls", str(missing)]) == 1
    assert capsys.readouterr() == ("", f"envace store ls: nothing at {missing}\n")
    uri = _artifact(tmp_path)
    assert main(["store", "ls", uri]) == 0
    assert "a.txt" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# endpoint and timeout settings


@pytest.mark.parametrize(
    ("endpoint", "fragment"),
    [
        ("http://[::1", "Invalid IPv6 URL"),
        ("[::1", "Invalid IPv6 URL"),
        ("http://h:99999", "the port must be a number 1-65535"),
        ("h:abc", "the port must be a number 1-65535"),
        ("h:0", "the port must be a number 1-65535"),
        ("h:", "the port must be a number 1-65535"),
        (":9000", "no host name"),
        ("h:90\n00", "give host:port"),
    ],
)
def test_bad_endpoint_names_the_variable_and_the_form(endpoint: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        S3Settings.from_env({"ENVACE_S3_ENDPOINT": endpoint})
    message = str(info.value)
    assert message.startswith(f"ENVACE_S3_ENDPOINT={endpoint!r}: ")
    assert fragment in message and "host:port" in message


@pytest.mark.parametrize("endpoint", ["h:9000", "http://[::1]:9000", "[::1]:9000", "https://h"])
def test_good_endpoints_still_parse(endpoint: str) -> None:
    assert S3Settings.from_env({"ENVACE_S3_ENDPOINT": endpoint}).endpoint


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999"])
@pytest.mark.parametrize("var", ["ENVACE_S3_CONNECT_TIMEOUT_S", "ENVACE_S3_READ_TIMEOUT_S"])
def test_timeouts_must_be_finite(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"\\({var}\\): must be a finite number of seconds > 0"):
        S3Settings.from_env({var: value})


# ---------------------------------------------------------------------------------------------
# a server that times out: the message names the timeout variable


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def _give_up_on(error: BaseException) -> str:
    clock = _Clock()

    def fail() -> None:
        raise error

    with pytest.raises(StoreUnavailableError) as info:
        call_with_retry(
            fail,
            policy=RetryPolicy(max_attempts=2, base_delay=0.0, max_delay=0.0),
            is_transient=is_transient,
            operation="list",
            target="minio://b0b/k",
            endpoint="http://h:9000",
            sleep=clock.sleep,
            clock=clock,
        )
    return str(info.value)


def test_timeouts_name_their_variable() -> None:
    timed_out = ReadTimeoutError(None, "/", "Read timed out. (read timeout=120)")  # type: ignore[arg-type]
    read = _give_up_on(timed_out)
    assert "within ENVACE_S3_READ_TIMEOUT_S" in read
    connect = _give_up_on(ConnectTimeoutError("timed out"))
    assert "within ENVACE_S3_CONNECT_TIMEOUT_S" in connect
    # A body read cut by a socket timeout arrives as a ProtocolError that wraps it.
    wrapped = ProtocolError("Connection broken")
    wrapped.__cause__ = TimeoutError("timed out")
    assert "ENVACE_S3_READ_TIMEOUT_S" in _give_up_on(wrapped)
    refused = _give_up_on(ConnectionRefusedError("refused"))
    assert "TIMEOUT" not in refused and "(ENVACE_S3_ENDPOINT)" in refused


@pytest.fixture
def stuck_server() -> Iterator[int]:
    """A TCP server that accepts connections and never answers (a hung S3 server)."""
    with silent_server() as port:
        yield port


def test_stuck_server_error_names_the_read_timeout(stuck_server: int) -> None:
    settings = S3Settings(
        endpoint=f"127.0.0.1:{stuck_server}",
        access_key="a",
        secret_key="s",
        secure=False,
        read_timeout_s=0.2,
    )
    fast = RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.01, total_budget_s=5.0)
    store = S3Store(settings, "bucket", retry=fast)
    with pytest.raises(StoreUnavailableError) as info:
        store.list("")
    message = str(info.value)
    assert "ReadTimeoutError" in message and "ENVACE_S3_READ_TIMEOUT_S" in message
