"""The local cluster's environment, read once from ``hack/local-up-cluster.sh env --json``
(the script is the one definition of its paths and of what a machine needs to run it),
and the cluster script itself."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO / "hack" / "local-up-cluster.sh"
BUILD_SCRIPT = REPO / "hack" / "build-image.sh"


def _k8s_version() -> str:
    """The Kubernetes version of the local cluster: the one hack/k8s/go.mod requires
    (hack/cluster/build.sh reads the same line)."""
    for line in (REPO / "hack" / "k8s" / "go.mod").read_text().splitlines():
        parts = line.split()
        if parts[:2] == ["require", "k8s.io/kubernetes"] and len(parts) == 3:
            return parts[2]
    raise RuntimeError("hack/k8s/go.mod requires no k8s.io/kubernetes version")


K8S_VERSION = _k8s_version()
UP_TIMEOUT_S = int(os.environ.get("GPU_SHARE_CLUSTER_UP_TIMEOUT", str(80 * 60)))


@dataclass(frozen=True)
class ClusterInfo:
    """``env``: KUBECONFIG, KUBECTL, NODE_NAME, DEVICE_PLUGIN_DIR, ... (the names of the
    script's ``env`` export lines). ``problem``: why this machine cannot run the cluster
    (not root, no cgroup v1 memory controller, no Go, ...), None if it can."""

    env: Mapping[str, str]
    problem: str | None


@functools.cache
def cluster_info() -> ClusterInfo:
    proc = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "env", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{CLUSTER_SCRIPT} env --json failed:\n{proc.stderr}")
    doc = json.loads(proc.stdout)
    check = doc["check"]
    return ClusterInfo(env=dict(doc["env"]), problem=None if check["ok"] else check["reason"])


def run_script(
    *args: str, script: Path = CLUSTER_SCRIPT, timeout: float = 300, stream: bool = False
) -> subprocess.CompletedProcess[str]:
    """Runs ``bash SCRIPT ARGS``. ``stream``: its progress (stderr) goes to fd 2 (visible
    with -s / in CI logs, else pytest shows it on failure); stdout is captured either way."""
    return subprocess.run(
        ["bash", str(script), *args],
        stdout=subprocess.PIPE,
        stderr=2 if stream else subprocess.PIPE,
        text=True,
        timeout=timeout,
    )


def cluster_cmd(*args: str, timeout: float = 240) -> float:
    """``hack/local-up-cluster.sh ARGS`` that must succeed; returns its wall time (s)."""
    t0 = time.monotonic()
    proc = run_script(*args, timeout=timeout)
    assert proc.returncode == 0, (
        f"local-up-cluster.sh {' '.join(args)} failed (rc={proc.returncode}):\n"
        f"{proc.stderr[-3000:]}"
    )
    return time.monotonic() - t0


def cluster_is_up() -> bool:
    """Every component runs and the node is Ready (``local-up-cluster.sh status``)."""
    return run_script("status", timeout=60).returncode == 0


# Set by hack/test.sh on a machine that built the cluster: there a cluster test that
# cannot run is a failure, not a skip (a skip would pass CI without proving anything).
REQUIRE_CLUSTER = os.environ.get("GPU_SHARE_REQUIRE_CLUSTER") == "1"


def loud_skip(what: str, reason: str) -> None:
    """Skip, and make the reason impossible to miss in CI logs (fail where the cluster
    is required)."""
    if REQUIRE_CLUSTER:
        pytest.fail(f"{what}: the local cluster is required here but {reason}", pytrace=False)
    bar = "!" * 78
    sys.stderr.write(f"\n{bar}\n!!! SKIPPING {what}: {reason}\n{bar}\n")
    sys.stderr.flush()
    pytest.skip(f"{what} skipped: {reason}")


def live_cluster(request: pytest.FixtureRequest, what: str) -> Mapping[str, str]:
    """The env of the local cluster, for a ``cluster``-marked test that is not under
    tests/cluster: the session's ``local_cluster`` (``testkit.pytest_cluster``: up once,
    under the session's lock); a loud skip naming ``what`` where this machine cannot run
    it."""
    info = cluster_info()
    if info.problem:
        loud_skip(what, info.problem)
    env: Mapping[str, str] = request.getfixturevalue("local_cluster").env
    return env
