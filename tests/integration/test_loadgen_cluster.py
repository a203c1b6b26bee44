"""`kvferry loadgen` against a real `kvferry up` cluster (tiny model, a few requests): the JSON it writes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from support.redis_server import free_port

NUM_PROMPTS = 6
INPUT_LEN, OUTPUT_LEN = 40, 8


@pytest.fixture(scope="module")
def router_url(tiny_models):
    port = free_port()
    args = [sys.executable, "-m", "kvferry", "up", "--model", str(tiny_models["llama"]), "--port", str(port)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    up = False
    for line in process.stdout:  # type: ignore[union-attr]
        if re.search(r"is up at", line):
            up = True
            break
        if time.monotonic() > deadline:
            break
    try:
        assert up, "kvferry up did not come up"
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=45)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def test_bench_writes_percentiles_goodput_and_per_request_timings(router_url, tiny_models, tmp_path):
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    args = [
        sys.executable, "-m", "kvferry", "loadgen", "--base-url", router_url, "--model", str(tiny_models["llama"]),
        "--dataset", "random", "--num-prompts", str(NUM_PROMPTS), "--random-input-len", str(INPUT_LEN),
        "--random-output-len", str(OUTPUT_LEN), "--request-rate", "20,inf", "--time-limit", "120",
        "--slo-ttft", "60", "--slo-tpot", "60", "--out", str(out), "--no-progress",
    ]
    try:
        import matplotlib  # noqa: F401
        args += ["--plot", str(plot)]
    except ImportError:
        plot = None
    finished = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "goodput" in finished.stdout
    report = json.loads(out.read_text())
    assert report["config"]["dataset"] == "random"
    assert [run["summary"]["load"]["request_rate"] for run in report["runs"]] == [20.0, float("inf")]
    for run in report["runs"]:
        summary = run["summary"]
        assert summary["requests"] == summary["completed"] == NUM_PROMPTS and summary["failed"] == 0
        # SLOs of a minute: every request meets them, so goodput is the request throughput
        assert summary["goodput_rps"] == pytest.approx(summary["request_throughput_rps"]) and summary["goodput_rps"] > 0
        assert summary["output_tok_s"] == pytest.approx(NUM_PROMPTS * OUTPUT_LEN / summary["duration_s"])
        for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
            stats = summary[key]
            assert 0 <= stats["p50"] <= stats["p90"] <= stats["p99"], (key, stats)  # chunks read together: ITL ~0
        assert summary["ttft_s"]["p99"] <= summary["e2e_s"]["p99"]
        assert len(run["requests"]) == NUM_PROMPTS
        for request in run["requests"]:
            assert request["error"] is None and request["input_tokens"] == INPUT_LEN
            assert request["output_tokens"] == OUTPUT_LEN
            assert 0 < request["ttft_s"] < request["e2e_s"]
    if plot is not None:
        assert plot.stat().st_size > 10_000
