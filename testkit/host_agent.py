"""``gpu-share-plugin`` as a host process on the local cluster's real kubelet (dummy
backend), for the cluster-level tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from testkit.process import stop_process


def agent_argv(
    node: str, dp_dir: str, pr_socket: str, state_dir: str, metrics_port: int | str
) -> list[str]:
    """``gpu-share-plugin`` on the dummy backend, from this interpreter (text logs)."""
    return [
        sys.executable,
        "-m",
        "gpu_share.cli.plugin_main",
        "--backend",
        "dummy",
        "--node-name",
        node,
        "--device-plugin-dir",
        dp_dir,
        "--pod-resources-socket",
        pr_socket,
        "--state-dir",
        state_dir,
        "--metrics-port",
        str(metrics_port),
        "--log-format",
        "text",
    ]


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@dataclass(eq=False)
class HostAgent:
    """Start/stop one agent; its log is ``workdir/agent.log``, state ``workdir/state``."""

    cluster_env: Mapping[str, str]
    workdir: Path
    _: KW_ONLY
    devices: int
    units: int
    metrics_port: int
    extra_env: Mapping[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self, timeout_s: float = 60) -> None:
        """Start and wait until both resources are registered with the kubelet."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_SHARE_")}
        env.update(
            {
                "KUBECONFIG": self.cluster_env["KUBECONFIG"],
                "GPU_SHARE_DUMMY__DEVICE_COUNT": str(self.devices),
                "GPU_SHARE_DUMMY__MEMORY_MIB": str(self.units * 1024),
                "GPU_SHARE_DUMMY__FAULT_FILE": str(self.workdir / "faults.json"),
                **self.extra_env,
            }
        )
        log = open(self.workdir / "agent.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            agent_argv(
                self.cluster_env["NODE_NAME"],
                self.cluster_env["DEVICE_PLUGIN_DIR"],
                self.cluster_env["POD_RESOURCES_SOCKET"],
                str(self.workdir / "state"),
                self.metrics_port,
            ),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout_s
        while not ready(f"http://127.0.0.1:{self.metrics_port}/readyz"):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log()
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace_s=20, kill_wait_s=5)

    def log(self) -> str:
        return (self.workdir / "agent.log").read_text(errors="replace")[-4000:]
