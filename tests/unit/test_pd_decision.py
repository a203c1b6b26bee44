"""The P/D decision's rule: fixed modes, the threshold before measurements, and the measured crossover."""

from __future__ import annotations

import pytest

from kvferry.router.scheduling.pd_decision import MIN_SAMPLES, PDDecision, PDSample


def _measured(compute_per_token: float, fixed: float, transfer_per_token: float) -> PDDecision:
    decision = PDDecision("auto", min_tokens=100)
    for tokens in (64, 512, 1024, 4096) * 3:
        decision.observe(PDSample(tokens, compute_per_token * tokens, fixed + transfer_per_token * tokens))
    return decision


def test_always_and_never_ignore_the_prompt():
    assert PDDecision("always").disaggregate(1) and not PDDecision("never").disaggregate(100_000)


def test_auto_uses_its_threshold_until_it_has_measured_enough():
    decision = PDDecision("auto", min_tokens=100)
    for _ in range(MIN_SAMPLES - 1):
        decision.observe(PDSample(1000, 1.0, 0.0))  # would put the crossover at 1 token
    assert not decision.disaggregate(99) and decision.disaggregate(100)
    decision.observe(PDSample(1000, 1.0, 0.0))
    assert decision.disaggregate(1)


def test_auto_disaggregates_where_the_compute_saved_overtakes_the_cost():
    # 1 ms of compute per token against 20 ms fixed + 0.2 ms per token: they cross at 20 / 0.8 = 25 tokens.
    decision = _measured(1e-3, 20e-3, 0.2e-3)
    assert decision.threshold() == 25
    assert not decision.disaggregate(24) and decision.disaggregate(25)


def test_auto_never_disaggregates_when_moving_a_token_costs_more_than_computing_it():
    decision = _measured(1e-4, 1e-3, 2e-4)
    assert decision.threshold() is None and not decision.disaggregate(1_000_000)


@pytest.mark.parametrize("mode", ["always", "never"])
def test_fixed_modes_report_no_threshold(mode):
    assert PDDecision(mode).stats() == {"mode": mode, "threshold_tokens": None, "samples": 0}
