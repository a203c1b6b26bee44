"""A results table on the terminal: one line per row, the given columns aligned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    widths = [max(len(c), *(len(f"{r.get(c)}") for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(f"{row.get(c)}".ljust(w) for c, w in zip(columns, widths, strict=True)))
