"""benchmarks/harness/kernel_timeline.py: busy and idle time of a kernel timeline, gaps by transition."""

from __future__ import annotations

import pytest
from support.benchmarks_package import import_benchmark

timeline = import_benchmark("harness.kernel_timeline")
Kernel, idle_gaps = timeline.Kernel, timeline.idle_gaps


def kind(name: str) -> str:
    return name.split("_")[0]


def test_overlapping_kernels_count_once_and_gaps_go_to_their_transition():
    kernels = [
        Kernel("gemm_a", 0, 10),
        Kernel("norm_a", 8, 12),  # overlaps the gemm (programmatic launch): busy 0-12
        Kernel("gemm_b", 15, 20),  # 3 us after the norm
        Kernel("attn_a", 16, 19),  # inside the gemm: the gemm still ends the segment
        Kernel("norm_b", 24, 25),  # 4 us after the gemm
        Kernel("gemm_c", 27, 30),  # 2 us after a norm
    ]
    result = idle_gaps(list(reversed(kernels)), kind)  # the order given does not matter
    assert result["kernels"] == 6
    assert result["span_ms"] == pytest.approx(0.030)
    assert result["busy_ms"] == pytest.approx((12 + 5 + 1 + 3) / 1e3)
    assert result["idle_ms"] == pytest.approx((3 + 4 + 2) / 1e3)
    assert result["busy_ms"] + result["idle_ms"] == pytest.approx(result["span_ms"])
    by = result["idle_ms_by_transition"]
    assert list(by) == ["norm -> gemm", "gemm -> norm"]  # largest first: 3 + 2 us, then 4 us
    assert by["norm -> gemm"] == {"ms": pytest.approx(0.005), "gaps": 2}
    assert by["gemm -> norm"] == {"ms": pytest.approx(0.004), "gaps": 1}


def test_no_kernels_and_the_largest_transitions_only():
    assert idle_gaps([], kind) == {"kernels": 0}
    kernels = [Kernel(f"k{i}_x", 10 * i, 10 * i + 1) for i in range(5)]
    result = idle_gaps(kernels, lambda name: name.split("_")[0], most=2)
    assert len(result["idle_ms_by_transition"]) == 2
    assert result["idle_ms"] == pytest.approx(0.036)
