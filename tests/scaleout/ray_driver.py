"""A Ray driver in its own process for test_ray_oip's killed-replica test.

A Ray driver inside the pytest process (beside onnxruntime, torch and grpc) crashed the
interpreter at times; here it runs alone and speaks one line of JSON per step:

    python ray_driver.py GCS_ADDRESS DEPLOYMENT REPLICAS

prints {"replicas": [...]} once connected, waits for a line on stdin, kills the first
replica (no restart), prints {"killed": true}, waits until Ray has replaced it with all
replicas RUNNING (at most 90 s) and prints {"replaced": bool, "replicas": [...]}.
"""

from __future__ import annotations

import json
import sys
import time

import ray
from ray import serve


def replicas(deployment: str) -> list[str]:
    prefix = f"SERVE_REPLICA::turboinfer#{deployment}#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["name"].startswith(prefix))


def running(deployment: str) -> int:
    status = serve.status().applications["turboinfer"].deployments[deployment]
    return int(status.replica_states.get("RUNNING", 0))


def say(message: dict[str, object]) -> None:
    print(json.dumps(message), flush=True)


def main(address: str, deployment: str, count: int) -> None:
    ray.init(address=address, namespace="serve", log_to_driver=False)
    try:
        before = replicas(deployment)
        say({"replicas": before})
        sys.stdin.readline()
        ray.kill(ray.get_actor(before[0], namespace="serve"), no_restart=True)
        say({"killed": True})
        deadline = time.monotonic() + 90
        replaced = False
        while time.monotonic() < deadline:
            now = replicas(deployment)
            if before[0] not in now and len(now) == count and running(deployment) == count:
                replaced = True
                break
            time.sleep(0.5)
        say({"replaced": replaced, "replicas": replicas(deployment)})
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
