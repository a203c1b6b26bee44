"""Fixtures for the operator's end-to-end tests on the real control plane (tests/cluster/): `cluster`, the
test's namespace with the CRD installed, and `start_operator` (e2e/kube_cluster.py has both types)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster.control_plane import ControlPlane
from cluster.waiting import wait_until
from e2e.kube_cluster import (
    CRD,
    CRD_FILE,
    REPO,
    TEST_LEASE_DURATION_S,
    TEST_RESYNC_S,
    TEST_SIGNING_SEED,
    Cluster,
    OperatorProcess,
)
from support.disaggregated_cluster import LEAKS

from kvferry.operator.internal_tls import SEED_ENV


def _crd_established(kube: ControlPlane) -> bool:
    crd = json.loads(kube.kubectl("get", "crd", CRD, "-o", "json").stdout)
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


@pytest.fixture
def cluster(kube: ControlPlane, kube_namespace: str) -> Cluster:
    """The test's namespace, with the chart's CRD installed and served (kubectl explain works)."""
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    # Not `kubectl wait --for=condition=Established`: it fails at once, instead of waiting, while the new
    # CRD has no conditions yet, which a loaded apiserver shows for a moment.
    wait_until("the CRD to be Established", lambda: _crd_established(kube), timeout=60)
    # The OpenAPI document (kubectl explain, --validate=strict) is published a moment after Established.
    wait_until(
        "the CRD's OpenAPI schema",
        lambda: kube.kubectl("explain", "inferencecluster.spec", check=False).returncode == 0,
        timeout=60,
    )
    # A new CRD's storage answers 429 "storage is (re)initializing" for a moment; an operator started then
    # logs kopf's (right) retry of its first list as an error, which the tests count as trouble.
    wait_until(
        "the CRD's storage to serve lists",
        lambda: kube.kubectl("get", "inferenceclusters", f"--namespace={kube_namespace}", check=False).returncode == 0,
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
        env[SEED_ENV] = TEST_SIGNING_SEED.decode()  # as the chart gives one (templates/signing-seed.yaml)
        process = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
        operator = OperatorProcess(process, log_path, identity, log)
        started.append(operator)
        operator.wait_started()
        return operator

    yield start
    for operator in started:
        operator.stop()
        operator.log_file.close()
        # pytest shows this only for a failed test: the operator's side of the story.
        print(f"----- log of {operator.identity} -----\n{operator.log()}")


@pytest.fixture(autouse=True)
def nodes_idle_after_the_test() -> Iterator[None]:
    """Every local cluster a test stopped had every surviving node idle (no running, waiting or reserved
    request, no held KV, no block in use, no lease): a leak fails the test that made it, not a later one."""
    LEAKS.clear()
    yield
    leaked, LEAKS[:] = list(LEAKS), []
    assert not leaked, f"nodes still holding work when their cluster stopped: {leaked}"
