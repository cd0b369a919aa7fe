"""`envace pipeline submit` through the real `kfp.Client` against a fake KFP API server.

Test double: no Kubeflow Pipelines backend can run here, so a small HTTP server answers the
v2beta1 REST calls the client makes (healthz, experiment lookup and creation, run creation) and
records them; the tests check what the client sent: experiment, run name, the compiled pipeline
spec and the typed run parameters.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from envace.cli import main
from envace.pipeline_cli import packaged_pipeline

PACKAGE = Path(__file__).resolve().parents[2] / "pipelines" / "envace_pipeline.yaml"


@dataclass
class FakeKfp:
    url: str
    requests: list[tuple[str, str, Any]] = field(default_factory=list)

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
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


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
    config = json.loads(params["config"])
    assert config["train"]["lr"] == 2e-6 and config["rollout"]["n"] == 8
    # --no-cache turns caching off for every task, prepare included
    tasks = run["pipeline_spec"]["pipeline_spec"]["root"]["dag"]["tasks"]
    assert not any(t.get("cachingOptions", {}).get("enableCache") for t in tasks.values())
    assert "started run run-0b7e in experiment 'rl-sweeps'" in capsys.readouterr().out
    assert packaged_pipeline() == PACKAGE


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("rounds=3", "no such parameter; it takes config, eval_rehearsal, image, store"),
        ("train_nodes=two", "--param train_nodes=two: expected an integer"),
        ("store", "expected KEY=VALUE"),
    ],
)
def test_bad_parameters_are_refused_before_any_request(
    fake_kfp: FakeKfp, capsys: pytest.CaptureFixture[str], param: str, message: str
) -> None:
    argv = ["pipeline", "submit", "--host", fake_kfp.url, "--param", param]
    assert main([*argv, "--package", str(PACKAGE)]) == 2
    assert message in capsys.readouterr().err
    assert fake_kfp.requests == []


def test_a_missing_package_names_the_compile_command(
    fake_kfp: FakeKfp, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["pipeline", "submit", "--host", fake_kfp.url, "--package", str(tmp_path / "no.yaml")]
    assert main(argv) == 2
    assert "envace pipeline compile --out pipelines/envace_pipeline.yaml" in capsys.readouterr().err
