"""Kubernetes manifests for KServe: one ``ServingRuntime`` (turboinfer's server speaking
the Open Inference Protocol v2, the protocol KServe's v2 predictors expect) and one
``InferenceService`` per model of a repository.

Field names follow KServe's API types: ``ServingRuntimeSpec`` (serving.kserve.io/
v1alpha1: supportedModelFormats, protocolVersions, multiModel, containers, annotations)
and ``PredictorSpec`` with its ``ModelSpec`` (serving.kserve.io/v1beta1: modelFormat,
runtime, protocolVersion, storageUri and the inlined container: resources, probes) and
its ``ComponentExtensionSpec`` (minReplicas, maxReplicas, scaleMetric, scaleTarget,
annotations).

Each InferenceService runs in KServe's RawDeployment mode, where a HorizontalPodAutoscaler
scales on CPU: the entry's ``scale_up_cpu_utilization`` (70% by default) is the HPA's
target and ``min_instances``/``max_instances`` its bounds. KServe downloads the model
folder (``storageUri``) to /mnt/models; the runtime's command makes it the one model of
a repository named after the InferenceService (KServe fills in ``{{.Name}}``) and runs
``turboinfer serve`` on it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from turboinfer.errors import ConfigError
from turboinfer.hardware import HardwareProfile
from turboinfer.scaleout.plan import ReplicaPlan, plan_replicas, tuned_point
from turboinfer.serve.metrics import weight_bytes
from turboinfer.serve.sources import scan_directory

RUNTIME_API = "serving.kserve.io/v1alpha1"
SERVICE_API = "serving.kserve.io/v1beta1"
HTTP_PORT = 8080  # KServe's convention for a predictor's HTTP port
GRPC_PORT = 8081
MODEL_DIR = "/mnt/models"  # where KServe's storage initializer puts storageUri
REPO_DIR = "/tmp/turboinfer-repo"
# A Kubernetes object name (RFC 1035 label), as KServe requires of InferenceServices.
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MIB = 2**20


@dataclass(frozen=True)
class KServeOptions:
    image: str = "turboinfer:latest"
    storage_uri: str = "pvc://turboinfer-models"  # + /<model>: the model's folder
    runtime: str = "turboinfer"
    namespace: str | None = None


def server_command(repo_dir: str = REPO_DIR, model_dir: str = MODEL_DIR,
                   name: str = "{{.Name}}") -> list[str]:
    """The runtime container's command: the downloaded model folder as the one model of
    a repository, served by ``turboinfer serve`` (exec: it gets SIGTERM directly)."""
    serve = (f"exec turboinfer serve {repo_dir} --host 0.0.0.0 --http-port {HTTP_PORT} "
             f"--grpc-port {GRPC_PORT} --model-control none")
    return ["/bin/sh", "-c",
            f"mkdir -p {repo_dir} && ln -sfn {model_dir} {repo_dir}/{name} && {serve}"]


def scrape_annotations() -> dict[str, str]:
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(HTTP_PORT),
            "prometheus.io/path": "/metrics"}


def serving_runtime(options: KServeOptions) -> dict[str, Any]:
    command = server_command()
    return {
        "apiVersion": RUNTIME_API,
        "kind": "ServingRuntime",
        "metadata": _metadata(options.runtime, options),
        "spec": {
            "supportedModelFormats": [
                {"name": "onnx", "version": "1", "autoSelect": True},
                {"name": "openvino", "autoSelect": False},
            ],
            "protocolVersions": ["v2", "grpc-v2"],
            "multiModel": False,
            "annotations": scrape_annotations(),
            "containers": [{
                "name": "kserve-container",
                "image": options.image,
                "command": command[:2],
                "args": command[2:],
                "ports": [{"containerPort": HTTP_PORT, "name": "http1", "protocol": "TCP"}],
            }],
        },
    }


def resources(plan: ReplicaPlan, memory_cap_mib: int) -> dict[str, dict[str, str]]:
    """Guaranteed CPU (requests = limits: a throttled replica misses its latency) for the
    tuned instances x threads; memory for the process and the model, with room to twice
    that (within the machine's memory) before the container is killed."""
    cpu = str(plan.cpus_per_replica)
    request = min(plan.memory_mib, memory_cap_mib)
    return {"requests": {"cpu": cpu, "memory": f"{request}Mi"},
            "limits": {"cpu": cpu, "memory": f"{min(2 * request, memory_cap_mib)}Mi"}}


def probes() -> dict[str, Any]:
    return {
        # Ready once the model is loaded and warmed up; not ready while draining.
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": HTTP_PORT},
                           "initialDelaySeconds": 2, "periodSeconds": 5,
                           "failureThreshold": 3},
        # Live as soon as the socket is bound, so a long model load is not a restart.
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": HTTP_PORT},
                          "initialDelaySeconds": 10, "periodSeconds": 10,
                          "failureThreshold": 3},
    }


