"""``turboinfer deploy kserve``: a model repository as KServe manifests for Kubernetes.

(``turboinfer export`` takes a model to export as its first argument, so a deployment
target there would be ambiguous; deployments have their own command. Ray Serve runs the
repository directly: ``turboinfer serve REPO --ray``.)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from turboinfer.errors import ConfigError
from turboinfer.output import print_json

NAME = "deploy"
HELP = "write deployment manifests for a model repository (KServe on Kubernetes)"

# KServeOptions' defaults, repeated: the command imports its library lazily.
_IMAGE = "turboinfer:latest"
_STORAGE = "pvc://turboinfer-models"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    kserve = sub.add_parser(
        "kserve", help="a ServingRuntime and one InferenceService per model",
        description="Write a KServe ServingRuntime (turboinfer serve, OIP v2) and one "
                    "InferenceService per model of REPO into DIR; apply them with "
                    "`kubectl apply -f DIR`.")
    kserve.add_argument("repository", type=Path, metavar="REPO", help="model repository")
    kserve.add_argument("-o", "--output", type=Path, required=True, metavar="DIR",
                        help="folder for the YAML files")
    kserve.add_argument("--image", default=_IMAGE,
                        help="the server image (built from the Dockerfile)")
    kserve.add_argument("--storage-uri", default=_STORAGE,
                        help="where the cluster finds the repository; each model's "
                             "storageUri is this + /NAME (pvc://, s3://, gs://, ...)")
    kserve.add_argument("--runtime-name", default="turboinfer",
                        help="the ServingRuntime's name")
    kserve.add_argument("--namespace", default=None,
                        help="namespace of every object (default: kubectl's current one)")
    kserve.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: the hardware probe and the repository reader load numpy.
    from turboinfer.hardware import profile
    from turboinfer.scaleout.kserve import KServeOptions, manifests, write_manifests

    options = KServeOptions(image=args.image, storage_uri=args.storage_uri,
                            runtime=args.runtime_name, namespace=args.namespace)
    docs = manifests(args.repository, profile(), options)
    try:
        written = write_manifests(docs, args.output)
    except OSError as exc:
        raise ConfigError(f"cannot write {args.output}: {exc.strerror}") from None
    if args.json:
        print_json({"files": [str(p) for p in written], "manifests": _summary(docs)})
        return 0
    for path in written:
        print(f"wrote {path}")
    print(f"apply with: kubectl apply -f {args.output}")
    return 0


def _summary(docs: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    return [{"file": name, "kind": doc["kind"], "name": doc["metadata"]["name"]}
            for name, doc in docs.items()]
