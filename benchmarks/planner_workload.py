"""The planner benchmarks' workload: Mooncake's conversation trace played over a day's varying rate.

The requests are Mooncake's (kvcache-ai/Mooncake, FAST25-release/traces/conversation_trace.jsonl at commit
3b5a594, one hour of Kimi's conversation service: 12,031 requests, prompts of 12,035 tokens on average,
answers of 343), kept in benchmarks/data/planner_mooncake_conversation.csv without their prefix hashes (the
simulation has no prefix cache: every prompt token is computed). Their order, lengths and burstiness stay;
their times are stretched onto a day: the hour (its requests span 3537 s) is repeated as often as the day needs, and time is warped so
that the arrival rate follows DIURNAL, whose peak is `peak_rps`. DIURNAL is not measured (Mooncake released
one hour): a made-up working day, lowest at 3-4 h, rising from 7 h, highest 11-16 h, easing in the evening.

Prompts are scaled down (`prompt_scale`, 1/16 by default) so that the trace's prompts fit what the engine
runs on a CPU (the default model's 8192-token context; a 12k-token prompt there takes minutes): the median
becomes about 430 tokens, the 90th percentile 1720, the longest 7887. Answers keep their lengths.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy

from benchmarks.planner_cluster_sim import Request

TRACE = Path(__file__).resolve().parent / "data" / "planner_mooncake_conversation.csv"
MAX_PROMPT_TOKENS = 8192  # the engine's context on the default model
# Relative arrival rate at each hour of the day (0 h .. 23 h), linear in between, the day wrapping around.
DIURNAL = (0.30, 0.25, 0.22, 0.20, 0.20, 0.24, 0.33, 0.50, 0.70, 0.86, 0.95, 1.00,
           0.97, 0.95, 0.98, 1.00, 0.95, 0.86, 0.76, 0.70, 0.66, 0.58, 0.47, 0.37)


def mooncake_hour() -> list[tuple[float, int, int]]:
    """(seconds since the hour began, prompt tokens, output tokens), in arrival order."""
    with TRACE.open() as file:
        rows = [(int(row["timestamp_ms"]) / 1000, int(row["input_length"]), int(row["output_length"]))
                for row in csv.DictReader(file)]
    return sorted(rows)


def relative_rate(day_fraction: numpy.ndarray) -> numpy.ndarray:
    hours = numpy.arange(len(DIURNAL) + 1)
    return numpy.interp(day_fraction * len(DIURNAL), hours, (*DIURNAL, DIURNAL[0]))


def diurnal_requests(peak_rps: float, day_s: float, prompt_scale: float = 1 / 16) -> list[Request]:
    """The trace's requests over one day of `day_s` seconds (a compressed day when shorter than 24 h)."""
    hour = mooncake_hour()
    # one mean gap after the last arrival, so that the repeats follow each other without a pause
    span_s = hour[-1][0] * len(hour) / (len(hour) - 1)
    base_rps = len(hour) / span_s
    # expected arrivals from the day's start, on a fine grid, to invert: the warp of the trace's clock
    grid = numpy.linspace(0.0, day_s, 20_000)
    rate = peak_rps * relative_rate(grid / day_s)
    expected = numpy.concatenate(([0.0], numpy.cumsum((rate[1:] + rate[:-1]) / 2 * numpy.diff(grid))))
    requests = []
    for repeat in range(int(expected[-1] / len(hour)) + 1):
        for at_s, prompt, output in hour:
            position = (repeat * span_s + at_s) * base_rps  # how many arrivals come before it, expected
            if position > expected[-1]:
                return requests
            prompt_tokens = max(1, min(MAX_PROMPT_TOKENS, round(prompt * prompt_scale)))
            requests.append(Request(float(numpy.interp(position, expected, grid)), prompt_tokens, max(1, output)))
    return requests
