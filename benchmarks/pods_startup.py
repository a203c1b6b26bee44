"""Startup on real pods: from `kubectl apply` to Ready, and from the pods' start to the first token served.

Runs against the single-node cluster that `make k8s-up` brings up (the chart installed, the image
imported): applies examples/inferencecluster.yaml, renamed, into the operator's namespace (the chart's
operator keeps to its release namespace), RUNS times, each cluster deleted with its pods before the next, and
for each run records
- apply -> Ready: until the InferenceCluster's status says Ready (prefill, decode and router ready);
- apply -> first token: until a streaming completion through the router's Service yields its first token
  (tried every half second from the moment the Service exists);
- pod start -> first token: from the last of the prefill, decode and router containers' start (the
  kubelet's startedAt, whole seconds) to that first token: the model load, the readiness probes and
  discovery, what a rollout waits for;
and the image's size. With --images A,B,... (each imported into the node) the runs alternate between the
images, the cluster's spec.image naming each in turn, and the summary holds each image's medians and their
ratios to the first's: a change to the image measured side by side with its baseline.
Writes benchmarks/results/pods_startup.json.

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


def built_image() -> str:
    """The reference `make image` builds."""
    return subprocess.run(
        ["bash", str(REPO / "image" / "build.sh"), "--print-ref"], capture_output=True, text=True, check=True
    ).stdout.strip()


def image_size_mib(reference: str) -> int:
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


def one_run(kubeconfig: str, namespace: str, number: int, image: str) -> dict[str, Any]:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    cluster, model = f"startup-{uuid.uuid4().hex[:6]}", manifest["spec"]["model"]["servedName"]
    manifest["metadata"]["name"] = cluster
    manifest["spec"]["image"] = image
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
            "image": image,
            "apply_to_ready_s": round(ready - applied, 1),
            "apply_to_first_token_s": round(token - applied, 1),
            "pod_start_to_first_token_s": round(token - started, 1),
        }
    finally:
        kubectl(
            kubeconfig, "-n", namespace, "delete", "inferencecluster", cluster, "--wait", "--timeout=300s"
        )
        # Its pods go by garbage collection after it: gone before the next run starts, so that no two overlap.
        kubectl(kubeconfig, "-n", namespace, "wait", "pods", f"--selector=kvferry.dev/cluster={cluster}",
                "--for=delete", "--timeout=300s")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "pods_startup")
    parser.add_argument("--kubeconfig", default=str(cache_dir() / "k8s" / "admin.kubeconfig"))
    parser.add_argument("--runs", type=int, default=3, help="runs per image")
    parser.add_argument(
        "--namespace", default="kvferry", help="the operator's (the chart's release) namespace"
    )
    parser.add_argument(
        "--images", default="", help="images to alternate, comma-separated (default: make image's)"
    )
    args = parser.parse_args(argv)
    images = [image for image in args.images.split(",") if image] or [built_image()]
    runs = []
    for number in range(args.runs * len(images)):
        runs.append(one_run(args.kubeconfig, args.namespace, number, images[number % len(images)]))
        print(f"run {number}: {runs[-1]}", flush=True)
    keys = [key for key in runs[0] if key != "image"]
    medians = {image: {key: statistics.median(run[key] for run in runs if run["image"] == image) for key in keys}
               for image in images}  # fmt: skip
    print_table(
        [{"": f"run {i}", **run} for i, run in enumerate(runs)]
        + [{"": f"median, {image}", **median} for image, median in medians.items()],
        ["", "image", *keys],
    )
    params = {
        **params_of(args, leave_out=("results_dir", "kubeconfig")),
        "example": str(EXAMPLE.relative_to(REPO)),
    }
    summary = {
        "images": {image: {"median": median, "image_size_mib": image_size_mib(image),
                           "ratio_to_first": {key: round(medians[images[0]][key] / median[key], 3) for key in keys}}
                   for image, median in medians.items()},
    }  # fmt: skip
    result = new_result("pods_startup", params, runs, summary=summary)
    print(f"wrote {write_result(result, output_dir(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
