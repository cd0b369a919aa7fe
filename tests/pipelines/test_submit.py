"""`envace pipeline submit` through the real `kfp.Client` against a fake KFP API server.

Test double: no Kubeflow Pipelines backend can run here, so a small HTTP server answers the
v2beta1 REST calls the client makes (healthz, experiment lookup and creation, run creation) and
records them; the tests check what the client sent: experiment, run name, the compiled pipeline
spec and the typed run parameters. Bad input (a host, a parameter, a package) must fail with one
line, before any request where it can, and in bounded time: a plain TCP server that accepts and
never answers stands in for a dead port-forward.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from envace.cli import main
from pipelines import submit as pipeline_submit
from pipelines.submit import packaged_pipeline
from tests.helpers.silent_server import silent_server

PACKAGE = Path(__file__).resolve().parents[2] / "pipelines" / "envace_pipeline.yaml"


@dataclass
class FakeKfp:
    url: str
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    # Experiment calls: answered with this (status, body) instead; or held until `release`.
    experiments: tuple[int, Any] | None = None
    stall: bool = False
    release: threading.Event = field(default_factory=threading.Event)

    def posted(self, prefix: str) -> list[Any]:
        return [
            body
            for method, path, body in self.requests
            if method == "POST" and path.startswith(prefix)
        ]


def _handler(fake: FakeKfp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the fake records requests itself."""

        def _send(self, payload: Any, code: int = 200) -> None:
            raw = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            fake.requests.append(("GET", self.path, None))
            if self.path.startswith("/apis/v2beta1/healthz"):
                self._send({"multi_user": False})
            elif self.path.startswith("/apis/v2beta1/experiments"):
                if fake.stall:
                    fake.release.wait(30)
                if fake.experiments is not None:
                    self._send(fake.experiments[1], fake.experiments[0])
                else:
                    self._send({})  # no experiment of that name yet
            else:
                self._send({"error": f"no route {self.path}"}, 404)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            fake.requests.append(("POST", self.path, body))
            if self.path.startswith("/apis/v2beta1/experiments"):
                self._send({"experiment_id": "exp-42", "display_name": body["display_name"]})
            elif self.path.startswith("/apis/v2beta1/runs"):
                self._send(
                    {
                        "run_id": "run-0b7e",
                        "display_name": body["display_name"],
                        "experiment_id": body["experiment_id"],
                    }
                )
            else:
                self._send({"error": f"no route {self.path}"}, 404)

    return Handler


@pytest.fixture
def fake_kfp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeKfp]:
    monkeypatch.setenv("HOME", str(tmp_path))  # kfp.Client reads ~/.config/kfp/context.json
    fake = FakeKfp("")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield fake
    fake.release.set()
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def silent_host() -> Iterator[str]:
    """http://127.0.0.1:PORT of a TCP server that accepts connections and never answers."""
    with silent_server() as port:
        yield f"http://127.0.0.1:{port}"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _submit_err(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["pipeline", "submit", *argv, "--package", str(PACKAGE)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_submit_starts_a_run_with_typed_parameters(
    fake_kfp: FakeKfp, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["pipeline", "submit", "--host", fake_kfp.url, "--experiment", "rl-sweeps"]
    argv += ["--run-name", "lr-2e-6", "--no-cache"]  # the package installed with envace
    argv += ["--param", "store=minio://team/runs", "--param", "train_nodes=2"]
    argv += ["--param", "eval_rehearsal=parallel:4"]
    argv += ["--set", "train.lr=2e-6", "--set", "rollout.n=8"]
    assert main(argv) == 0
    (experiment,) = fake_kfp.posted("/apis/v2beta1/experiments")
    assert experiment["display_name"] == "rl-sweeps"
    (run,) = fake_kfp.posted("/apis/v2beta1/runs")
    assert run["display_name"] == "lr-2e-6" and run["experiment_id"] == "exp-42"
    assert run["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "envace"
    params = run["runtime_config"]["parameters"]
    assert params["store"] == "minio://team/runs"
    assert params["train_nodes"] == 2  # an integer, as the pipeline declares it
    assert params["eval_rehearsal"] == "parallel:4"
    # a struct of the changes from the defaults
    assert params["config"] == {"train": {"lr": 2e-6}, "rollout": {"n": 8}}
    # --no-cache turns caching off for every task, prepare included
    tasks = run["pipeline_spec"]["pipeline_spec"]["root"]["dag"]["tasks"]
    assert not any(t.get("cachingOptions", {}).get("enableCache") for t in tasks.values())
    assert "started run run-0b7e in experiment 'rl-sweeps'" in capsys.readouterr().out
    assert packaged_pipeline() == PACKAGE


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("rounds=3", "no such parameter; it takes config, eval_rehearsal, gpu_node_selector, gpu"),
        ("gpus=two", "--param gpus=two: expected an integer"),
        (
            "gpu_node_selector=pool=gpu",
            "--param gpu_node_selector=pool=gpu: expected a JSON object",
        ),
        ("gpu_tolerations={}", "--param gpu_tolerations={}: expected a JSON list"),
        ("train_nodes=two", "--param train_nodes=two: expected an integer"),
        ("store", "expected KEY=VALUE"),
        ("train_nodes=-3", "--param train_nodes=-3: must be 1 or more"),
        ("train_nodes=0", "--param train_nodes=0: must be 1 or more"),
        ("train_gpus_per_node=-1", "--param train_gpus_per_node=-1: must be 0 or more"),
        ("store=ftp://x", "--param store=ftp://x: unsupported URI scheme 'ftp'"),
        ("store=runs/here", "--param store=runs/here: a local folder"),
        ("store_endpoint=notaurl", "--param store_endpoint='notaurl': give host:port"),
        ("store_endpoint=http://m:99999", "--param store_endpoint='http://m:99999': the port"),
        ("config={bad", "--param config={bad: expected a JSON object"),
        ("config=train: {lr: 1}", "--param config=train: {lr: 1}: expected a JSON object"),
        ("config=[1, 2]", "--param config=[1, 2]: expected a JSON object"),
        ('config={"nokey": 1}', "--param config: <root>: unknown key 'nokey'"),
        ('config={"train": {"lr": -1}}', "--param config: train.lr"),
        ("eval_rehearsal=foo:3", "--param eval_rehearsal=foo:3: expected parallel:N"),
        ("eval_rehearsal=parallel:0", "--param eval_rehearsal=parallel:0: expected parallel:N"),
        ("image=", "--param image=: must be a non-empty name"),
        ("trainjob_runtime=a b", "--param trainjob_runtime=a b: must be a non-empty name"),
    ],
)
def test_bad_parameters_are_refused_before_any_request(
    fake_kfp: FakeKfp, capsys: pytest.CaptureFixture[str], param: str, message: str
) -> None:
    assert message in _submit_err(capsys, "--host", fake_kfp.url, "--param", param)
    assert fake_kfp.requests == []


@pytest.mark.parametrize("value", ["", "parallel:2", " sequential:1 "])
def test_good_rehearsal_values_pass_as_the_step_reads_them(value: str) -> None:
    inputs = {"eval_rehearsal": "STRING"}
    assert pipeline_submit.parse_params([f"eval_rehearsal={value}"], inputs) == {
        "eval_rehearsal": value
    }


def test_placement_parameters_pass_as_json_values() -> None:
    inputs = {"gpus": "NUMBER_INTEGER", "gpu_node_selector": "STRUCT", "gpu_tolerations": "LIST"}
    items = [
        "gpus=8",
        'gpu_node_selector={"pool": "h100"}',
        'gpu_tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]',
    ]
    assert pipeline_submit.parse_params(items, inputs) == {
        "gpus": 8,
        "gpu_node_selector": {"pool": "h100"},
        "gpu_tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
    }


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("notaurl", "--host 'notaurl': not an http(s) URL"),
        ("ftp://kfp:8080", "--host 'ftp://kfp:8080': not an http(s) URL"),
        ("http://", "--host 'http://': not an http(s) URL"),
        ("http://kfp:99999", "--host 'http://kfp:99999': Port out of range"),
        ("http://kfp:0", "--host 'http://kfp:0': not an http(s) URL"),
    ],
)
def test_a_host_that_is_no_http_url_is_refused(
    capsys: pytest.CaptureFixture[str], host: str, message: str
) -> None:
    assert message in _submit_err(capsys, "--host", host)


