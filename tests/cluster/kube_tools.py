"""kubectl and helm bound to one cluster: its kubeconfig, and helm's folders kept out of ~/.config."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def find_kubectl() -> str:
    """kubectl on PATH, else the image's /usr/bin/kubectl."""
    return shutil.which("kubectl") or "/usr/bin/kubectl"


class KubeCommandError(subprocess.CalledProcessError):
    """kubectl or helm failed; unlike CalledProcessError's, the message says what the tool printed."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


class KubeTools:
    """Runs kubectl and the helm that tests/cluster/build.sh built against the cluster of `kubeconfig`."""

    def __init__(self, kubeconfig: Path, helm_binary: Path, workdir: Path) -> None:
        self.kubeconfig = str(kubeconfig)
        self.helm_binary = helm_binary
        self.env: dict[str, str] = {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            # helm keeps repositories and caches under these; inside workdir no test touches ~/.config.
            "HELM_CACHE_HOME": str(workdir / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(workdir / "helm" / "config"),
            "HELM_DATA_HOME": str(workdir / "helm" / "data"),
        }

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; with check, a failure raises KubeCommandError."""
        return self._run([find_kubectl(), f"--kubeconfig={self.kubeconfig}", *args], input, check)

    def helm(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster; with check, a failure raises KubeCommandError."""
        return self._run([str(self.helm_binary), f"--kubeconfig={self.kubeconfig}", *args], input, check)

    def _run(self, argv: list[str], input: str | None, check: bool) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(argv, input=input, text=True, capture_output=True, env=self.env)
        if check and done.returncode != 0:
            raise KubeCommandError(done.returncode, argv, done.stdout, done.stderr)
        return done
