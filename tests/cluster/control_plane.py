"""A real Kubernetes control plane on loopback for tests (DESIGN.md §7).

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as child processes of the test
session, each in its own process group, with certificates, kubeconfigs and etcd's data in one temporary
folder. kwok plays kubelet for a few fake Nodes, so Deployments' pods are scheduled by the real scheduler
and reported Running and Ready. The binaries come from tests/cluster/build.sh (`make cluster-binaries`).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from cluster.kube_tools import KubeTools, find_kubectl
from cluster.pki import Pki

from kvferry.cli.ports import free_port

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "helm")
# Written by build.sh next to bin/: the Stages that tell kwok how fake nodes and pods change state.
KWOK_STAGES = "kwok-stages.yaml"
# kwok manages only Nodes carrying this annotation, so it never touches a Node it did not get made for.
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_COUNT = 2
SERVICE_CIDR = "10.96.0.0/16"
# Pod IPs that kwok hands out are bookkeeping only: no process listens on them, so tests never connect there.
POD_CIDR = "10.244.0.0/16"
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    # Fills the aggregated ClusterRoles (admin, edit, view) that RBAC tests bind to.
    "clusterrole-aggregation-controller",
    "root-ca-certificate-publisher-controller",
    # Lifts the not-ready taint that admission puts on every new Node once kwok reports it Ready.
    "node-lifecycle-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "cronjob-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "disruption-controller",
    "ttl-after-finished-controller",
)
_PR_SET_PDEATHSIG = 1


def default_bin_dir() -> Path:
    """The cache folder build.sh puts the binaries of the pinned versions in."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-bin-dir"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def missing_binaries(bin_dir: Path) -> list[str]:
    """Names of the files (binaries, kubectl, kwok's stages) that a ControlPlane needs and cannot find."""
    missing = [name for name in BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if not (bin_dir.parent / KWOK_STAGES).is_file():
        missing.append(KWOK_STAGES)
    if not os.access(find_kubectl(), os.X_OK):
        missing.append("kubectl")
    return missing


class ControlPlaneError(RuntimeError):
    """A component did not come up; the message holds the tail of its log."""


@dataclass
class _Component:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:
    # Runs in the child before exec: if the test session is killed outright, its components go with it.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ControlPlane(KubeTools):
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok with fake Nodes.

    Use it as a context manager, or call start() and stop(); stop() is safe after a failed start().
    `kubectl(...)` and `helm(...)` (KubeTools) run against it.
    """

    def __init__(self, bin_dir: Path | None = None, *, timeout: float = 90.0, fake_nodes: int = FAKE_NODE_COUNT) -> None:
        self.bin_dir: Path = bin_dir or default_bin_dir()
        self.timeout = timeout
        self.fake_nodes = fake_nodes  # benchmarks/planner_kwok.py asks for a hundred
        self.workdir = Path(tempfile.mkdtemp(prefix="kvferry-kube-"))
        super().__init__(self.workdir / "admin.kubeconfig", self.bin_dir / "helm", self.workdir)
        self.server: str = f"https://127.0.0.1:{free_port()}"
        self._components: list[_Component] = []
        self._ssl: ssl.SSLContext | None = None

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        """Process ids of the components started so far."""
        return [component.process.pid for component in self._components]

    def start(self) -> None:
        """Start every component and wait until the cluster can run a Deployment; stop all on failure."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Terminate every component (its whole process group), reap it, and remove workdir.

        Safe to call again; `pids` still lists the (now gone) processes afterwards.
        """
        for component in reversed(self._components):
            _terminate(component.process)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _start(self) -> None:
        pki = Pki(self.workdir / "pki")
        admin = pki.client("admin", "kvferry-admin", "system:masters")
        self._ssl = ssl.create_default_context(cafile=str(pki.ca_cert))
        self._ssl.load_cert_chain(*admin)
        self._write_kubeconfig(Path(self.kubeconfig), pki.ca_cert, admin)

        etcd_url = self._start_etcd()
        self._start_apiserver(pki, etcd_url)
        self._start_controller_manager(pki)
        self._start_scheduler(pki)
        self._start_kwok(pki)
        self._create_fake_nodes()
        self._wait("fake nodes Ready", self._component("kwok"), self._fake_nodes_ready)
        # The serviceaccount controller makes it; pods cannot be admitted into a namespace before that.
        self._wait(
            "default ServiceAccount",
            self._component("kube-controller-manager"),
            lambda: self._api_get("/api/v1/namespaces/default/serviceaccounts/default") is not None,
        )

    def _start_etcd(self) -> str:
        client_url = f"http://127.0.0.1:{free_port()}"
        peer_url = f"http://127.0.0.1:{free_port()}"
        etcd = self._spawn(
            "etcd",
            "--name=default",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            # The data dies with the test session; waiting for the disk on every write only slows tests.
            "--unsafe-no-fsync",
            "--logger=zap",
            "--log-level=warn",
        )
        self._wait("etcd /health", etcd, lambda: _http_ok(f"{client_url}/health"))
        return client_url

    def _start_apiserver(self, pki: Pki, etcd_url: str) -> None:
        cert, key = pki.serving("kube-apiserver")
        apiserver = self._spawn(
            "kube-apiserver",
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.server.rsplit(':', 1)[1]}",
            f"--tls-cert-file={cert}",
            f"--tls-private-key-file={key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-key-file={pki.service_account_key}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The `kubernetes` Service's endpoints would be 127.0.0.1, which EndpointSlices refuse.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
        )
        for path in ("/livez", "/readyz"):
            self._wait(f"kube-apiserver {path}", apiserver, lambda path=path: self._api_ok(path))

    def _start_controller_manager(self, pki: Pki) -> None:
        kubeconfig = self._component_kubeconfig(
            pki, "kube-controller-manager", "system:kube-controller-manager"
        )
        port = free_port()
        kcm = self._spawn(
            "kube-controller-manager",
            *self._delegated_auth(kubeconfig),
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'controller-manager'}",
            "--leader-elect=false",
            f"--controllers={','.join(CONTROLLERS)}",
            # Each controller acts as its own ServiceAccount, so RBAC applies to them as in a real cluster.
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki.service_account_key}",
            f"--root-ca-file={pki.ca_cert}",
        )
        self._wait("kube-controller-manager /healthz", kcm, lambda: _https_ok_unverified(port, "/healthz"))

    def _start_scheduler(self, pki: Pki) -> None:
        kubeconfig = self._component_kubeconfig(pki, "kube-scheduler", "system:kube-scheduler")
        port = free_port()
        scheduler = self._spawn(
            "kube-scheduler",
            *self._delegated_auth(kubeconfig),
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--leader-elect=false",
        )
        self._wait("kube-scheduler /healthz", scheduler, lambda: _https_ok_unverified(port, "/healthz"))

    def _start_kwok(self, pki: Pki) -> None:
        cert, key = pki.serving("kwok")
        port = free_port()
        self._spawn(
            "kwok",
            f"--kubeconfig={self.kubeconfig}",
            f"--config={self.bin_dir.parent / KWOK_STAGES}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            f"--cidr={POD_CIDR}",
            # The fake nodes' kubelet address is kwok's own server, so whatever the apiserver sends to a
            # "kubelet" (logs, exec) stays on loopback.
            "--node-ip=127.0.0.1",
            f"--node-port={port}",
            f"--server-address=127.0.0.1:{port}",
            f"--tls-cert-file={cert}",
            f"--tls-private-key-file={key}",
            "--node-lease-duration-seconds=40",
        )

    def _create_fake_nodes(self) -> None:
        nodes = [_fake_node(f"kwok-node-{index}") for index in range(self.fake_nodes)]
        self.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})
        )

    def _fake_nodes_ready(self) -> bool:
        nodes = self._api_get("/api/v1/nodes") or {"items": []}
        ready = [
            node
            for node in nodes["items"]
            if any(
                c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", [])
            )
        ]
        return len(ready) == self.fake_nodes

    def _spawn(self, name: str, *args: str) -> _Component:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(self.bin_dir / name), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        component = _Component(name, process, log)
        self._components.append(component)
        return component

    def _component(self, name: str) -> _Component:
        return next(component for component in self._components if component.name == name)

    def _wait(self, what: str, component: _Component, ready: Callable[[], bool]) -> None:
        """Poll `ready` until it holds; fail at once when any component exits, or after the timeout."""
        deadline = time.monotonic() + self.timeout
        while not ready():
            for started in self._components:
                if started.process.poll() is not None:
                    raise ControlPlaneError(
                        f"{started.name} exited with {started.process.returncode} while waiting for {what};"
                        f" its log ends:\n{started.log_tail()}"
                    )
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{what} not ready after {self.timeout:.0f}s; {component.name}'s log ends:\n"
                    f"{component.log_tail()}"
                )
            time.sleep(0.2)

    def _api_get(self, path: str) -> dict | None:
        """GET an apiserver path as the admin; None while the apiserver does not answer 200."""
        try:
            with urllib.request.urlopen(self.server + path, context=self._ssl, timeout=5) as response:
                return json.load(response)
        except (OSError, urllib.error.URLError):
            return None

    def _api_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.server + path, context=self._ssl, timeout=5) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def _write_kubeconfig(self, path: Path, ca_cert: Path, client: tuple[Path, Path]) -> None:
        # JSON is YAML, so kubectl and client-go read this without a YAML writer here.
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "kvferry-test",
                    "cluster": {"server": self.server, "certificate-authority": str(ca_cert)},
                }
            ],
            "users": [
                {"name": "user", "user": {"client-certificate": str(client[0]), "client-key": str(client[1])}}
            ],
            "contexts": [{"name": "kvferry-test", "context": {"cluster": "kvferry-test", "user": "user"}}],
            "current-context": "kvferry-test",
        }
        path.write_text(json.dumps(config, indent=2))

    def _component_kubeconfig(self, pki: Pki, name: str, user: str) -> Path:
        """A kubeconfig with the identity the bootstrap RBAC policy grants this component's rights to."""
        path = self.workdir / f"{name}.kubeconfig"
        self._write_kubeconfig(path, pki.ca_cert, pki.client(name, user))
        return path

    @staticmethod
    def _delegated_auth(kubeconfig: Path) -> Sequence[str]:
        # The same identity checks callers of the component's own HTTPS port (metrics), as in kubeadm.
        return (
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
        )


def _fake_node(name: str) -> dict:
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "status": {"allocatable": resources, "capacity": resources},
    }


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _https_ok_unverified(port: int, path: str) -> bool:
    # The controller-manager and scheduler serve /healthz with a certificate they make up themselves.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}{path}", context=context, timeout=5
        ) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _terminate(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the process group, SIGKILL whatever is left of it after `grace` seconds, and reap."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    # Also reaches anything the component started itself, even once the component has exited.
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
