"""Startup on real pods: from `kubectl apply` to Ready, and from the pods' start to the first token served.

Runs against the single-node cluster that `make k8s-up` brings up (the chart installed, the image
imported): applies examples/inferencecluster.yaml, renamed, into a namespace of its own, RUNS times, and
for each run records
- apply -> Ready: until the InferenceCluster's status says Ready (prefill, decode and router ready);
- apply -> first token: until a streaming completion through the router's Service yields its first token
  (tried every half second from the moment the Service exists);
- pod start -> first token: from the last of the prefill, decode and router containers' start (the
  kubelet's startedAt, whole seconds) to that first token: the model load, the readiness probes and
  discovery, what a rollout waits for;
and the image's size. Writes benchmarks/results/pods_startup.json.

    make k8s-up
    python -m benchmarks.pods_startup --kubeconfig ~/.cache/kvferry/k8s/admin.kubeconfig --runs 3
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.results import new_result, params_of, write_result
from benchmarks.harness.table import print_table
from kvferry.cache_dir import cache_dir

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "inferencecluster.yaml"
TIMEOUT_S = 900


def kubectl(kubeconfig: str, *args: str, input: str | None = None) -> str:
    done = subprocess.run(
        ["kubectl", f"--kubeconfig={kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def image_size_mib() -> int:
    reference = subprocess.run(
        ["bash", str(REPO / "image" / "build.sh"), "--print-ref"], capture_output=True, text=True, check=True
    ).stdout.strip()
    env = {**os.environ, "CONTAINERS_CONF": str(cache_dir() / "podman" / "containers.conf")}
    size = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{ .Size }}", reference],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    return int(size) >> 20


def first_token(router: str, model: str) -> bool:
    body = {
        "model": model,
        "prompt": "The capital of France is",
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
    }
    try:
        with httpx.stream("POST", f"{router}/v1/completions", json=body, timeout=10) as response:
            if response.status_code != 200:
                return False
            return any(line.startswith("data: {") for line in response.iter_lines())
    except httpx.HTTPError:
        return False


def container_starts(kubeconfig: str, namespace: str, cluster: str) -> list[float]:
    pods = json.loads(
        kubectl(
            kubeconfig,
            "-n",
            namespace,
            "get",
            "pods",
            "-o",
            "json",
            f"--selector=kvferry.dev/cluster={cluster},kvferry.dev/role in (prefill,decode,router)",
        )
    )
    starts = []
    for pod in pods["items"]:
        for status in pod["status"].get("containerStatuses") or []:
            started = status.get("state", {}).get("running", {}).get("startedAt")
            if started:
                starts.append(datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp())
    return starts


def one_run(kubeconfig: str, number: int) -> dict[str, Any]:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    cluster, model = f"startup{number}", manifest["spec"]["model"]["servedName"]
    manifest["metadata"]["name"] = cluster
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    kubectl(kubeconfig, "create", "namespace", namespace)
    try:
        applied = time.time()
        kubectl(kubeconfig, "-n", namespace, "apply", "-f", "-", input=json.dumps(manifest))
        ready = token = None
        router = ""
        while (ready is None or token is None) and time.time() - applied < TIMEOUT_S:
            if ready is None:
                status = (
                    json.loads(
                        kubectl(kubeconfig, "-n", namespace, "get", "inferencecluster", cluster, "-o", "json")
                    ).get("status")
                    or {}
                )
                ready = time.time() if status.get("phase") == "Ready" else None
            if not router:
                service = subprocess.run(
                    [
                        "kubectl",
                        f"--kubeconfig={kubeconfig}",
                        "-n",
                        namespace,
                        "get",
                        "service",
                        f"{cluster}-router",
                        "-o",
                        "jsonpath={.spec.clusterIP}:{.spec.ports[0].port}",
                    ],
                    capture_output=True,
                    text=True,
                )
                router = f"http://{service.stdout}" if service.returncode == 0 else ""
            if token is None and router and first_token(router, model):
                token = time.time()
            time.sleep(0.5)
        if ready is None or token is None:
            raise SystemExit(
                f"run {number}: not serving after {TIMEOUT_S}s (ready={ready}, first token={token})"
            )
        started = max(container_starts(kubeconfig, namespace, cluster))
        return {
            "apply_to_ready_s": round(ready - applied, 1),
            "apply_to_first_token_s": round(token - applied, 1),
            "pod_start_to_first_token_s": round(token - started, 1),
        }
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait", "--timeout=300s")


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "pods_startup")
    parser.add_argument("--kubeconfig", default=str(cache_dir() / "k8s" / "admin.kubeconfig"))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    runs = []
    for number in range(args.runs):
        runs.append(one_run(args.kubeconfig, number))
        print(f"run {number}: {runs[-1]}", flush=True)
    keys = list(runs[0])
    median = {key: statistics.median(run[key] for run in runs) for key in keys}
    print_table(
        [{"": f"run {i}", **run} for i, run in enumerate(runs)] + [{"": "median", **median}], ["", *keys]
    )
    params = {
        **params_of(args, leave_out=("results_dir", "kubeconfig")),
        "example": str(EXAMPLE.relative_to(REPO)),
    }
    result = new_result(
        "pods_startup", params, runs, summary={"median": median, "image_size_mib": image_size_mib()}
    )
    print(f"image: {result.summary['image_size_mib']} MiB; wrote {write_result(result, output_dir(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
