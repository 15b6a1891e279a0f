"""When to add or remove an instance: the autoscaling rules, free of clocks and threads.

The two directions read different signals, which is the hysteresis:

- **up** when the instances' busy share (seconds in the engine per instance per second,
  0-1: the CPU utilisation of what the instances were given) averaged over
  ``scale_up_window_s`` reaches ``scale_up_cpu_utilization``, and the cap leaves room;
- **down** when the request rate over ``scale_down_window_s`` is under
  ``scale_down_rate_qps`` *and* the remaining instances would stay well under the
  scale-up threshold (busy share x n / (n - 1) at most ``DOWN_BAND`` of it), so a
  removal cannot cause the next addition even when the measurements wobble.

A constant load that one instance cannot hold therefore adds instances until they keep
up or the cap is reached, and then nothing changes: its rate stays above the scale-down
threshold. The controller applies a cool-down after each event and starts both windows
afresh, so every decision sees only the layout it is judging.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from turboinfer.serve.config import AutoscalingConfig

UP, DOWN, HOLD = "up", "down", "hold"
# A removal needs the remaining instances' projected busy share under this fraction of
# the scale-up threshold: the gap is the hysteresis band (0.56 at the default 0.70).
DOWN_BAND = 0.8


@dataclass(frozen=True)
class Sample:
    """The counters of one version at one moment."""

    at: float  # seconds, time.perf_counter()
    busy_s: float  # engine seconds of its instances in service, summed
    requests: int  # requests answered (success or failure) since it loaded


@dataclass(frozen=True)
class Window:
    """The measurements over one window, for ``count`` instances."""

    seconds: float
    utilization: float  # busy share per instance, 0-1
    rate_qps: float


@dataclass(frozen=True)
class Decision:
    count: int  # the instance count wanted (equal to the current one for a hold)
    direction: str  # up | down | hold
    reason: str  # cpu_utilization | low_rate | min_instances | max_instances | at_cap
    detail: str  # the numbers behind it, for the log line


def window(samples: Sequence[Sample], now: float, seconds: float,
           count: int) -> Window | None:
    """The last ``seconds`` of ``samples`` (oldest first), or None while they cover
    less than that: a decision needs a whole window of the current layout."""
    base = None
    for sample in samples:
        if sample.at > now - seconds:
            break
        base = sample
    last = samples[-1] if samples else None
    if base is None or last is None or last.at <= base.at or count < 1:
        return None
    span = last.at - base.at
    return Window(span, (last.busy_s - base.busy_s) / (span * count),
                  (last.requests - base.requests) / span)


def cap(config: AutoscalingConfig, cores: int, fixed_threads: int) -> int:
    """The most instances of one version: ``max_instances`` within the usable cores
    (one intra-op thread each, or the fixed count the configuration gives)."""
    by_cores = max(1, cores // max(1, fixed_threads))
    limit = min(config.max_instances or by_cores, by_cores)
    return max(limit, config.min_instances)


def decide(config: AutoscalingConfig, count: int, limit: int, room: int,
           up: Window | None, down: Window | None) -> Decision | None:
    """The next step for a version serving ``count`` instances, at most ``limit``, with
    ``room`` more that the machine's cores allow beside the other models (None: stay)."""
    if count < config.min_instances:
        return Decision(config.min_instances, UP, "min_instances",
                        f"{count} < min_instances {config.min_instances}")
    if count > limit:
        return Decision(limit, DOWN, "max_instances", f"{count} > cap {limit}")
    threshold = config.scale_up_cpu_utilization
    if up is not None and up.utilization >= threshold:
        detail = (f"busy {up.utilization:.2f} >= {threshold:.2f} over {up.seconds:.1f} s, "
                  f"rate {up.rate_qps:.1f} qps")
        if count < limit and room > 0:
            return Decision(count + 1, UP, "cpu_utilization", detail)
        return Decision(count, HOLD, "at_cap", f"{detail}; {count} of cap {limit}, "
                                               f"{max(0, room)} core(s) free")
    if down is not None and count > config.min_instances \
            and down.rate_qps < config.scale_down_rate_qps:
        projected = down.utilization * count / (count - 1)
        detail = (f"rate {down.rate_qps:.1f} < {config.scale_down_rate_qps:g} qps over "
                  f"{down.seconds:.1f} s, busy {down.utilization:.2f} -> {projected:.2f} "
                  f"on {count - 1}")
        if projected <= DOWN_BAND * threshold:
            return Decision(count - 1, DOWN, "low_rate", detail)
    return None
