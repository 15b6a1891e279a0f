"""A constant load one instance cannot hold, for minutes: does the count settle and stay?

    python benchmarks/autoscale/steady.py [--seconds 240] [-o steady.json]

The same server and configuration as ``run.py`` (default autoscaling windows and
cool-down, one intra-op thread per instance, so a cap of 2 on this machine), loaded by
``turboinfer load --scenario concurrency`` at 4 requests in flight for ``--seconds``
(windows of 10 s that never count as stable, so it runs the whole time): both
instances are always busy, and a closed loop cannot build a backlog that would time out.
Every scale event and hold line, and the instance count every 0.5 s, go to the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from run import CONFIG, HERE, Sampler, Server, load, machine  # the step benchmark's parts

from turboinfer.models import resolve_model
from turboinfer.serve.config import write_entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="digits-cnn", help="built-in model")
    parser.add_argument("--rows", type=int, default=1024, help="rows per request")
    parser.add_argument("--seconds", type=int, default=240)
    parser.add_argument("-o", "--output", type=Path, default=HERE / "steady.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="autoscale-steady-"))
    config = CONFIG.model_copy(update={"max_batch_size": args.rows, "idle_unload_s": None})
    write_entry(work / "repo", args.model,
                resolve_model(f"builtin:{args.model}").artifact.onnx_path, config)
    load_before = os.getloadavg()
    origin = time.monotonic()
    server = Server(work / "repo", args.model, origin)
    sampler = Sampler(server, origin)
    sampler.start()
    try:
        report = load(server, args.rows, work / "steady-load.json", "--scenario",
                      "concurrency", "--concurrency", "4", "--window", "10s",
                      "--max-windows", str(args.seconds // 10), "--stability", "1e-9")
    finally:
        sampler.stop()
        server.stop()
    run = report["runs"][0]
    events = [e for e in server.events if " hold " not in e["line"]]
    settled = events[-1]["t"] if events else 0.0
    end = sampler.samples[-1]["t"] if sampler.samples else 0.0
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": dict(machine(), load_average_before=load_before,
                        load_average_after=os.getloadavg()),
        "config": config.model_dump(mode="json", exclude_defaults=True),
        "ok": run["ok"], "failed": run["failed"], "qps": run["qps"],
        "windows": run["windows"],
        "events": server.events,
        "scale_events": len(events),
        "last_event_s": settled,
        "quiet_after_last_event_s": end - settled,
        "samples": sampler.samples,
    }
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{run['ok']} ok, {run['failed']} failed at {run['qps']:.1f}/s; "
          f"{len(events)} scale event(s), the last at {settled:.1f} s, then "
          f"{end - settled:.0f} s without one; written {args.output}")
    for event in server.events:
        print(f"  {event['t']:7.1f} s  {event['line']}")


if __name__ == "__main__":
    main()
