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
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import CACHE, cached_model
from benchmarks.harness.results import new_result, write_result
from benchmarks.harness.schema import BenchmarkResult
from benchmarks.two_gpus_sections.facts import facts
from benchmarks.two_gpus_sections.link import link
from benchmarks.two_gpus_sections.serving import serving
from benchmarks.two_gpus_sections.ttft import ttft
from kvferry.engine.devices import resolve_device

# No NVLink multicast anywhere (on a shared host it can take the GPUs out of service): NCCL, PyTorch's symmetric
# memory and NVSHMEM read these when they start (nothing here starts them); main() sets them, every child
# process inherits them.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SECTIONS = ("link", "ttft", "serving")
GPU_MODEL = Path("/tmp/kvferry-llama-8b-shape")  # where tests/gpu/run.sh keeps the 8B-shaped checkpoint too


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
