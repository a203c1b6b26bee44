"""The transfer result as tables: on the terminal after a run, and as docs/benchmarks.md's markdown."""

from __future__ import annotations

from typing import Any

from benchmarks.harness.table import print_table
from benchmarks.transfer_peers.bandwidth import ENGINES
from benchmarks.transfer_peers.workload import size_label


def print_bandwidth(rows: list[dict[str, Any]]) -> None:
    columns = ["block", "kvferry_gbps", "nixl_gbps", "mooncake_tcp_gbps", "memcpy_gbps", "kvferry_contiguous_gbps",
               "kvferry_p50_ms", "kvferry_p99_ms", "nixl_p99_ms", "mooncake_tcp_p99_ms"]  # fmt: skip
    print_table([{"block": size_label(r["block_bytes"]), **r} for r in rows], columns)
    for r in rows:
        if "rounds" in r:
            ratios = {name: r["rounds"][name] for name in ("kvferry_over_nixl", "kvferry_share_of_memcpy")}
            print(
                f"{size_label(r['block_bytes']):>7s} per round: "
                + "; ".join(f"{k} {v}" for k, v in ratios.items())
            )


def print_ttft(rows: list[dict[str, Any]]) -> None:
    table = [
        {
            **r,
            "kv": size_label(r["kv_bytes"]),
            "share": "-"
            if r["transfer_share_of_ttft"] is None
            else f"{100 * r['transfer_share_of_ttft']:.2f}%",
        }
        for r in rows
    ]
    print_table(table, ["prompt_tokens", "kv", "ttft_ms", "transfer_ms", "share", "transfer_scattered_ms"])


def _cell(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def markdown_tables(payload: dict[str, Any]) -> str:
    """The tables of docs/benchmarks.md's Transfer section, from a results file."""
    lines = [] if not payload.get("rows") else ["| block | kvferry GB/s | NIXL GB/s | Mooncake TCP GB/s | memcpy GB/s | kvferry contiguous GB/s "
             "| kvferry p50 / p99 ms | NIXL p50 / p99 ms | Mooncake TCP p50 / p99 ms |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in payload.get("rows", []):
        pairs = [f"{_cell(r[f'{n}_p50_ms'], 1)} / {_cell(r[f'{n}_p99_ms'], 1)}" for n in ENGINES]
        lines.append(f"| {size_label(r['block_bytes'])} | {_cell(r['kvferry_gbps'])} | {_cell(r['nixl_gbps'])} "
                     f"| {_cell(r['mooncake_tcp_gbps'])} | {_cell(r['memcpy_gbps'])} | {_cell(r['kvferry_contiguous_gbps'])} "
                     f"| {' | '.join(pairs)} |")  # fmt: skip
    ttft = payload.get("ttft", {}).get("rows", [])
    if ttft:
        lines += [""] * bool(lines) + ["| prompt tokens | KV bytes | TTFT ms | transfer ms (coalesced) | share of TTFT "
                  "| transfer ms (scattered blocks) | share |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in ttft:
            share = (
                _cell(None if r["transfer_share_of_ttft"] is None else 100 * r["transfer_share_of_ttft"])
                + " %"
            )
            scattered = (
                _cell(
                    None
                    if r["transfer_scattered_share_of_ttft"] is None
                    else 100 * r["transfer_scattered_share_of_ttft"]
                )
                + " %"
            )
            lines.append(f"| {r['prompt_tokens']} | {size_label(r['kv_bytes'])} | {_cell(r['ttft_ms'], 0)} | {_cell(r['transfer_ms'])} "
                         f"| {share} | {_cell(r['transfer_scattered_ms'])} | {scattered} |")  # fmt: skip
    return "\n".join(lines)
