"""benchmarks/ as one suite: every benchmark a module with main(argv), every result file in the one schema,
and `kvferry bench` listing and running them by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.benchmarks_package import import_benchmark

from kvferry.cli import bench as bench_commands
from kvferry.cli import main as kvferry_main

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
SUMMARIES = bench_commands.benchmark_summaries()
schema = import_benchmark("harness.schema")
results = import_benchmark("harness.results")
side_by_side = import_benchmark("harness.side_by_side")

# Imports every benchmark in one fresh interpreter (the checkout on its path, as `python -m` has it) and
# reports, per module, what importing it did besides defining things.
IMPORT_REPORT = """
import contextlib, inspect, io, json, os, sys
from pathlib import Path

results = Path(sys.argv[1])
def files():
    return {p.name: p.stat().st_mtime_ns for p in results.iterdir()}

report = {}
for name in sys.argv[2:]:
    env, cwd, before, out = dict(os.environ), os.getcwd(), files(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        module = __import__(f"benchmarks.{name}", fromlist=["main"])
    main = getattr(module, "main", None)
    report[name] = {
        "printed": out.getvalue(),
        "environ_changed": sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k)),
        "cwd_changed": os.getcwd() != cwd,
        "results_changed": sorted(k for k in set(before) | set(files()) if before.get(k) != files().get(k)),
        "main_parameters": list(inspect.signature(main).parameters) if callable(main) else None,
        "argv_default": inspect.signature(main).parameters["argv"].default if callable(main) and
            "argv" in inspect.signature(main).parameters else "missing",
    }
print(json.dumps(report))
"""


# What libraries put in os.environ when imported, for any process using them: ucxx its UCX defaults, torch's
# inductor its cache folder (when triton kernels are defined).
LIBRARY_SETTINGS = ("UCX_", "TORCHINDUCTOR_")


@pytest.fixture(scope="module")
def import_report() -> dict[str, dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_REPORT, str(RESULTS), *SUMMARIES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_suite_finds_the_benchmarks_and_not_the_code_they_share():
    assert {"offline_throughput", "transfer", "gpu_serving", "soak"} <= set(SUMMARIES)
    assert not {"serving_cluster", "gpu_roofline", "soak_sampling", "__init__"} & set(SUMMARIES)
    for name, summary in SUMMARIES.items():
        assert summary and "\n" not in summary, f"{name} has no one-line summary"


@pytest.mark.slow
@pytest.mark.parametrize("name", SUMMARIES)
def test_a_benchmark_imports_without_side_effects_and_has_main(name, import_report):
    report = import_report[name]
    assert report["main_parameters"] == ["argv"], (
        f"benchmarks/{name}.py needs main(argv: list[str] | None = None)"
    )
    assert report["argv_default"] is None
    assert report["printed"] == ""
    assert [key for key in report["environ_changed"] if not key.startswith(LIBRARY_SETTINGS)] == []
    assert not report["cwd_changed"]
    assert report["results_changed"] == []


def test_only_benchmarks_define_main():
    # A module with main() but no `__main__` block would be a script that `kvferry bench` cannot find.
    defining_main = {
        path.stem for path in (REPO / "benchmarks").glob("*.py") if "\ndef main(" in path.read_text()
    }
    assert defining_main == set(SUMMARIES)


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda path: path.name)
def test_every_result_file_is_in_the_schema_of_a_benchmark(path):
    result = results.read_result(path)
    assert result.benchmark in SUMMARIES
    assert path.stem.startswith(result.benchmark)
    assert set(json.loads(path.read_text())) == set(schema.BenchmarkResult.model_fields)


def _result(**fields: object) -> dict[str, object]:
    valid = {
        "benchmark": "offline_throughput",
        "created": "2026-01-02T03:04:05Z",
        "command": ["offline_throughput.py", "--quick"],
        "environment": {"python": "3.11"},
        "params": {"size": "small"},
        "rows": [{"variant": "kvferry", "tok_s": 2.0}, {"variant": "transformers", "tok_s": 1.0}],
        "baseline": "transformers",
        "summary": {},
        "notes": [],
    }
    return {**valid, **fields}


def test_the_schema_refuses_what_is_not_a_result():
    assert schema.BenchmarkResult.model_validate(_result()).created == datetime(
        2026, 1, 2, 3, 4, 5, tzinfo=UTC
    )
    refused = [
        {key: value for key, value in _result().items() if key != "params"},
        _result(created="2026-01-02T03:04:05+02:00"),
        _result(baseline="llama.cpp"),
        _result(rows=[{"tok_s": 2.0}]),
        _result(extra_key=1),
    ]
    for fields in refused:
        with pytest.raises(ValueError):
            schema.BenchmarkResult.model_validate(fields)


def test_a_result_is_written_where_asked_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv(results.RESULTS_ENV, str(tmp_path / "from-env"))
    assert results.results_dir() == tmp_path / "from-env"
    assert results.results_dir(tmp_path / "asked") == tmp_path / "asked"
    monkeypatch.delenv(results.RESULTS_ENV)
    assert results.results_dir(quick=True) == results.QUICK_RESULTS != results.RESULTS
    result = schema.BenchmarkResult.model_validate(_result())
    path = results.write_result(result, tmp_path, "offline_throughput_quick")
    assert path == tmp_path / "offline_throughput_quick.json"
    assert results.read_result(path) == result


def test_side_by_side_alternates_the_order_and_ratios_are_to_the_baseline():
    order: list[str] = []
    measured = side_by_side.side_by_side(
        {name: (lambda name=name: order.append(name) or {"round": len(order)}) for name in "AB"}, rounds=3
    )
    assert order == ["A", "B", "B", "A", "A", "B"]
    assert [m["round"] for m in measured["B"]] == [2, 3, 6]
    rows = [
        {"variant": "new", "size": 1, "gbps": 3.0},
        {"variant": "old", "size": 1, "gbps": 2.0},
        {"variant": "new", "size": 2, "gbps": 1.0},
        {"variant": "old", "size": 2, "gbps": 0.0},
    ]
    ratios = [row["gbps_vs_baseline"] for row in side_by_side.with_ratios(rows, "old", ["gbps"], ["size"])]
    assert ratios == [1.5, 1.0, None, None]


def test_kvferry_bench_lists_every_benchmark(capsys):
    assert kvferry_main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == list(SUMMARIES)
    for line, summary in zip(listed, SUMMARIES.values(), strict=True):
        assert line.endswith(summary)


def test_kvferry_bench_names_the_benchmarks_when_asked_for_an_unknown_one(capsys):
    assert kvferry_main(["bench", "no_such_benchmark", "--quick"]) == 2
    error = capsys.readouterr().err
    assert "no benchmark 'no_such_benchmark'" in error
    assert all(name in error for name in SUMMARIES)


def test_kvferry_bench_outside_a_checkout_says_so(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(bench_commands, "HARNESS_MARK", tmp_path / "benchmarks" / "harness" / "schema.py")
    assert kvferry_main(["bench", "offline_throughput"]) == 2
    assert "not in the installed package" in capsys.readouterr().err


def test_kvferry_bench_runs_the_benchmark_with_its_arguments():
    # --help: the benchmark's own parser answers, through `python -m benchmarks.NAME`, and nothing runs.
    run = subprocess.run(
        [sys.executable, "-m", "kvferry", "bench", "offline_throughput", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage: python -m benchmarks.offline_throughput" in run.stdout
    assert "--results-dir" in run.stdout
