"""benchmarks/gpu_two_gpus.py off the GPU: its device checks, its results file, and its smoke mode, which runs
every section's code path end to end on the CPU with the tiny model (real node processes, router and UCX)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.benchmarks_package import import_benchmark

REPO = Path(__file__).resolve().parents[2]
gpu_two_gpus = import_benchmark("gpu_two_gpus")
parse_args, save = gpu_two_gpus.parse_args, gpu_two_gpus.save


def test_devices_are_resolved_and_checked_against_this_host():
    assert parse_args(["--devices", "cpu,cpu"]).devices == ["cpu", "cpu"]
    with pytest.raises(ValueError, match="'cuda:7'"):
        parse_args(["--devices", "cpu,cuda:7"])
    with pytest.raises(SystemExit):
        parse_args(["--devices", "cpu"])
    with pytest.raises(SystemExit):
        parse_args(["--devices", "cpu,cpu", "--sections", "link,nccl"])


def test_a_section_is_merged_into_the_results_of_the_same_devices_only(tmp_path):
    path = tmp_path / "gpu_two_gpus.json"
    save(path, ["cuda:0", "cuda:1"], "link", {"rows": [1]})
    save(path, ["cuda:0", "cuda:1"], "ttft", {"lengths": {}})
    assert set(json.loads(path.read_text())) == {"devices", "link", "ttft"}
    save(path, ["cuda:0", "cuda:0"], "ttft", {"lengths": {}})
    results = json.loads(path.read_text())
    assert results["devices"] == ["cuda:0", "cuda:0"] and "link" not in results


@pytest.mark.slow
def test_the_smoke_mode_runs_every_section_on_the_cpu(tmp_path):
    command = [sys.executable, "-m", "benchmarks.gpu_two_gpus", "--devices", "cpu,cpu", "--quick", "--out", str(tmp_path)]
    # As a person runs it: from the checkout root, which -m puts on sys.path (the tests' PYTHONSAFEPATH would not).
    env = {key: value for key, value in os.environ.items() if key != "PYTHONSAFEPATH"}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "NCCL_NVLS_ENABLE=0" in run.stdout
    results = json.loads((tmp_path / "gpu_two_gpus.json").read_text())
    assert results["devices"] == ["cpu", "cpu"]

    link = results["link"]["rows"]
    assert [r["prompt_tokens"] for r in link] == [64, 256]
    for r in link:  # the blocks' bytes were checked on arrival; here the arithmetic
        assert r["mib"] * 2**20 == r["blocks"] * results["link"]["block_bytes"]
        assert r["share_of_copy"] == pytest.approx(r["peer_copy_ms"] / r["kvferry_ms"], rel=0.02)  # same bytes

    lengths = results["ttft"]["lengths"]
    assert lengths["256"]["kv_bytes_per_request"] == 4 * lengths["64"]["kv_bytes_per_request"] > 0
    for entry in lengths.values():
        share = entry["disaggregated"]["transfer_share"]["p50"]
        assert 0 < share < 1 and entry["disaggregated"]["ttft_ms"]["p50"] > entry["disaggregated"]["transfer_ms"]["p50"]

    serving = results["serving"]
    assert [(r["setup"], r["load_factor"]) for r in serving["rows"]] == [("disaggregated", 0.5), ("colocated", 0.5)]
    for r in serving["rows"]:
        assert r["completed"] + r["failed"] == 4 and r["completed"] > 0
    assert serving["devices"]["disaggregated"] == {"prefill-0": "cpu", "decode-0": "cpu"}