def inference_service(name: str, model_format: str, plan: ReplicaPlan, cpu_target: float,
                      memory_cap_mib: int, options: KServeOptions) -> dict[str, Any]:
    if not _NAME.match(name):
        raise ConfigError(f"model {name!r} cannot be a Kubernetes name: use lower-case "
                          "letters, digits and '-', starting with a letter")
    return {
        "apiVersion": SERVICE_API,
        "kind": "InferenceService",
        "metadata": {**_metadata(name, options),
                     "annotations": {"serving.kserve.io/deploymentMode": "RawDeployment"}},
        "spec": {"predictor": {
            "minReplicas": plan.min_replicas,
            "maxReplicas": plan.max_replicas,
            "scaleMetric": "cpu",
            "scaleTarget": round(cpu_target * 100),
            "annotations": scrape_annotations(),
            "model": {
                "modelFormat": {"name": model_format},
                "runtime": options.runtime,
                "protocolVersion": "v2",
                "storageUri": f"{options.storage_uri.rstrip('/')}/{name}",
                "resources": resources(plan, memory_cap_mib),
                **probes(),
            },
        }},
    }


def manifests(repository: Path, machine: HardwareProfile,
              options: KServeOptions) -> dict[str, dict[str, Any]]:
    """File name -> manifest: the runtime, then one InferenceService per model."""
    cores = machine.cpu.usable_cores
    found: dict[str, dict[str, Any]] = {"servingruntime.yaml": serving_runtime(options)}
    for name, source in scan_directory(repository).items():
        snapshot = source.read()
        if not snapshot.versions:
            raise ConfigError(f"model {name!r} in {repository} has no version folder")
        config = snapshot.config
        newest = source.artifact(max(snapshot.versions), config)
        # An entry without a thread count uses every core of the machine it was tuned on.
        if config.engine_settings.intra_op_threads == 0:
            config = config.model_copy(update={"engine_settings": config.engine_settings.
                                               model_copy(update={"intra_op_threads": cores})})
        plan = plan_replicas(config, cores, tuned=tuned_point(repository / name),
                             model_bytes=weight_bytes(newest.onnx_path))
        model_format = "openvino" if config.model_file.endswith(".xml") else "onnx"
        found[f"inferenceservice-{name}.yaml"] = inference_service(
            name, model_format, plan, config.autoscaling.scale_up_cpu_utilization,
            memory_cap_mib(machine), options)
    if len(found) == 1:
        raise ConfigError(f"model repository {repository} holds no model")
    return found


def _metadata(name: str, options: KServeOptions) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/part-of": "turboinfer"}}
    if options.namespace:
        meta["namespace"] = options.namespace
    return meta


def memory_cap_mib(machine: HardwareProfile) -> int:
    """The memory of the machine the repository was tuned on (its cgroup limit when
    lower), a ceiling no replica's limit should pass."""
    limit = machine.memory.cgroup_limit_bytes or machine.memory.total_bytes
    return math.floor(min(limit, machine.memory.total_bytes) / MIB)


def write_manifests(docs: dict[str, dict[str, Any]], folder: Path) -> list[Path]:
    """Each manifest as its own YAML file in ``folder`` (created)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, doc in docs.items():
        path = folder / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        written.append(path)
    return written
