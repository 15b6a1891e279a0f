"""``turboinfer deploy kserve``: the manifests for a repository entry of builtin:digits-cnn
as ``tune`` writes it, checked against KServe's field names, and the server image's
entry point (the Dockerfile's, and the ServingRuntime's command) run locally."""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from turboinfer.cli import main
from turboinfer.models import resolve_model
from turboinfer.serve.config import (
    AutoscalingConfig,
    DynamicBatching,
    EngineSettingsConfig,
    ModelConfig,
    write_entry,
)

ROOT = Path(__file__).resolve().parents[2]

# The JSON names of KServe's Go types (kserve/kserve pkg/apis/serving): a key outside
# these is one KServe would reject or ignore.
SERVING_RUNTIME_SPEC = {  # v1alpha1.ServingRuntimeSpec with ServingRuntimePodSpec inline
    "supportedModelFormats", "multiModel", "disabled", "protocolVersions", "workerSpec",
    "containers", "volumes", "nodeSelector", "affinity", "tolerations", "labels",
    "annotations", "imagePullSecrets", "hostIPC", "grpcEndpoint", "grpcDataEndpoint",
    "httpDataEndpoint", "replicas", "storageHelper", "builtInAdapter"}
SUPPORTED_MODEL_FORMAT = {"name", "version", "autoSelect", "priority"}
COMPONENT_EXTENSION = {  # v1beta1.ComponentExtensionSpec, inline in PredictorSpec
    "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "containerConcurrency",
    "timeout", "canaryTrafficPercent", "logger", "batcher", "labels", "annotations",
    "deploymentStrategy"}
MODEL_SPEC = {"modelFormat", "runtime", "storageUri", "runtimeVersion", "protocolVersion",
              "storage"}  # v1beta1.ModelSpec with PredictorExtensionSpec inline
CONTAINER = {  # core/v1 Container, inline in the ModelSpec and a runtime's containers
    "name", "image", "command", "args", "workingDir", "ports", "envFrom", "env",
    "resources", "volumeMounts", "livenessProbe", "readinessProbe", "startupProbe",
    "lifecycle", "securityContext", "imagePullPolicy"}
