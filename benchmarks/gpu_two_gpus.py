"""Disaggregated serving on two GPUs (issue [9]): prefill on one card, decode on the other, in one run.

    python -m benchmarks.gpu_two_gpus --devices cuda:0,cuda:1   # 2 GPUs, ucxx installed (docs/two_gpus.md)
    python -m benchmarks.gpu_two_gpus --devices cuda:0,cuda:0   # one GPU: two processes share it
    python -m benchmarks.gpu_two_gpus --devices cpu,cpu --quick # the same code path on the CPU, tiny model

Sections (--sections picks some; each is merged into --out's gpu_two_gpus.json as it finishes, so that a
later run of some sections keeps the others'). The result, every section of the devices' latest runs, is
benchmarks/results/gpu_two_gpus_{two_cards,one_card,cpu}.json, by the devices' layout.
- link: a torch copy_ from the first device to the second (the limit: bytes over the median time of several,
  CUDA events on the source's stream), beside kvferry's P -> D transfer of the same bytes of KV blocks from a
  pool in this process on the first device into one in a peer process on the second (UCX, cuda_ipc between
  GPUs), for a 1k and an 8k prompt's KV of an 8B-shaped model (64 and 512 contiguous 2 MiB blocks).
- ttft: the transfer's share of TTFT for 1k and 8k prompts, one request at a time: this process prefills on
  the first device, a child decodes on the second (benchmarks/gpu_disaggregated.py's requests), beside the
  prefill engine serving the same requests whole.
- serving: 1 prefill node on the first device + 1 decode node on the second, against two colocated decode
  nodes (one per device), behind the router, at a TTFT/TPOT SLO on a prefill-heavy workload with Poisson
  arrivals at a few rates (benchmarks/disagg_vs_colocated.py's measurements): goodput side by side, TTFT and
  TPOT p50/p90/p99. The SLO and the rates come from each setup's unloaded TTFT and TPOT, as there.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and its PyTorch and NVSHMEM twins): nothing here may use it.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.disagg_vs_colocated import FALLBACKS, row, unloaded
from benchmarks.gpu_disaggregated import (
    DECODE_PEER,
    MODEL_NAME,
    colocated_request,
    decode_process,
    disaggregated_request,
    summarize,
)
from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import CACHE, cached_model, environment
from benchmarks.harness.results import new_result, write_result
from benchmarks.harness.schema import BenchmarkResult
from benchmarks.harness.table import print_table
from benchmarks.serving_cluster import NODE_ARGS, NodeSpec, ServingCluster, counter_total, offer
from benchmarks.transfer_cuda import SHAPE
from kvferry.engine.devices import make_current, resolve_device
from kvferry.engine.engine_args import EngineArgs
from kvferry.engine.tokenizer import ModelTokenizer
from kvferry.loadgen.client import Endpoint
from kvferry.loadgen.datasets import RandomSpec, TokenWords, random_requests
from kvferry.loadgen.metrics import Slo
from kvferry.loadgen.runner import LoadShape

# No NVLink multicast anywhere (on a shared host it can take the GPUs out of service): NCCL, PyTorch's symmetric
# memory and NVSHMEM read these when they start (nothing here starts them); main() sets them, every child
# process inherits them.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SECTIONS = ("link", "ttft", "serving")
GPU_MODEL = Path("/tmp/kvferry-llama-8b-shape")  # where tests/gpu/run.sh keeps the 8B-shaped checkpoint too
WARM_RUNS = 2
# P -> D at least this share of the peer copy; 1P1D goodput at least this multiple of two colocated instances.
TRANSFER_TARGET, GOODPUT_TARGET = 0.70, 1.3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "gpu_two_gpus", out_alias=False)
    parser.add_argument("--devices", default="cuda:0,cuda:1", help="prefill device,decode device")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"some of {','.join(SECTIONS)}")
    parser.add_argument(
        "--model", type=Path, default=None, help=f"checkpoint (default: {GPU_MODEL}, made if missing)"
    )
    parser.add_argument("--out", type=Path, default=CACHE / "benchmarks", help="folder of the sections file")
    parser.add_argument("--runs", type=int, default=8, help="timed copies and transfers per size")
    parser.add_argument("--lengths", default="1024,8192", help="prompt lengths of the ttft section")
    parser.add_argument("--requests", type=int, default=20, help="requests per length in the ttft section")
    parser.add_argument("--ttft-output-len", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=4096, help="serving: prompt tokens (prefill-heavy)")
    parser.add_argument("--output-len", type=int, default=64, help="serving: output tokens")
    parser.add_argument("--num-prompts", type=int, default=48, help="serving: requests per rate")
    parser.add_argument(
        "--load-factors", default="0.3,0.6,0.9", help="serving: rates as fractions of 1 / unloaded TTFT"
    )
    parser.add_argument(
        "--tpot-slo-factor", type=float, default=1.5, help="TPOT SLO = this x the slower unloaded TPOT"
    )
    parser.add_argument(
        "--ttft-slo-factor", type=float, default=5.0, help="TTFT SLO = this x the slower unloaded TTFT"
    )
    parser.add_argument(
        "--node-kv-blocks",
        type=int,
        default=8192,
        help="serving: each node's pool, explicit (two may share a GPU)",
    )
    parser.add_argument("--time-limit", type=float, default=120.0, help="serving: seconds per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="tiny model, small pools, few requests: a smoke run"
    )
    args = parser.parse_args(argv)
    args.devices = [str(resolve_device(d, torch.cuda.device_count())) for d in args.devices.split(",")]
    if len(args.devices) != 2:
        parser.error("--devices takes two devices: prefill,decode")
    args.sections = [s for s in args.sections.split(",") if s]
    if unknown := set(args.sections) - set(SECTIONS):
        parser.error(f"unknown sections {sorted(unknown)}; pick from {SECTIONS}")
    if args.quick:
        args.runs, args.lengths, args.requests, args.ttft_output_len = 2, "64,256", 2, 8
        args.input_len, args.output_len, args.num_prompts, args.load_factors = 64, 8, 4, "0.5"
        args.node_kv_blocks, args.time_limit = 1024, 60.0
    return args


# ---- facts ---------------------------------------------------------------------------------------
def facts(devices: list[str]) -> dict[str, object]:
    """GPU names, driver, torch/triton versions, and whether the two GPUs reach each other directly."""
    on_gpu = [torch.device(d) for d in devices if d.startswith("cuda")]
    if on_gpu:
        # nvidia-smi's names and driver, triton and transformers versions
        from benchmarks.gpu_serving import gpu_facts

        found = gpu_facts()
    else:
        found = {
            **environment(),
            "nvidia_smi": None,
            "triton": _version("triton"),
            "cuda_runtime": torch.version.cuda,
        }
    found["devices"] = {d: torch.cuda.get_device_name(d) if d.startswith("cuda") else "cpu" for d in devices}
    if len({d.index for d in on_gpu}) == 2:
        found["peer_access"] = torch.cuda.can_device_access_peer(on_gpu[0].index, on_gpu[1].index)
    return found


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


# ---- link: peer copy beside the P -> D transfer ------------------------------------------------------
def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds `fn` takes: CUDA events on the device's current stream (where torch runs a copy from it to
    another GPU), the wall clock on the CPU."""
    if device.type != "cuda":
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def peer_copy(src_device: str, dst_device: str, nbytes: int, runs: int) -> dict[str, float]:
    """torch's copy_ of `nbytes` from one device to the other, median of `runs` after warm-ups."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=src_device)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dst_device)
    for device in {src.device, dst.device}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    times = [timed(lambda: dst.copy_(src), src.device) for _ in range(runs + WARM_RUNS)][WARM_RUNS:]
    return {"gbps": nbytes / statistics.median(times) / 1e9, "median_ms": 1e3 * statistics.median(times)}


def link(args: argparse.Namespace) -> dict[str, object]:
    """For each prompt length, its KV (contiguous blocks) over UCX from a pool here into a peer process's pool."""
    # The transfer peer is the tests' own (tests/support/), found because benchmarks run from the checkout
    # root; imported here so that the module loads where `tests` is not importable (the unit tests).
    from tests.support.peer_process import PeerProcess
    from tests.support.transfer_peer import block_digests, make_pool

    prefill_device, decode_device = args.devices
    shape = {"num_layers": 4, "kv_heads": 4, "head_dim": 64} if args.quick else SHAPE
    lengths = [int(n) for n in args.lengths.split(",")]
    num_blocks = 1 + max(lengths) // 16 + 1  # the null block, the longest prompt's blocks, one spare
    make_current(torch.device(prefill_device))  # before UCX starts in this thread
    pool = make_pool(
        "bfloat16", num_blocks, 16, shape["num_layers"], shape["kv_heads"], shape["head_dim"], prefill_device
    )
    pool.tensor.view(torch.int16).random_(-(2**15), 2**15 - 1)
    registry = f"file://{tempfile.mkdtemp(prefix='kvferry-registry-')}"
    from kvferry.transfer import TransferEngine
    from kvferry.transfer.kv_connector import DestinationHandle, KVSender, pool_description

    engine = TransferEngine()
    engine.initialize("prefill-link", registry, "ucx", pool=pool_description(MODEL_NAME, pool))
    receiver = PeerProcess("decode-link", registry, dtype="bfloat16", num_blocks=num_blocks, device=decode_device,
                           model=MODEL_NAME, block_size=16, **shape)  # fmt: skip
    rows = []
    try:
        sender = KVSender(engine, pool, MODEL_NAME)
        for length in lengths:
            blocks = list(range(1, 1 + length // 16))
            nbytes = len(blocks) * pool.block_bytes()
            copy = peer_copy(prefill_device, decode_device, nbytes, args.runs)
            times = []
            for run in range(args.runs + WARM_RUNS):
                request_id = f"link-{length}-{run}"
                handle = DestinationHandle.from_json(
                    receiver.call("expect", request_id=request_id, block_ids=blocks)["handle"]
                )
                started = time.perf_counter()
                sent = sender.send_blocks(request_id, blocks, handle)
                times.append(time.perf_counter() - started)
                assert sent == nbytes and receiver.call("wait", request_id=request_id)["arrived"], request_id
            ends = [blocks[0], blocks[-1]]  # the bytes arrived, not only the completion
            assert receiver.call("digest", block_ids=ends)["digests"] == block_digests(pool, ends), (
                "KV arrived changed"
            )
            median = statistics.median(times[WARM_RUNS:])
            rows.append({"prompt_tokens": length, "blocks": len(blocks), "mib": nbytes / 2**20,
                         "peer_copy_gbps": _digits(copy["gbps"]), "peer_copy_ms": _digits(copy["median_ms"]),
                         "kvferry_gbps": _digits(nbytes / median / 1e9), "kvferry_ms": _digits(1e3 * median),
                         "kvferry_max_ms": _digits(1e3 * max(times[WARM_RUNS:])),
                         "share_of_copy": _digits(nbytes / median / 1e9 / copy["gbps"])})  # fmt: skip
    finally:
        receiver.close()
        engine.close()
    print_table(rows, list(rows[0]))
    met = all(r["share_of_copy"] >= TRANSFER_TARGET for r in rows)
    print(
        f"P -> D at least {TRANSFER_TARGET:.0%} of the peer copy at every size: {'met' if met else 'missed'}",
        flush=True,
    )
    return {
        "rows": rows,
        "target_share_of_copy": TRANSFER_TARGET,
        "target_met": met,
        "block_bytes": pool.block_bytes(),
    }


def _digits(value: float) -> float:
    """Four significant digits: a CPU smoke run's shares are thousandths, a GPU's GB/s hundreds."""
    return float(f"{value:.4g}")


# ---- ttft: the transfer's share of TTFT ------------------------------------------------------------
def engine_args(args: argparse.Namespace, device: str) -> EngineArgs:
    if args.quick:
        return EngineArgs(dtype="float32", device=device, max_model_len=512, max_num_seqs=8, max_num_batched_tokens=512,
                          num_kv_blocks=256, enable_prefix_caching=False)  # fmt: skip
    longest = max(int(n) for n in args.lengths.split(","))
    return EngineArgs(dtype="bfloat16", device=device, max_model_len=longest + 256, max_num_seqs=8,
                      max_num_batched_tokens=longest, num_kv_blocks=2 * (longest + 256) // 16 + 2,
                      enable_prefix_caching=False)  # fmt: skip


def ttft(args: argparse.Namespace, model: Path) -> dict[str, object]:
    from kvferry.engine import LLMEngine
    from kvferry.transfer import TransferEngine
    from kvferry.transfer.kv_connector import KVSender, pool_description

    prefill_device, decode_device = args.devices
    registry = f"file://{tempfile.mkdtemp(prefix='kvferry-registry-')}"
    prefill = LLMEngine(model, engine_args(args, prefill_device))
    transfer = TransferEngine()
    transfer.initialize("prefill-ttft", registry, "ucx", pool=pool_description(MODEL_NAME, prefill.pool))
    sender = KVSender(transfer, prefill.pool, MODEL_NAME)
    context = multiprocessing.get_context("spawn")
    conn, child_conn = context.Pipe()
    child = context.Process(
        target=decode_process,
        args=(child_conn, str(model), registry, engine_args(args, decode_device)),
        daemon=True,
    )
    child.start()
    result: dict[str, object] = {"decode_pool_blocks": conn.recv()["pool_blocks"], "output_len": args.ttft_output_len,
                                 "requests_per_length": args.requests, "lengths": {}}  # fmt: skip
    try:
        sender.handshake(DECODE_PEER)
        rng = random.Random(args.seed)
        vocab = prefill.model_config.vocab_size
        for length in [int(n) for n in args.lengths.split(",")]:
            prompts = [
                [rng.randrange(vocab) for _ in range(length)] for _ in range(args.requests + WARM_RUNS)
            ]
            for i, prompt in enumerate(
                prompts[:WARM_RUNS]
            ):  # compiles this length's shapes in both processes
                colocated_request(prefill, f"warm-c{length}-{i}", prompt, 4)
                disaggregated_request(prefill, sender, conn, f"warm-d{length}-{i}", prompt, 4)
            timed_prompts = prompts[WARM_RUNS:]
            colocated = [
                colocated_request(prefill, f"c{length}-{i}", p, args.ttft_output_len)
                for i, p in enumerate(timed_prompts)
            ]
            disaggregated = [disaggregated_request(prefill, sender, conn, f"d{length}-{i}", p, args.ttft_output_len)
                             for i, p in enumerate(timed_prompts)]  # fmt: skip
            entry = {"colocated": summarize(colocated), "disaggregated": summarize(disaggregated),
                     "kv_bytes_per_request": disaggregated[0]["kv_bytes"]}  # fmt: skip
            result["lengths"][str(length)] = entry  # type: ignore[index]
            d, c = entry["disaggregated"], entry["colocated"]
            print(f"{length}-token prompts, P on {prefill_device}, D on {decode_device}: TTFT p50 colocated "
                  f"{c['ttft_ms']['p50']:.1f} ms, disaggregated {d['ttft_ms']['p50']:.1f} ms (transfer "
                  f"{d['transfer_ms']['p50']:.2f} ms = {d['transfer_share']['p50']:.1%} of TTFT, p99 "
                  f"{d['transfer_share']['p99']:.1%}); TPOT p50 {c['tpot_ms']['p50']:.2f} vs {d['tpot_ms']['p50']:.2f} ms",
                  flush=True)  # fmt: skip
    finally:
        conn.send({"cmd": "quit"})
        child.join(timeout=60)
        transfer.close()
        del prefill, sender
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the serving section's nodes may share this GPU
    return result


# ---- serving: 1P1D against two colocated instances ------------------------------------------------
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


# ---- the run -----------------------------------------------------------------------------------------
def model_for(args: argparse.Namespace) -> Path:
    if args.model is not None:
        return args.model
    if args.quick:
        return cached_model("llama", "tiny")
    if not (GPU_MODEL / "config.json").is_file():
        from kvferry.engine.make_model import make_model

        make_model("llama", "8b-shape", GPU_MODEL, dtype="bfloat16", num_shards=4, device=args.devices[0])
    return GPU_MODEL


def save(path: Path, devices: list[str], section: str, payload: dict[str, object]) -> None:
    """Merge one section into the results file: a run of some sections keeps the others' earlier results
    (each with its own time), unless they were measured on other devices."""
    existing = json.loads(path.read_text()) if path.is_file() else {}
    if existing.get("devices") != devices:
        existing = {"devices": devices}
    existing[section] = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **payload}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(existing, indent=2) + "\n")


