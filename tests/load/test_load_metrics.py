import pytest

from turboinfer.load.metrics import MEMORY, parse, server_side

TURBOINFER = """
# TYPE turboinfer_request_success counter
turboinfer_request_success_total{{model="m",version="1"}} {ok}
turboinfer_request_success_total{{model="other",version="1"}} 999
# TYPE turboinfer_inference counter
turboinfer_inference_total{{model="m",version="1"}} {rows}
# TYPE turboinfer_execution counter
turboinfer_execution_total{{model="m",version="1"}} {batches}
# TYPE turboinfer_queue_duration_seconds histogram
turboinfer_queue_duration_seconds_bucket{{model="m",version="1",le="+Inf"}} {ok}
turboinfer_queue_duration_seconds_count{{model="m",version="1"}} {ok}
turboinfer_queue_duration_seconds_sum{{model="m",version="1"}} {queue}
# TYPE turboinfer_compute_duration_seconds histogram
turboinfer_compute_duration_seconds_count{{model="m",version="1"}} {batches}
turboinfer_compute_duration_seconds_sum{{model="m",version="1"}} {compute}
# TYPE turboinfer_process_resident_memory_bytes gauge
turboinfer_process_resident_memory_bytes {memory}
# TYPE turboinfer_process_cpu_seconds_total counter
turboinfer_process_cpu_seconds_total {cpu}
"""

TRITON = """
nv_inference_request_success{{model="m",version="1"}} {ok}
nv_inference_count{{model="m",version="1"}} {rows}
nv_inference_exec_count{{model="m",version="1"}} {batches}
nv_inference_queue_duration_us{{model="m",version="1"}} {queue_us}
nv_inference_compute_input_duration_us{{model="m",version="1"}} {compute_us}
nv_inference_compute_infer_duration_us{{model="m",version="1"}} {compute_us}
nv_inference_compute_output_duration_us{{model="m",version="1"}} {compute_us}
nv_cpu_memory_used_bytes {memory}
"""


def test_turboinfer_names_give_batching_and_times() -> None:
    before = parse(TURBOINFER.format(ok=100, rows=100, batches=50, queue=0.1, compute=0.5,
                                     memory=1e8, cpu=10.0), taken_ns=0)
    after = parse(TURBOINFER.format(ok=500, rows=500, batches=150, queue=0.5, compute=1.5,
                                    memory=2e8, cpu=11.0), taken_ns=2_000_000_000)
    side = server_side(before, after, model="m", max_batch_size=8)
    assert side.requests_ok == 400 and side.avg_batch_size == pytest.approx(4.0)
    assert side.batch_efficiency == pytest.approx(0.5)
    assert side.queue_ms == pytest.approx(1.0)          # 0.4 s over 400 observations
    assert side.compute_ms == pytest.approx(10.0)       # 1.0 s over 100 batches
    assert side.memory_mb == pytest.approx(200.0)
    assert side.cpu_cores == pytest.approx(0.5)


def test_triton_names_sum_compute_parts_per_request() -> None:
    before = parse(TRITON.format(ok=0, rows=0, batches=0, queue_us=0, compute_us=0,
                                 memory=5e7))
    after = parse(TRITON.format(ok=10, rows=20, batches=5, queue_us=2000, compute_us=1000,
                                memory=5e7))
    side = server_side(before, after, model="m", max_batch_size=0)
    assert side.avg_batch_size == pytest.approx(4.0) and side.batch_efficiency is None
    assert side.queue_ms == pytest.approx(0.2)          # 2000 µs over 10 requests
    assert side.compute_ms == pytest.approx(0.3)        # 3 parts x 1000 µs over 10
    assert after.total(MEMORY, "m") == 5e7


def test_missing_metrics_are_none_and_garbage_is_empty() -> None:
    empty = parse("# nothing here\n")
    side = server_side(empty, empty, model="m", max_batch_size=8)
    assert side.requests_ok is None and side.queue_ms is None and side.avg_batch_size is None
    assert parse("this is {not prometheus").samples == ()


def test_a_restarted_server_counts_from_zero() -> None:
    before = parse(TRITON.format(ok=1000, rows=0, batches=0, queue_us=0, compute_us=0,
                                 memory=1))
    after = parse(TRITON.format(ok=30, rows=0, batches=0, queue_us=0, compute_us=0, memory=1))
    assert server_side(before, after, model="m", max_batch_size=0).requests_ok == 30
