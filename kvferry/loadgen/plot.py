"""Latency CDFs per run, and goodput against request rate when several rates were swept (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from kvferry.loadgen.metrics import Slo, summarize
from kvferry.loadgen.runner import RunResult


def load_pyplot():  # noqa: ANN201 - matplotlib's module, imported only when a plot is asked for
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit("plots need matplotlib: pip install 'kvferry[bench]' (or pip install matplotlib)") from exc
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as pyplot

    return pyplot


def cdf_line(axes, values: list[float], label: str) -> None:  # noqa: ANN001 - a matplotlib Axes
    values = sorted(values)
    if values:
        axes.plot([v * 1000 for v in values], [(i + 1) / len(values) for i in range(len(values))], label=label)


def plot_runs(path: Path, results: list[RunResult], labels: list[str], slo: Slo, series: list[str] | None = None) -> None:
    """One CDF line per run; with runs at several rates, goodput against rate, one line per series name
    (the setup or policy a run belongs to; default: all runs are one series)."""
    pyplot = load_pyplot()
    series = series or [""] * len(results)
    swept = [(name, r) for name, r in zip(series, results, strict=True) if r.shape.request_rate is not None]
    sweep = len({r.shape.request_rate for _, r in swept}) > 1
    figure, grid = pyplot.subplots(1, 5 if sweep else 4, figsize=(22 if sweep else 18, 4), squeeze=False)
    panels = grid[0]
    latencies = (
        ("TTFT", lambda r: [x.ttft_s for x in r.records if x.error is None and x.ttft_s is not None], slo.ttft_s),
        ("TPOT", lambda r: [t for x in r.records if x.error is None and (t := x.tpot_s) is not None], slo.tpot_s),
        ("ITL", lambda r: [g for x in r.records if x.error is None for g in x.itl_s], None),
        ("end to end", lambda r: [x.latency_s for x in r.records if x.error is None], None),
    )
    for axes, (title, values, bound) in zip(panels, latencies, strict=False):
        for result, label in zip(results, labels, strict=True):
            cdf_line(axes, values(result), label)
        if bound is not None:
            axes.axvline(bound * 1000, color="grey", linestyle="--", label="SLO")
        axes.set(title=f"{title} CDF", xlabel="ms", ylabel="fraction of requests")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    if sweep:
        for name in dict.fromkeys(series):
            runs = sorted((r for n, r in swept if n == name), key=lambda r: r.shape.request_rate)
            rates = [r.shape.request_rate for r in runs]
            summaries = [summarize(r.records, r.duration_s, slo) for r in runs]
            prefix = f"{name} " if name else ""
            (line,) = panels[4].plot(rates, [s["goodput_rps"] for s in summaries], marker="o", label=f"{prefix}goodput")
            panels[4].plot(rates, [s["request_throughput_rps"] for s in summaries], marker="x", linestyle=":",
                           color=line.get_color(), label=f"{prefix}throughput")
        panels[4].set(title="goodput against rate", xlabel="offered requests/s", ylabel="requests/s")
        panels[4].grid(alpha=0.3)
        panels[4].legend(fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
