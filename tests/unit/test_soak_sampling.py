"""The asyncio task gauge of nodes and router, and what the soak benchmark reads from /proc and judges."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable

import anyio.to_thread
import pytest
from support.benchmarks_package import import_benchmark

from kvferry.node.metrics import NodeMetrics
from kvferry.router.metrics import RouterMetrics

soak_sampling = import_benchmark("soak_sampling")
TASKS_GAUGE = soak_sampling.TASKS_GAUGE
ProcessReading = soak_sampling.ProcessReading
gauge_value, growth, proc_usage, quietest = (
    soak_sampling.gauge_value, soak_sampling.growth, soak_sampling.proc_usage, soak_sampling.quietest
)

SCRAPES: dict[str, Callable[[], bytes]] = {
    "node": lambda: NodeMetrics("decode", "decode-0").render(0, 0, 0, 16),
    "router": lambda: RouterMetrics().exposition(),
}


@pytest.mark.parametrize("kind", SCRAPES)
def test_task_gauge_counts_the_serving_loop_when_scraped_from_a_worker_thread(kind: str) -> None:
    async def scrape() -> float:
        # As the server scrapes: a sync route runs in one of the event loop's worker threads.
        return gauge_value((await anyio.to_thread.run_sync(SCRAPES[kind])).decode(), TASKS_GAUGE)

    async def scenario() -> tuple[float, float, float]:
        before = await scrape()
        release = asyncio.Event()
        waiting = [asyncio.create_task(release.wait()) for _ in range(5)]
        during = await scrape()
        release.set()
        await asyncio.gather(*waiting)
        return before, during, await scrape()

    before, during, after = asyncio.run(scenario())
    assert before >= 1  # the scenario's own task, at least
    assert during - before == 5
    assert after == before


def test_task_gauge_is_zero_outside_any_event_loop() -> None:
    assert gauge_value(SCRAPES["router"]().decode(), TASKS_GAUGE) == 0


# A fresh interpreter that, when told, opens 7 files, starts a thread and writes 64 MiB. Fresh, because a
# long-lived process (pytest after hundreds of tests) may serve the 64 MiB from memory it already holds.
GROWING_CHILD = """
import sys, tempfile, threading
print("started", flush=True)
sys.stdin.readline()
files = [tempfile.TemporaryFile() for _ in range(7)]
ballast = b"\\x01" * (64 << 20)
stop = threading.Event()
threading.Thread(target=stop.wait).start()
print("grown", flush=True)
sys.stdin.readline()
stop.set()
"""


def test_proc_usage_sees_descriptors_threads_and_memory_of_a_live_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", GROWING_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        # Measured once the interpreter has started: right after Popen it may still be starting, with the
        # files its imports open and close (a unit run saw the descriptors' difference off so, once).
        assert child.stdout.readline() == "started\n"
        rss_before, fds_before, threads_before = proc_usage(child.pid)
        child.stdin.write("grow\n")
        child.stdin.flush()
        assert child.stdout.readline() == "grown\n"
        rss, fds, threads = proc_usage(child.pid)
        child.stdin.write("stop\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
    assert fds - fds_before == 7
    assert threads - threads_before == 1
    assert rss - rss_before >= 60


def test_growth_compares_the_last_samples_with_the_first_ones_after_the_warmup() -> None:
    times = [0, 30, 60, 90, 120, 150, 180, 210, 240]
    values = [50, 80, 100, 99, 101, 102, 104, 103, 108]  # the warm-up's 50 and 80 are left out
    assert growth(times, values, warmup_s=60) == {"baseline": 100.0, "final": 105.0, "growth_pct": 5.0}
    assert growth(times[:5], values[:5], warmup_s=60)["growth_pct"] == 1.0  # three samples: one at each end
    with pytest.raises(ValueError, match="two samples"):
        growth(times, values, warmup_s=240)
    with pytest.raises(ValueError, match="baseline of 0"):
        growth(times, [0] * len(times), warmup_s=60)


def test_quietest_keeps_each_metrics_smallest_reading() -> None:
    readings = [ProcessReading(100.0, 40, 9, 7), ProcessReading(99.5, 42, 8, 9), ProcessReading(101.0, 41, 9, 6)]
    assert quietest(readings) == ProcessReading(99.5, 40, 8, 6)


def test_gauge_value_names_a_missing_gauge() -> None:
    with pytest.raises(KeyError, match="kvferry:nothing"):
        gauge_value("# HELP x y\n# TYPE x gauge\nx 1.0\n", "kvferry:nothing")
