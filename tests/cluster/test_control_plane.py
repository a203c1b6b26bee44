"""The test control plane itself: each component is there and does its part."""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.request
from pathlib import Path

import pytest
from cluster.control_plane import ControlPlane, ControlPlaneError
from cluster.fixtures import require_binaries
from cluster.kube_tools import KubeCommandError
from cluster.waiting import wait_until

# Also the tests that start their own ControlPlane rather than use the `kube` fixture.
pytestmark = pytest.mark.cluster

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: kvferry-test/never-pulled:1
        resources:
          requests: {cpu: 100m, memory: 64Mi}
"""


def names(kube: ControlPlane, kinds: str, namespace: str, selector: str) -> list[str]:
    out = kube.kubectl("get", kinds, f"--namespace={namespace}", f"--selector={selector}", "-o", "name")
    return out.stdout.split()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_apiserver_answers(kube: ControlPlane) -> None:
    version = json.loads(kube.kubectl("version", "--output=json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.32.")
    assert kube.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"


def test_rbac_applies(kube: ControlPlane, kube_namespace: str) -> None:
    as_default_sa = f"--as=system:serviceaccount:{kube_namespace}:default"
    denied = kube.kubectl(
        "auth", "can-i", "list", "pods", f"--namespace={kube_namespace}", as_default_sa, check=False
    )
    assert denied.stdout.strip() == "no"
    with pytest.raises(KubeCommandError, match="forbidden"):
        kube.kubectl("get", "pods", f"--namespace={kube_namespace}", as_default_sa)


def whoami(kube: ControlPlane, token: str) -> str:
    """The user the apiserver takes a bearer token for (no client certificate sent, unlike kubectl's)."""
    cluster = json.loads(Path(kube.kubeconfig).read_text())["clusters"][0]["cluster"]
    request = urllib.request.Request(
        f"{kube.server}/apis/authentication.k8s.io/v1/selfsubjectreviews",
        data=json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        return json.load(response)["status"]["userInfo"]["username"]


def test_service_account_tokens_authenticate(kube: ControlPlane, kube_namespace: str) -> None:
    expected = f"system:serviceaccount:{kube_namespace}:default"
    # Signed by the apiserver (TokenRequest API).
    requested = kube.kubectl("create", "token", "default", f"--namespace={kube_namespace}").stdout.strip()
    assert whoami(kube, requested) == expected

    # Signed by the controller-manager's serviceaccount-token controller (legacy token Secret).
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {
            "name": "legacy-token",
            "annotations": {"kubernetes.io/service-account.name": "default"},
        },
    }
    kube.kubectl("apply", f"--namespace={kube_namespace}", "-f", "-", input=json.dumps(secret))
    read_token = (
        "get",
        "secret/legacy-token",
        f"--namespace={kube_namespace}",
        "-o",
        "jsonpath={.data.token}",
    )
    wait_until("the token Secret to be filled", lambda: kube.kubectl(*read_token).stdout != "")
    legacy = base64.b64decode(kube.kubectl(*read_token).stdout).decode()
    assert whoami(kube, legacy) == expected


def test_deployment_becomes_ready_on_fake_nodes(kube: ControlPlane, kube_namespace: str) -> None:
    kube.kubectl("apply", f"--namespace={kube_namespace}", "-f", "-", input=DEPLOYMENT)
    kube.kubectl("rollout", "status", "deployment/web", f"--namespace={kube_namespace}", "--timeout=60s")

    pods = json.loads(
        kube.kubectl(
            "get", "pods", f"--namespace={kube_namespace}", "--selector=app=web", "-o", "json"
        ).stdout
    )["items"]
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeName"].startswith("kwok-node-")  # placed by kube-scheduler
        assert pod["status"]["phase"] == "Running"  # reported by kwok
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"]
        assert ready == "True"


def test_deleting_a_deployment_collects_its_replicaset_and_pods(
    kube: ControlPlane, kube_namespace: str
) -> None:
    kube.kubectl("apply", f"--namespace={kube_namespace}", "-f", "-", input=DEPLOYMENT)
    kube.kubectl("rollout", "status", "deployment/web", f"--namespace={kube_namespace}", "--timeout=60s")
    assert len(names(kube, "replicasets,pods", kube_namespace, "app=web")) == 3

    # Background propagation: only the Deployment goes now, the garbage collector removes what it owned.
    kube.kubectl("delete", "deployment/web", f"--namespace={kube_namespace}", "--cascade=background")
    wait_until(
        "garbage collection of the ReplicaSet and Pods",
        lambda: names(kube, "replicasets,pods", kube_namespace, "app=web") == [],
    )


def test_helm_installs_a_chart(kube: ControlPlane, kube_namespace: str, tmp_path: Path) -> None:
    assert kube.helm("version", "--short").stdout.startswith("v4.")

    chart = tmp_path / "demo"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 0.1.0\n")
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-settings\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    kube.helm("install", "demo", str(chart), f"--namespace={kube_namespace}", "--set=greeting=hello")

    greeting = kube.kubectl(
        "get", "configmap/demo-settings", f"--namespace={kube_namespace}", "-o", "jsonpath={.data.greeting}"
    )
    assert greeting.stdout == "hello"
    releases = json.loads(kube.helm("list", f"--namespace={kube_namespace}", "--output=json").stdout)
    assert [release["name"] for release in releases] == ["demo"]


def test_stop_leaves_no_process_behind() -> None:
    plane = ControlPlane(require_binaries())
    with plane:
        pids = plane.pids
        assert len(pids) == 5 and all(alive(pid) for pid in pids)
    assert not any(alive(pid) for pid in pids)
    assert not plane.workdir.exists()


def test_failed_start_leaves_no_process_behind(tmp_path: Path) -> None:
    # The real binaries, but a kube-controller-manager that dies: start() fails once etcd and the
    # apiserver are up, and must say why and take them down.
    real = require_binaries()
    for binary in real.iterdir():
        (tmp_path / binary.name).symlink_to(binary)
    broken = tmp_path / "kube-controller-manager"
    broken.unlink()
    broken.write_text("#!/bin/sh\necho 'no controllers today' >&2\nexit 3\n")
    broken.chmod(0o755)

    plane = ControlPlane(tmp_path)
    with pytest.raises(
        ControlPlaneError, match="(?s)kube-controller-manager exited with 3.*no controllers today"
    ):
        plane.start()
    assert len(plane.pids) == 3 and not any(alive(pid) for pid in plane.pids)
    assert not plane.workdir.exists()