SCALE_METRICS = {"cpu", "memory", "concurrency", "rps"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The entry ``tune builtin:digits-cnn`` writes (the model file, a tuned config with
    an autoscaling section, and its report's chosen plan), without the search."""
    root = tmp_path_factory.mktemp("tuned")
    onnx = resolve_model("builtin:digits-cnn").artifact.onnx_path
    config = ModelConfig(max_batch_size=16, instances=2,
                         dynamic_batching=DynamicBatching(max_queue_delay_ms=1.0),
                         engine_settings=EngineSettingsConfig(intra_op_threads=1),
                         autoscaling=AutoscalingConfig(enabled=True, min_instances=1,
                                                       max_instances=4))
    write_entry(root, "digits-cnn", onnx, config)
    (root / "digits-cnn" / "tune").mkdir()
    (root / "digits-cnn" / "tune" / "report.json").write_bytes(orjson.dumps(
        {"chosen": {"plan": {"max_batch_size": 16, "qps": 4000.0, "p99_ms": 4.0}}}))
    return root


@pytest.fixture(scope="module")
def written(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("kserve")
    assert main(["deploy", "kserve", str(repo), "-o", str(out), "--image",
                 "registry.example/turboinfer:0.1.0", "--storage-uri",
                 "s3://models/repo"]) == 0
    return {path.name: yaml.safe_load(path.read_text()) for path in out.glob("*.yaml")}


def test_serving_runtime_speaks_oip_v2(written: dict[str, Any]) -> None:
    runtime = written["servingruntime.yaml"]
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert runtime["kind"] == "ServingRuntime" and runtime["metadata"]["name"] == "turboinfer"
    spec = runtime["spec"]
    assert set(spec) <= SERVING_RUNTIME_SPEC
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert all(set(f) <= SUPPORTED_MODEL_FORMAT for f in spec["supportedModelFormats"])
    assert {"name": "onnx", "version": "1", "autoSelect": True} in spec["supportedModelFormats"]
    (container,) = spec["containers"]
    assert set(container) <= CONTAINER
    assert container["name"] == "kserve-container"
    assert container["image"] == "registry.example/turboinfer:0.1.0"
    assert "turboinfer serve" in container["args"][0] and "/mnt/models" in container["args"][0]
    assert container["ports"] == [{"containerPort": 8080, "name": "http1", "protocol": "TCP"}]


def test_inference_service_per_model(written: dict[str, Any]) -> None:
    assert set(written) == {"servingruntime.yaml", "inferenceservice-digits-cnn.yaml"}
    service = written["inferenceservice-digits-cnn.yaml"]
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    assert service["kind"] == "InferenceService"
    assert service["metadata"]["name"] == "digits-cnn"
    predictor = service["spec"]["predictor"]
    assert set(predictor) <= COMPONENT_EXTENSION | {"model"}
    # Replicas from the autoscaling section; the HPA scales on its CPU threshold.
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (1, 4)
    assert predictor["scaleMetric"] in SCALE_METRICS and predictor["scaleTarget"] == 70
    assert predictor["annotations"] == {"prometheus.io/scrape": "true",
                                        "prometheus.io/port": "8080",
                                        "prometheus.io/path": "/metrics"}
    model = predictor["model"]
    assert set(model) <= MODEL_SPEC | CONTAINER
    assert model["modelFormat"] == {"name": "onnx"}
    assert model["runtime"] == "turboinfer" and model["protocolVersion"] == "v2"
    assert model["storageUri"] == "s3://models/repo/digits-cnn"
    # Two instances of one intra-op thread: two CPUs, guaranteed.
    resources = model["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == "2"
    request_mib = int(resources["requests"]["memory"].removesuffix("Mi"))
    assert 512 < request_mib < int(resources["limits"]["memory"].removesuffix("Mi"))
    assert model["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert model["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}


def test_json_summary(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "kserve", str(repo), "-o", str(tmp_path), "--json",
                 "--namespace", "ml"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [m["kind"] for m in summary["manifests"]] == ["ServingRuntime", "InferenceService"]
    runtime = yaml.safe_load((tmp_path / "servingruntime.yaml").read_text())
    assert runtime["metadata"]["namespace"] == "ml"


def test_a_model_name_kubernetes_refuses(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    write_entry(tmp_path / "repo", "Digits_CNN",
                resolve_model("builtin:digits-cnn").artifact.onnx_path, ModelConfig())
    assert main(["deploy", "kserve", str(tmp_path / "repo"), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "cannot be a Kubernetes name" in err and err.count("\n") == 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _serve_until_ready(command: list[str], log: Path) -> None:
    """Run ``command`` (the image's entry point, locally), check /v2/health/ready."""
    with log.open("w") as err:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                                   env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()),  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()
        reader.join(120)
        assert lines and lines[0].startswith("turboinfer serving"), log.read_text()[-2000:]
        port = int(re.search(r"http=[^:]+:(\d+)", lines[0]).group(1))  # type: ignore[union-attr]
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for path in ("/v2/health/ready", "/v2/models/digits-cnn/ready"):
            connection.request("GET", path)
            response = connection.getresponse()
            assert response.status == 200, (path, response.read())
            response.read()
        connection.close()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        assert process.stdout is not None
        process.stdout.close()


def _local(command: list[str], port: int) -> list[str]:
    """The container's command on this machine: the console script of this Python,
    loopback, free ports."""
    text = shlex.join(command)
    text = text.replace("0.0.0.0", "127.0.0.1").replace("8080", str(port))
    text = text.replace("--grpc-port 8081", "--grpc-port -1")
    text = text.replace("exec turboinfer ", f"exec {sys.executable} -m turboinfer ")
    return shlex.split(text)


@pytest.mark.slow
def test_image_entry_points_start_the_server(repo: Path, written: dict[str, Any],
                                             tmp_path: Path) -> None:
    # The Dockerfile's ENTRYPOINT and CMD, with the repository where the image mounts it.
    dockerfile = (ROOT / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    cmd = json.loads(re.search(r"^CMD (.+)$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    assert entrypoint == ["turboinfer", "serve"]
    image = [sys.executable, "-m", "turboinfer", "serve",
             *[str(repo) if arg == "/models" else arg for arg in cmd]]
    _serve_until_ready(_local(image, _free_port()), tmp_path / "image.log")
    # The ServingRuntime's command, with the model folder where KServe downloads it and
    # the InferenceService's name filled in as KServe does.
    container = written["servingruntime.yaml"]["spec"]["containers"][0]
    runtime = [*container["command"], container["args"][0]
               .replace("/mnt/models", str(repo / "digits-cnn"))
               .replace("/tmp/turboinfer-repo", str(tmp_path / "repo"))
               .replace("{{.Name}}", "digits-cnn")]
    _serve_until_ready(_local(runtime, _free_port()), tmp_path / "runtime.log")
