"""A single-node Kubernetes with real pods on this machine, for tests: tests/pods/node.sh driven from Python.

`PodsNode.up()` starts it (about a minute once the binaries exist), `import_image()` puts a podman image
into its containerd (minutes the first time on a machine, then nothing: the image store is cached), and
`down()` removes everything the node made. `leftovers()` lists what `down()` should have removed and
did not, in the words a person would use to find it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from cluster.control_plane import default_bin_dir
from cluster.kube_tools import KubeTools

from kvferry.cache_dir import cache_dir

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NODE_SCRIPT = HERE / "node.sh"
BRIDGE = "kvf0"  # node.sh's bridge
NODE_START_S = 600
IMAGE_IMPORT_S = 900


class NodeScriptError(RuntimeError):
    """node.sh failed; the message holds what it printed."""


def pods_bin_dir() -> Path:
    out = subprocess.run(["bash", str(HERE / "build.sh"), "--print-bin-dir"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def kvferry_image() -> str:
    """The reference `make image` builds (localhost/kvferry:<version>)."""
    out = subprocess.run(["bash", str(REPO / "image" / "build.sh"), "--print-ref"], check=True, capture_output=True,
                         text=True)
    return out.stdout.strip()


def missing_prerequisites() -> list[str]:
    """What the pods tier needs and this machine lacks, each with the command that provides it."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the node makes a bridge, iptables rules and mounts)")
    for tool in ("containerd", "runc", "ctr", "podman", "skopeo"):
        if shutil.which(tool) is None:
            missing.append(f"{tool} (make system-packages)")
    if shutil.which("nft") is None:
        missing.append("nft (make system-packages)")
    if not Path("/usr/lib/cni/bridge").exists():
        missing.append("the CNI plugins (make system-packages)")
    for binary in ("kubelet", "kube-proxy", "coredns", "kube-network-policies"):
        if not os.access(pods_bin_dir() / binary, os.X_OK):
            missing.append(f"{binary} (make pods-binaries)")
    if shutil.which("podman") and subprocess.run(["podman", "image", "exists", kvferry_image()],
                                                 env=podman_env()).returncode != 0:
        missing.append(f"the image {kvferry_image()} (make image)")
    return missing


def podman_env() -> dict[str, str]:
    """podman configured as image/build.sh configures it (runc, cgroupfs: crun fails on this machine's cgroups)."""
    return {**os.environ, "CONTAINERS_CONF": str(cache_dir() / "podman" / "containers.conf")}


class PodsNode(KubeTools):
    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="kvferry-pods-"))
        super().__init__(self.workdir / "admin.kubeconfig", default_bin_dir() / "helm", self.workdir)

    def up(self) -> None:
        self._node_script("up", timeout=NODE_START_S)

    def import_image(self, reference: str) -> str:
        return self._node_script("import", reference, timeout=IMAGE_IMPORT_S)

    def down(self) -> None:
        self._node_script("down", timeout=NODE_START_S)

    def container_pid(self, container_id: str) -> int:
        """The host's process id of a running container's first process (containerd's task)."""
        socket = self.workdir / "containerd" / "containerd.sock"
        listing = subprocess.run(["ctr", "--address", str(socket), "-n", "k8s.io", "tasks", "ls"], check=True,
                                 capture_output=True, text=True, timeout=60).stdout
        pids = [int(fields[1]) for fields in map(str.split, listing.splitlines()[1:]) if fields[0] == container_id]
        assert len(pids) == 1, f"container {container_id} among containerd's tasks:\n{listing}"
        return pids[0]

    def policy_verdicts(self, address: str) -> list[str]:
        """The NetworkPolicy agent's log lines about connections to or from `address` (it logs each verdict:
        node.sh runs it with --v=2), for a test that saw a connection go unanswered."""
        log = self.workdir / "logs" / "kube-network-policies.log"
        return [line for line in log.read_text(errors="replace").splitlines() if f"{address}:" in line]

    def leftovers(self) -> list[str]:
        """Processes, mounts, network namespaces, interfaces, firewall chains and tables the node left behind."""
        found = []
        folder = str(self.workdir)
        # The NetworkPolicy agent's command line names no file of the folder; its binary is the node's own.
        agent = str(pods_bin_dir() / "kube-network-policies")
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # ended while we looked
            if folder in cmdline or cmdline.startswith(agent):
                found.append(f"process {pid}: {cmdline.strip()}")
        found += [f"mount {line.split()[1]}" for line in Path("/proc/mounts").read_text().splitlines() if folder in line]
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        found += [f"network namespace {line.split()[0]}" for line in netns.splitlines() if line.startswith("cni-")]
        if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0:
            found.append(f"interface {BRIDGE}")
        for tool in ("iptables-save", "ip6tables-save"):
            if shutil.which(tool):
                rules = subprocess.run([tool], capture_output=True, text=True).stdout
                found += [f"{tool}: chain {name}" for name in re.findall(r"^:((?:KUBE|CNI)-\S+)", rules, re.MULTILINE)]
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        found += [f"nftables {line}" for line in tables.splitlines() if "kube-network-policies" in line]
        if Path(folder).exists():
            found.append(f"folder {folder}")
        return found

    def _node_script(self, command: str, *args: str, timeout: float) -> str:
        done = subprocess.run(["bash", str(NODE_SCRIPT), command, str(self.workdir), *args], capture_output=True,
                              text=True, timeout=timeout, env={**self.env, **podman_env()})
        if done.returncode != 0:
            raise NodeScriptError(f"node.sh {command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout
