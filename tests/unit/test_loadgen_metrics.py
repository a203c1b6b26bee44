"""Load generator metrics from constructed timings: percentiles, TPOT, throughput and goodput."""

from __future__ import annotations

import math

import pytest

from kvferry.loadgen.client import RequestRecord
from kvferry.loadgen.datasets import BenchRequest
from kvferry.loadgen.metrics import Slo, distribution, summarize
from kvferry.loadgen.runner import LoadShape, arrival_offsets


def _record(ttft: float, latency: float, tokens: int, error: str | None = None) -> RequestRecord:
    gaps = [(latency - ttft) / (tokens - 1)] * (tokens - 1) if tokens > 1 else []
    return RequestRecord(input_tokens=100, output_tokens=tokens, ttft_s=ttft, latency_s=latency, itl_s=gaps, error=error)


def test_distribution_interpolates_between_samples():
    stats = distribution([float(v) for v in range(1, 101)])  # 1..100
    assert stats["mean"] == pytest.approx(50.5)
    assert stats["p50"] == pytest.approx(50.5)
    assert stats["p90"] == pytest.approx(90.1)
    assert stats["p99"] == pytest.approx(99.01)
    assert distribution([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_tpot_excludes_the_first_token_and_needs_a_second():
    assert _record(0.5, 1.5, 11).tpot_s == pytest.approx(0.1)
    assert _record(0.5, 0.5, 1).tpot_s is None


def test_goodput_counts_requests_within_both_slos_per_second():
    records = [
        _record(0.1, 1.1, 11),  # ttft 0.1, tpot 0.1: good
        _record(0.2, 0.7, 11),  # tpot 0.05: good
        _record(0.6, 1.1, 11),  # ttft too slow
        _record(0.1, 2.1, 11),  # tpot 0.2 too slow
        _record(0.3, 0.3, 1),  # one token: no TPOT, ttft fine: good
        _record(0.1, 1.1, 11, error="HTTP 503"),  # failed: never good, not in latencies
    ]
    summary = summarize(records, duration_s=2.0, slo=Slo(ttft_s=0.5, tpot_s=0.1))
    assert summary["requests"] == 6 and summary["completed"] == 5 and summary["failed"] == 1
    assert summary["goodput_rps"] == pytest.approx(3 / 2.0)
    assert summary["slo_attainment"] == pytest.approx(3 / 6)
    assert summary["request_throughput_rps"] == pytest.approx(5 / 2.0)
    assert summary["output_tok_s"] == pytest.approx((4 * 11 + 1) / 2.0)
    assert summary["ttft_s"]["p50"] == pytest.approx(0.2)
    assert summary["tpot_s"]["mean"] == pytest.approx((0.1 + 0.05 + 0.05 + 0.2) / 4)
    assert summary["e2e_s"]["p90"] == pytest.approx(1.1 + 0.6 * (2.1 - 1.1))  # sorted 0.3 0.7 1.1 1.1 2.1, rank 3.6
    assert summary["itl_s"]["p50"] == pytest.approx(0.075)  # 20 gaps of 0.05, 10 of 0.1, 10 of 0.2: rank 19.5
    assert summary["errors"] == ["HTTP 503"]


def test_without_slos_every_completed_request_is_good():
    records = [_record(5.0, 50.0, 3), _record(1.0, 2.0, 2, error="time limit")]
    assert summarize(records, 10.0, Slo())["goodput_rps"] == pytest.approx(0.1)


def test_poisson_arrivals_average_the_rate_and_repeat_with_the_seed():
    requests = [BenchRequest("x", 1, 1)] * 2000
    offsets = arrival_offsets(requests, LoadShape(request_rate=4.0, seed=7))
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert offsets[-1] / (len(offsets) - 1) == pytest.approx(0.25, rel=0.1)
    assert offsets == arrival_offsets(requests, LoadShape(request_rate=4.0, seed=7))
    assert arrival_offsets(requests[:3], LoadShape(request_rate=math.inf)) == [0.0] * 3
    assert arrival_offsets(requests[:3], LoadShape(concurrency=2)) == [0.0] * 3


def test_trace_times_are_used_when_no_rate_is_given():
    requests = [BenchRequest("x", 1, 1, arrival_s=t) for t in (0.0, 0.5, 2.0)]
    assert arrival_offsets(requests, LoadShape()) == [0.0, 0.5, 2.0]
    with pytest.raises(ValueError, match="arrival times"):
        arrival_offsets([BenchRequest("x", 1, 1)], LoadShape())
