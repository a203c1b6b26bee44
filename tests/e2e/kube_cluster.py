"""The operator's end-to-end tests' view of the real control plane (tests/cluster/).

`Cluster` is a test's view of its own namespace: kubectl with JSON out, bounded waits. `OperatorProcess`
is one `python -m kvferry operator` subprocess watching that namespace, so a test can SIGKILL it like a
crashed pod and start it again. The fixtures that make them are in conftest.py beside this file.
"""

from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.kube_tools import KubeTools
from cluster.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "charts" / "kvferry" / "crds" / "inferenceclusters.kvferry.dev.yaml"
CRD = "inferenceclusters.kvferry.dev"
# Short enough that tests see leader changes and resyncs within seconds.
TEST_LEASE_DURATION_S = 4.0
TEST_RESYNC_S = 5.0
TEST_SIGNING_SEED = b"kvferry-e2e-signing-seed-0123456789abcdef"  # the operators' (internal TLS certificates)
# `python -m kvferry` loads the node commands and with them torch: seconds on an idle machine, more than
# a minute on a loaded one. Tests wait for the start first, so their other deadlines time the operator.
OPERATOR_START_S = 180.0


@dataclass
class Cluster:
    """kubectl bound to one test namespace, on the kwok control plane or the pods tier's real node."""

    kube: KubeTools
    namespace: str
    wait = staticmethod(wait_until)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.kube.kubectl(f"--namespace={self.namespace}", *args, input=input, check=check)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        done = self.kubectl("get", kind, name, "-o", "json", check=False)
        if done.returncode != 0:
            assert "NotFound" in done.stderr, done.stderr
            return None
        return json.loads(done.stdout)

    def items(self, kind: str, selector: str = "") -> list[dict[str, Any]]:
        args = ["get", kind, "-o", "json"] + ([f"--selector={selector}"] if selector else [])
        return json.loads(self.kubectl(*args).stdout)["items"]

    def apply(self, manifest: dict[str, Any] | str, *extra: str) -> subprocess.CompletedProcess[str]:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.kubectl("apply", "-f", "-", *extra, input=text)

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.kubectl("patch", "inferencecluster", name, "--type=merge", "-p", json.dumps({"spec": spec}))

    def status(self, name: str) -> dict[str, Any]:
        return (self.get("inferencecluster", name) or {}).get("status") or {}

    def wait_phase(self, name: str, phase: str, timeout: float = 120.0) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            body = self.get("inferencecluster", name) or {}
            status = body.get("status") or {}
            current = status.get("observedGeneration") == body.get("metadata", {}).get("generation")
            return status if current and status.get("phase") == phase else None

        def describe() -> str:
            pods = self.kubectl("get", "pods,deployments", "-o", "wide", check=False).stdout
            return f"{name} phase {phase}; status: {self.status(name)}\n{pods}"

        return wait_until(describe, reached, timeout)


@dataclass
class OperatorProcess:
    """One `kvferry operator` subprocess; its output goes to a log file the test can read."""

    process: subprocess.Popen[bytes]
    log_path: Path
    identity: str
    log_file: Any = field(repr=False, default=None)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_started(self) -> None:
        """Wait until the process talks to the apiserver (its first look at the Lease)."""

        def started() -> bool:
            assert self.process.poll() is None, f"{self.identity} exited:\n{self.log()}"
            return "waiting for lease" in self.log()

        wait_until(f"{self.identity} to start", started, OPERATOR_START_S)

    def troubles(self) -> list[str]:
        """Log lines that report an error, a traceback or a retry kopf scheduled."""
        signs = ("[ERROR", "Traceback", "will try again")
        return [line for line in self.log().splitlines() if any(sign in line for sign in signs)]

    def kill(self) -> None:
        """SIGKILL, like a node failure: no cleanup, the Lease is not released."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