def layout(devices: list[str]) -> str:
    """The result's name: where prefill and decode ran."""
    if devices[0] == "cpu":
        return "gpu_two_gpus_cpu"
    return "gpu_two_gpus_one_card" if devices[0] == devices[1] else "gpu_two_gpus_two_cards"


def result_from_sections(sections: dict[str, Any], notes: Sequence[str] = ()) -> BenchmarkResult:
    """The sections file as a suite result: a row per link size, per ttft prompt length and per serving run
    (each with its section), the rest of each section in the summary."""
    rows: list[dict[str, Any]] = [{"section": "link", **r} for r in sections.get("link", {}).get("rows", [])]
    rows += [{"section": "ttft", "prompt_tokens": int(length), **entry}
             for length, entry in sections.get("ttft", {}).get("lengths", {}).items()]  # fmt: skip
    rows += [
        {"section": "serving", "variant": r["setup"], **r}
        for r in sections.get("serving", {}).get("rows", [])
    ]
    summary = {section: {key: value for key, value in sections[section].items() if key not in ("rows", "lengths")}
               for section in SECTIONS if section in sections}  # fmt: skip
    return new_result("gpu_two_gpus", {"devices": sections["devices"]}, rows, summary=summary, notes=notes,
                      environment=sections["environment"])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    os.environ.update(NO_MULTICAST)
    args = parse_args(argv)
    found = facts(args.devices)
    print(f"devices {found['devices']}; nvidia-smi: {found['nvidia_smi']}; torch {found['torch']}, triton "
          f"{found['triton']}, CUDA runtime {found['cuda_runtime']}; peer access {found.get('peer_access')}; "
          f"NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}", flush=True)  # fmt: skip
    path = args.out / "gpu_two_gpus.json"
    save(path, args.devices, "environment", found)
    model = model_for(args)
    for section in args.sections:
        started = time.monotonic()
        print(f"== {section}", flush=True)
        payload = (
            link(args)
            if section == "link"
            else ttft(args, model)
            if section == "ttft"
            else serving(args, model)
        )
        save(path, args.devices, section, {**payload, "seconds": round(time.monotonic() - started, 1)})
    print(f"wrote {path}")
    result = result_from_sections(json.loads(path.read_text()))
    print(f"wrote {write_result(result, output_dir(args), layout(args.devices))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