def test_an_unreachable_host_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    host = f"http://127.0.0.1:{_closed_port()}"
    err = _submit_err(capsys, "--host", host)
    assert f"cannot reach Kubeflow Pipelines at {host}: " in err
    assert "kubectl port-forward -n kubeflow svc/ml-pipeline-ui 8080:80" in err


def test_a_host_that_never_answers_fails_in_bounded_time(
    silent_host: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(pipeline_submit, "KFP_CHECK_TIMEOUT_S", 0.5)
    started = time.monotonic()
    err = _submit_err(capsys, "--host", silent_host + "/")
    assert time.monotonic() - started < 10
    assert f"cannot reach Kubeflow Pipelines at {silent_host}: it accepted" in err
    assert "did not answer within 0.5 s" in err


def test_a_run_creation_that_never_ends_is_given_up(
    fake_kfp: FakeKfp, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_kfp.stall = True  # healthz answers, the experiment lookup never does
    monkeypatch.setattr(pipeline_submit, "KFP_SUBMIT_TIMEOUT_S", 1.0)
    started = time.monotonic()
    err = _submit_err(capsys, "--host", fake_kfp.url)
    assert time.monotonic() - started < 15
    assert "did not finish starting the run within 1 s" in err
    assert "look in its UI before submitting again" in err


def test_an_api_refusal_is_one_line(fake_kfp: FakeKfp, capsys: pytest.CaptureFixture[str]) -> None:
    fake_kfp.experiments = (403, {"error": "denied", "message": "user alice may not list"})
    err = _submit_err(capsys, "--host", fake_kfp.url)
    assert f"Kubeflow Pipelines at {fake_kfp.url} refused the run: 403" in err
    assert "user alice may not list" in err
    assert not fake_kfp.posted("/apis/v2beta1/runs")


@pytest.mark.parametrize(
    "text",
    ["a: [unclosed\n", "a: 1\n", "", "- just\n- a list\n", "root: 3\npipelineInfo: {}\n"],
)
def test_a_package_that_is_not_a_compiled_pipeline_is_named(
    fake_kfp: FakeKfp, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    package = tmp_path / "bad.yaml"
    package.write_text(text)
    argv = ["pipeline", "submit", "--host", fake_kfp.url, "--package", str(package)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{package}: not a compiled pipeline (envace pipeline compile writes one)" in err
    assert "Traceback" not in err and fake_kfp.requests == []


def test_a_missing_package_names_the_compile_command(
    fake_kfp: FakeKfp, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["pipeline", "submit", "--host", fake_kfp.url, "--package", str(tmp_path / "no.yaml")]
    assert main(argv) == 2
    assert "envace pipeline compile --out pipelines/envace_pipeline.yaml" in capsys.readouterr().err
