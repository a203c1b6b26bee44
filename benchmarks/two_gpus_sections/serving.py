"""The serving section: 1 prefill node on the first device + 1 decode node on the second, against two
colocated decode nodes (one per device), behind the router, at a TTFT/TPOT SLO (benchmarks/disagg_vs_colocated.py's
measurements)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from benchmarks.disagg_vs_colocated import FALLBACKS, row, unloaded
from benchmarks.harness.table import print_table
from benchmarks.serving_cluster import NODE_ARGS, NodeSpec, ServingCluster, counter_total, offer
from kvferry.engine.tokenizer import ModelTokenizer
from kvferry.loadgen.client import Endpoint
from kvferry.loadgen.datasets import RandomSpec, TokenWords, random_requests
from kvferry.loadgen.metrics import Slo
from kvferry.loadgen.runner import LoadShape

# 1P1D goodput at least this multiple of two colocated instances.
GOODPUT_TARGET = 1.3


def setups(args: argparse.Namespace) -> dict[str, list[NodeSpec]]:
    prefill_device, decode_device = args.devices
    node = (
        "--num-kv-blocks",
        str(args.node_kv_blocks),
        "--max-model-len",
        str(args.input_len + args.output_len + 64),
    )
    if not args.quick:
        node += ("--dtype", "bfloat16")
    on = {d: (*node, "--device", d) for d in args.devices}
    return {
        "disaggregated": [NodeSpec("prefill", "prefill-0", args=on[prefill_device]), NodeSpec("decode", "decode-0", args=on[decode_device])],
        "colocated": [NodeSpec("decode", "decode-0", args=on[prefill_device]), NodeSpec("decode", "decode-1", args=on[decode_device])],
    }  # fmt: skip


def serving(args: argparse.Namespace, model: Path) -> dict[str, object]:
    """One cluster per setup, kept up for its unloaded measurement and every rate (a fresh start costs tens of
    seconds on a GPU); the setups run one after the other, never side by side, disaggregated first: the rates
    are fractions of its prefill capacity (1 / its unloaded TTFT, which includes the transfer), the same for both."""
    words = TokenWords(ModelTokenizer(model))
    factors = [float(f) for f in args.load_factors.split(",")]
    spec = RandomSpec(args.num_prompts, args.input_len, args.output_len)
    # Prompts of their own for each rate (the same for both setups): a prompt seen before would hit the prefix cache.
    requests_at = [random_requests(words, spec, seed=args.seed + index) for index in range(len(factors))]
    base: dict[str, dict[str, float]] = {}
    runs = []
    for name, nodes in setups(args).items():
        print(f"{name}: {', '.join(f'{n.name} on {n.args[-1]}' for n in nodes)}", flush=True)
        with ServingCluster(model, nodes, node_args=NODE_ARGS) as cluster:
            endpoint = Endpoint(cluster.router_url, model.name)
            base[name] = unloaded(endpoint, words, args)  # after a warm-up request per node
            unit = 1.0 / base["disaggregated"]["ttft_s"]
            for factor, requests in zip(factors, requests_at, strict=True):
                load_before, fallbacks = os.getloadavg()[0], counter_total([cluster.router_url], FALLBACKS)
                result = offer(endpoint, requests, LoadShape(factor * unit, None, args.time_limit, args.seed))
                fallbacks = counter_total([cluster.router_url], FALLBACKS) - fallbacks
                runs.append((name, factor, factor * unit, result, load_before, fallbacks))
                print(
                    f"  {name} at {factor} x {unit:.2f}/s: {len(result.records)} requests in {result.duration_s:.1f} s",
                    flush=True,
                )
    slo = Slo(ttft_s=args.ttft_slo_factor * max(b["ttft_s"] for b in base.values()),
              tpot_s=args.tpot_slo_factor * max(b["tpot_s"] for b in base.values()))  # fmt: skip
    rows = [{"load_factor": factor, **row(name, rate, result, slo, load, fallbacks)}
            for name, factor, rate, result, load, fallbacks in runs]  # fmt: skip
    goodput = {(r["setup"], r["load_factor"]): r["goodput_rps"] or 0.0 for r in rows}
    ratios = {str(f): _ratio(goodput["disaggregated", f], goodput["colocated", f]) for f in factors}
    best = {name: max(g for (setup, _), g in goodput.items() if setup == name) for name in base}
    best_ratio = _ratio(best["disaggregated"], best["colocated"])
    met = best_ratio is not None and best_ratio >= GOODPUT_TARGET
    print(f"SLO: TTFT {slo.ttft_s:.3f} s, TPOT {slo.tpot_s:.4f} s (unloaded: {base})")
    print_table(rows, ["setup", "load_factor", "rate_rps", "goodput_rps", "slo_attainment", "ttft_p50_s", "ttft_p90_s",
                       "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "local_prefill_fallbacks"])  # fmt: skip
    print(f"goodput disaggregated / colocated by load factor: {ratios}; best goodput {best} -> {best_ratio} "
          f"(target {GOODPUT_TARGET}: {'met' if met else 'missed'})", flush=True)  # fmt: skip
    return {"workload": {"input_len": args.input_len, "output_len": args.output_len, "num_prompts": args.num_prompts,
                         "arrivals": "poisson", "load_factors": factors},
            "devices": {name: {n.name: n.args[-1] for n in nodes} for name, nodes in setups(args).items()},
            "unloaded": base, "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
            "rate_unit_rps": 1.0 / base["disaggregated"]["ttft_s"], "goodput_ratio_by_load_factor": ratios,
            "best_goodput_rps": best, "best_goodput_ratio": best_ratio, "target_goodput_ratio": GOODPUT_TARGET,
            "target_met": met, "rows": rows}  # fmt: skip


def _ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 3) if denominator else None
