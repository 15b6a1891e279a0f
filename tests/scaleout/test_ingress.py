"""The OIP ingress over two replicas of one model, in one process (no Ray): requests go
to either replica, and statistics and /metrics add up over both exactly."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import orjson
import pytest
from scaleout_helpers import serve_fixtures

from turboinfer.scaleout.events import Event
from turboinfer.scaleout.forwarding import Forwarded, Reply, call_asgi
from turboinfer.scaleout.ingress import OipIngress, forwarded_model
from turboinfer.scaleout.replica import ModelReplica
from turboinfer.serve.config import AutoscalingConfig
from turboinfer.serve.core import ServerSettings


class RoundRobin:
    """Two replicas taking turns, as a router would spread requests."""

    def __init__(self, replicas: list[ModelReplica]) -> None:
        self.replicas = replicas
        self._next = itertools.cycle(replicas)

    async def handle(self, request: Forwarded) -> tuple[Reply, list[Event]]:
        return await next(self._next).handle(request)

    async def events(self) -> list[Event]:
        return await next(self._next).events()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    config = serve_fixtures.AFFINE_CONFIG.model_copy(
        update={"autoscaling": AutoscalingConfig(enabled=True)})
    serve_fixtures.write_entry(tmp_path / "repo", "affine", serve_fixtures.make_affine_onnx(
        tmp_path / "a.onnx", 2.0, 1.0), config)
    return tmp_path / "repo"


def _infer(rows: int) -> Forwarded:
    body = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                     "shape": [rows, 16], "data": [1.0] * 16 * rows}]})
    return Forwarded("POST", "/v2/models/affine/infer",
                     [(b"content-length", str(len(body)).encode())], body)


def test_paths_answered_by_a_replica() -> None:
    assert forwarded_model("/v2/models/m/infer") == "m"
    assert forwarded_model("/v2/models/m/versions/2/ready") == "m"
    assert forwarded_model("/v2/models/m") == "m"
    assert forwarded_model("/v2/models/m/stats") is None
    assert forwarded_model("/v2/models/stats") is None
    assert forwarded_model("/v2/health/ready") is None


def test_statistics_add_up_over_replicas(repo: Path) -> None:
    async def scenario() -> None:
        settings = ServerSettings(repository=repo)
        replicas = [await ModelReplica(str(repo), "affine", settings).start()
                    for _ in range(2)]
        # In the replica, Ray scales: the entry's in-server autoscaling is off.
        served = replicas[0].core.repository.get("affine", None)
        assert served.config.autoscaling.enabled is False
        ingress = OipIngress({"affine": RoundRobin(replicas)}, settings)
        try:
            replies = await asyncio.gather(*(call_asgi(ingress, _infer(rows))
                                             for rows in (1, 2, 3, 1, 2, 3)))
            assert [r.status for r in replies] == [200] * 6
            first = orjson.loads(replies[0].body)
            assert first["outputs"][0]["data"][:2] == [3.0, 3.0]
            bad = await call_asgi(ingress, _infer(9))  # over max_batch_size 8
            assert bad.status == 400 and b"exceeds max_batch_size" in bad.body
            missing = await call_asgi(ingress, Forwarded("POST", "/v2/models/x/infer", []))
            assert missing.status == 404 and b"unknown model 'x'" in missing.body
            stats = await call_asgi(ingress, Forwarded("GET", "/v2/models/affine/stats", []))
            model = orjson.loads(stats.body)["model_stats"][0]
            assert model["inference_count"] == 12  # rows, both replicas together
            assert model["inference_stats"]["success"]["count"] == 6
            assert model["inference_stats"]["fail"]["count"] == 1
            executed = sum(r.core.repository.statistics("affine", None)[0]["execution_count"]
                           for r in replicas)
            assert model["execution_count"] == executed
            metrics = (await call_asgi(ingress, Forwarded("GET", "/metrics", []))).body
            assert b'turboinfer_request_success_total{model="affine",version="1"} 6.0' in \
                metrics
            assert b"turboinfer_loaded_models 1.0" in metrics
            ready = await call_asgi(ingress, Forwarded("GET", "/v2/health/ready", []))
            assert ready.status == 200
        finally:
            for replica in replicas:
                await replica.shutdown()

    asyncio.run(scenario())
