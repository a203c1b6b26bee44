"""Fixtures for the operator's end-to-end tests on the real control plane (tests/cluster/).

`cluster` is a test's view of its own namespace: kubectl with JSON out, bounded waits, and the CRD
installed. `start_operator` runs `python -m kvferry operator` as a subprocess watching that namespace,
so a test can SIGKILL it like a crashed pod and start it again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.control_plane import ControlPlane

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "charts" / "kvferry" / "crds" / "inferenceclusters.kvferry.dev.yaml"
CRD = "inferenceclusters.kvferry.dev"
# Short enough that tests see leader changes and resyncs within seconds.
TEST_LEASE_DURATION_S = 4.0
TEST_RESYNC_S = 5.0


def wait_until(
    what: str | Callable[[], str], condition: Callable[[], Any], timeout: float = 60.0, interval: float = 0.5
) -> Any:
    """Poll until `condition()` is truthy and return it; fail naming `what` after `timeout` seconds.

    `what` may be a function, so that the failure message describes the state at the deadline.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    description = what() if callable(what) else what
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {description}; last value: {last!r}")


@dataclass
class Cluster:
    """kubectl bound to one test namespace."""

    kube: ControlPlane
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

    def wait_phase(self, name: str, phase: str, timeout: float = 90.0) -> dict[str, Any]:
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


@pytest.fixture
def cluster(kube: ControlPlane, kube_namespace: str) -> Cluster:
    """The test's namespace, with the chart's CRD installed and served (kubectl explain works)."""
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    kube.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")
    # The OpenAPI document (kubectl explain, --validate=strict) is published a moment after Established.
    wait_until(
        "the CRD's OpenAPI schema",
        lambda: kube.kubectl("explain", "inferencecluster.spec", check=False).returncode == 0,
        timeout=60,
    )
    return Cluster(kube, kube_namespace)


@pytest.fixture
def start_operator(cluster: Cluster, tmp_path: Path) -> Iterator[Callable[..., OperatorProcess]]:
    started: list[OperatorProcess] = []

    def start(*extra: str, identity: str | None = None, kubeconfig: str | None = None) -> OperatorProcess:
        identity = identity or f"operator-{len(started)}"
        log_path = tmp_path / f"{identity}.log"
        log = log_path.open("wb")
        argv = [
            sys.executable, "-m", "kvferry", "operator",
            f"--kubeconfig={kubeconfig or cluster.kube.kubeconfig}",
            f"--namespace={cluster.namespace}",
            f"--identity={identity}",
            f"--lease-duration={TEST_LEASE_DURATION_S}",
            f"--resync-seconds={TEST_RESYNC_S}",
            *extra,
        ]  # fmt: skip
        env = {key: value for key, value in os.environ.items() if key not in ("POD_NAME", "POD_NAMESPACE")}
        process = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
        operator = OperatorProcess(process, log_path, identity, log)
        started.append(operator)
        return operator

    yield start
    for operator in started:
        operator.stop()
        operator.log_file.close()
        # pytest shows this only for a failed test: the operator's side of the story.
        print(f"----- log of {operator.identity} -----\n{operator.log()}")
