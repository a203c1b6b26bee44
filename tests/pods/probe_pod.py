"""A short-lived pod of the kvferry image that runs a Python script, which prints one JSON object on a line: what the security
tests ask of the cluster's network from inside it (tests/pods/test_real_pods_network_policy.py,
test_real_pods_kv_token.py). It is deleted whatever happens."""

from __future__ import annotations

import json
from typing import Any

from cluster.waiting import wait_until
from pods.real_node import kvferry_image
from pods.served_cluster import ServedCluster


def run_in_pod(served: ServedCluster, name: str, labels: str, script: str, *args: str,
               env: dict[str, str] | None = None, run_s: float = 60) -> Any:  # fmt: skip
    """Run `script` with `args` in a pod labelled `labels` (k=v,...); the last JSON object it printed on a line
    of its own (libraries may log after it: UCX warns at exit)."""
    served.kubectl("run", name, f"--image={kvferry_image()}", "--image-pull-policy=Never", "--restart=Never",
                   f"--labels={labels}", *(f"--env={key}={value}" for key, value in (env or {}).items()),
                   "--command", "--", "python3", "-c", script, *args)  # fmt: skip
    try:
        wait_until(f"the pod {name} finished",
                   lambda: (served.get("pod", name) or {}).get("status", {}).get("phase") in ("Succeeded", "Failed"),
                   120 + run_s, interval=1)  # fmt: skip
        printed = served.kubectl("logs", name).stdout.splitlines()
        return json.loads([line for line in printed if line.startswith("{")][-1])
    finally:
        served.kubectl("delete", "pod", name, "--ignore-not-found", "--wait=true", "--timeout=120s")
