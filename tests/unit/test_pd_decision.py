"""The P/D decision's rule: fixed modes, the threshold before measurements, and the measured crossover."""

from __future__ import annotations

import pytest

from kvferry.router.scheduling.pd_decision import MIN_SAMPLES, PDDecision, PDSample


def _measured(compute_per_token: float, fixed: float, transfer_per_token: float, per_token_squared: float = 0.0,
              lengths: tuple[int, ...] = (64, 512, 1024, 4096)) -> PDDecision:
    decision = PDDecision("auto", min_tokens=100)
    for tokens in lengths * 3:
        compute = compute_per_token * tokens + per_token_squared * tokens**2
        decision.observe(PDSample(tokens, compute, fixed + transfer_per_token * tokens))
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


def test_a_short_prompt_stays_on_decode_though_only_long_ones_were_measured():
    # As measured on two CPU cores: 66 us a token at 512 tokens, 350 us at 4096 (attention grows with the
    # square), against 9.4 ms of fixed P/D cost. A per-token average of these samples (about 300 us) would put
    # the crossover near 31 tokens; the curve puts it near 220.
    decision = _measured(25.4e-6, 9.4e-3, 0.5e-6, per_token_squared=0.0792e-6, lengths=(512, 1024, 2048, 4096))
    assert 150 < decision.threshold() < 300
    assert not decision.disaggregate(32) and decision.disaggregate(512)


def test_auto_never_disaggregates_when_moving_a_token_costs_more_than_computing_it():
    decision = _measured(1e-4, 1e-3, 2e-4)
    assert decision.threshold() is None and not decision.disaggregate(1_000_000)


@pytest.mark.parametrize("mode", ["always", "never"])
def test_fixed_modes_report_no_threshold(mode):
    assert PDDecision(mode).stats() == {"mode": mode, "threshold_tokens": None, "samples": 0}
