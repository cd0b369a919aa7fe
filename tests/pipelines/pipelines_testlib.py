"""Test double of the Kubernetes side for the pipeline tests (see conftest.py for why)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cluster_testlib import _TRAINJOB, FakeApiServer, FakeCluster, _Handler, write_kubeconfig


# --- fake Kubernetes API with pods, logs and a stand-in Trainer controller --------------------
@dataclass
class FakeTrainer:
    """What the fake API server knows beyond tests/cluster's: pod logs per TrainJob, and
    `on_start(trainjob, configmap)`, called when a TrainJob's ConfigMap arrives (its pods would
    start then), standing in for the nodes running the job."""

    api: FakeApiServer
    logs: dict[str, str] = field(default_factory=dict)
    on_start: Callable[[dict[str, Any], dict[str, Any]], None] | None = None
    errors: list[BaseException] = field(default_factory=list)
    # The nodes of each started TrainJob, running `on_start` in the background (a real job runs
    # after the API has answered): until they finish, the job reads as pending.
    nodes: dict[str, threading.Thread] = field(default_factory=dict)

    @property
    def cluster(self) -> FakeCluster:
        return self.api.cluster


def _pod(name: str, namespace: str, job: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": job,
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
            },
        }
    }


class _TrainerHandler(_Handler):
    trainer: FakeTrainer

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if method == "GET" and parts[:2] == ["api", "v1"] and len(parts) >= 5:
            if parts[4] == "pods" and len(parts) == 5:
                items = [
                    _pod(f"{job}-node-0-{i}-x", parts[3], job)
                    for i, job in enumerate(self.trainer.logs)
                ]
                return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
            if parts[4] == "pods" and len(parts) == 7 and parts[6] == "log":
                job = parts[5].split("-node-")[0]
                return 200, self.trainer.logs.get(job, "").encode()
        match = _TRAINJOB.match(path)
        running = match and (node := self.trainer.nodes.get(match["name"] or "")) is not None
        if method == "GET" and running and node.is_alive():
            return 200, {**self.cluster.trainjobs[match["name"]], "status": {}}  # pending
        code, payload = super()._route(method, path, body)
        if method == "POST" and parts[-1] == "configmaps" and self.trainer.on_start is not None:
            owner = body["metadata"]["ownerReferences"][0]["name"]
            start, trainjob = self.trainer.on_start, self.cluster.trainjobs[owner]

            def run_nodes() -> None:
                try:
                    start(trainjob, body)
                except BaseException as exc:  # surfaced by the test, not lost in this thread
                    self.trainer.errors.append(exc)

            node = threading.Thread(target=run_nodes, name=f"nodes-{owner}", daemon=True)
            self.trainer.nodes[owner] = node
            node.start()
        return code, payload


@contextlib.contextmanager
def serve_fake_trainer(tmp_path: Path) -> Iterator[FakeTrainer]:
    cluster = FakeCluster()
    trainer = FakeTrainer(FakeApiServer(cluster, "", tmp_path / "kubeconfig"))
    handler = type("Handler", (_TrainerHandler,), {"cluster": cluster, "trainer": trainer})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    trainer.api = FakeApiServer(cluster, url, write_kubeconfig(tmp_path / "kubeconfig", url))
    try:
        yield trainer
    finally:
        for node in trainer.nodes.values():
            node.join(timeout=300)
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
