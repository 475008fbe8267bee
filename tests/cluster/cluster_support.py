"""Helpers for the tests that need the real local cluster (fixtures are in
conftest.py): the ``Cluster`` handle (kubectl wrappers), the loud skip and
the environment checks.  A separate module (not ``conftest``) so that test
modules can import it by a unique name."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "local-up-cluster.sh"
UP_TIMEOUT_S = int(os.environ.get("GPU_SHARE_CLUSTER_UP_TIMEOUT", str(80 * 60)))


def loud_skip(reason: str) -> None:
    """Skip, and make the reason impossible to miss in CI logs."""
    bar = "!" * 78
    sys.stderr.write(f"\n{bar}\n!!! SKIPPING cluster tests: {reason}\n{bar}\n")
    sys.stderr.flush()
    pytest.skip(f"cluster tests skipped: {reason}")


def environment_problem() -> str | None:
    if sys.platform != "linux":
        return "not Linux"
    if os.geteuid() != 0:
        return "not running as root (the local cluster starts containerd and the kubelet)"
    if (
        not Path("/sys/fs/cgroup/memory").is_dir()
        and not Path("/sys/fs/cgroup/cgroup.controllers").exists()
    ):
        return "no cgroup filesystem under /sys/fs/cgroup"
    if (
        Path("/sys/fs/cgroup/cgroup.controllers").exists()
        and not Path("/sys/fs/cgroup/memory").is_dir()
    ):
        return (
            "cgroup v2 only host: this cluster (kubelet v1.34 on containerd 1.6)"
            " is set up for cgroup v1"
        )
    if shutil.which("go") is None:
        return "Go toolchain not found (needed to build Kubernetes and etcd)"
    if shutil.which("apt-get") is None and shutil.which("containerd") is None:
        return "containerd is not installed and apt-get is not available to install it"
    return None


def parse_env(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("export "):
            continue
        name, _, value = line[len("export ") :].partition("=")
        words = shlex.split(value)
        env[name] = words[0] if words else ""
    return env


@dataclass
class Cluster:
    env: dict[str, str]
    started_here: bool = False
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def node(self) -> str:
        return self.env["NODE_NAME"]

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120, input: str | None = None
    ) -> subprocess.CompletedProcess:
        cmd = [self.env["KUBECTL"], "--kubeconfig", self.env["KUBECONFIG"], *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed (rc={proc.returncode}):\n"
                f"{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def kubectl_json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def apply(self, manifest: dict | str) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.kubectl("apply", "-f", "-", input=text)

    def wait_pod_phase(
        self,
        namespace: str,
        name: str,
        phases: tuple[str, ...] = ("Succeeded",),
        timeout: float = 180,
    ) -> dict:
        deadline = time.monotonic() + timeout
        pod: dict = {}
        while time.monotonic() < deadline:
            proc = self.kubectl("-n", namespace, "get", "pod", name, "-o", "json", check=False)
            if proc.returncode == 0:
                pod = json.loads(proc.stdout)
                phase = pod.get("status", {}).get("phase")
                if phase in phases:
                    return pod
                if phase == "Failed" and "Failed" not in phases:
                    break
            time.sleep(1)
        describe = self.kubectl("-n", namespace, "describe", "pod", name, check=False).stdout
        raise AssertionError(
            f"pod {namespace}/{name} did not reach {phases} in {timeout}s "
            f"(phase={pod.get('status', {}).get('phase')}):\n{describe}\n"
            f"kubelet log tail:\n{self.log_tail('kubelet')}"
        )

    def log_tail(self, component: str, lines: int = 30) -> str:
        path = Path(self.env.get("CLUSTER_LOG_DIR", "/nonexistent")) / f"{component}.log"
        try:
            return "".join(path.read_text(errors="replace").splitlines(True)[-lines:])
        except OSError as exc:
            return f"<cannot read {path}: {exc}>"


def run_script(
    *args: str, timeout: float = 300, stream: bool = False
) -> subprocess.CompletedProcess:
    if stream:
        # Progress of a cold build goes to fd 2 (the terminal/CI log with -s,
        # else pytest's fd capture, shown on failure).
        return subprocess.run([str(SCRIPT), *args], stdout=2, stderr=2, text=True, timeout=timeout)
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)
