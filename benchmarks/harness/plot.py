"""Plots of results, when matplotlib is installed (the `bench` extra); without it a plot is skipped with a
message, and the result file is written all the same."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def pyplot_or_none() -> Any:
    """matplotlib.pyplot drawing to files, or None (and a message saying why) when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print("plot skipped: matplotlib is not installed (pip install 'kvferry[bench]')", flush=True)
        return None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as pyplot

    return pyplot


def save_plot(path: Path, draw: Callable[[Any], Any]) -> Path | None:
    """`draw(pyplot)` returns a figure, saved to `path`; None where there is no matplotlib to draw with."""
    pyplot = pyplot_or_none()
    if pyplot is None:
        return None
    figure = draw(pyplot)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    print(f"wrote {path}", flush=True)
    return path
