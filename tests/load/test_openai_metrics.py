"""TTFT, ITL, E2EL, TPOT and goodput from recorded chunk timestamps, checked by hand."""

from __future__ import annotations

import pytest

from turboinfer.errors import ConfigError
from turboinfer.load.openai.metrics import RequestResult, from_chunks, is_good, summarize
from turboinfer.load.openai.settings import Slo


def _request(sent: float, chunks: list[float], tokens: int, start: float = 0.0,
             prompt_len: int = 8) -> RequestResult:
    return from_chunks(start_s=start, sent_s=sent, chunk_times=chunks,
                       prompt_len=prompt_len, output_tokens=tokens)


def test_one_request_from_its_chunk_times() -> None:
    r = _request(10.0, [10.2, 10.25, 10.35, 10.40], tokens=4)
    assert r.ttft_s == pytest.approx(0.2)
    assert r.e2el_s == pytest.approx(0.4)
    assert r.itl_s == pytest.approx((0.05, 0.10, 0.05))
    assert r.tpot_s == pytest.approx((0.4 - 0.2) / 3)


def test_tpot_counts_tokens_not_chunks() -> None:
    # Two chunks carrying 5 tokens: one ITL gap, but TPOT spreads over the 4 later tokens.
    r = _request(0.0, [0.1, 0.5], tokens=5)
    assert r.itl_s == pytest.approx((0.4,))
    assert r.tpot_s == pytest.approx(0.1)


def test_one_token_has_no_tpot() -> None:
    r = _request(0.0, [0.3], tokens=1)
    assert r.tpot_s == 0.0
    assert r.itl_s == ()


def test_summary_percentiles_and_throughput() -> None:
    results = [_request(0.0, [t, t + 0.1], tokens=2, prompt_len=10)
               for t in (0.1, 0.2, 0.3, 0.4, 0.5)]
    results.append(RequestResult(start_s=0.0, prompt_len=10, error="HTTP 500: boom"))
    s = summarize(results, duration_s=2.0, slo=Slo())
    assert (s.completed, s.failed, s.errors) == (5, 1, {"HTTP 500: boom": 1})
    assert s.ttft.p50 == pytest.approx(300.0)
    assert s.ttft.p90 == pytest.approx(460.0)  # linear interpolation, as numpy and vLLM
    assert s.ttft.mean == pytest.approx(300.0)
    assert s.e2el.max == pytest.approx(600.0)
    assert s.itl.count == 5
    assert s.itl.p99 == pytest.approx(100.0)
    assert s.total_input_tokens == 50 and s.total_output_tokens == 10
    assert s.request_throughput == pytest.approx(2.5)
    assert s.output_throughput == pytest.approx(5.0)
    assert s.total_token_throughput == pytest.approx(30.0)
    assert s.goodput == 0.0


def test_tpot_distribution_leaves_out_one_token_requests() -> None:
    results = [_request(0.0, [0.1], tokens=1), _request(0.0, [0.1, 0.3], tokens=3)]
    s = summarize(results, duration_s=1.0, slo=Slo())
    assert s.tpot.count == 1
    assert s.tpot.p50 == pytest.approx(100.0)


def test_goodput_needs_every_bound() -> None:
    slo = Slo.parse("ttft=200ms,tpot=50ms")
    fast = _request(0.0, [0.1, 0.14, 0.18], tokens=3)  # ttft 100, tpot 40
    slow_start = _request(0.0, [0.3, 0.31, 0.32], tokens=3)  # ttft 300
    slow_decode = _request(0.0, [0.1, 0.2, 0.3], tokens=3)  # tpot 100
    one_token = _request(0.0, [0.15], tokens=1)  # tpot counts as 0
    failed = RequestResult(start_s=0.0, prompt_len=1, error="x")
    assert [is_good(r, slo) for r in (fast, slow_start, slow_decode, one_token, failed)] == [
        True, False, False, True, False]
    s = summarize([fast, slow_start, slow_decode, one_token, failed], 2.0, slo)
    assert s.good_requests == 2
    assert s.goodput == pytest.approx(1.0)


def test_bound_is_inclusive_and_e2el_counts() -> None:
    r = _request(0.0, [0.5, 1.0], tokens=2)
    assert is_good(r, Slo(e2el_ms=1000.0))
    assert not is_good(r, Slo(e2el_ms=999.0))


def test_slo_parsing() -> None:
    assert Slo.parse("ttft=500ms, tpot=50, e2el=2s") == Slo(500.0, 50.0, 2000.0)
    assert not Slo.parse("").active
    with pytest.raises(ConfigError, match="bad --slo item"):
        Slo.parse("latency=5ms")


def test_empty_run_summarizes_to_zeros() -> None:
    s = summarize([], duration_s=0.0, slo=Slo(ttft_ms=1.0))
    assert (s.completed, s.ttft.count, s.output_throughput) == (0, 0, 0.0)
