"""Session fixtures of the end-to-end stories.

When e2e stories are selected, ``pytest_collection_finish`` builds the image
(hack/build-image.sh, cached by source hash) and then takes the exclusive cluster lock
(/tmp/gpu-share-cluster.lock, shared with every other user of the one local cluster),
outside any test timeout; ``pytest_sessionfinish`` releases it.

``kube`` (session): brings the cluster up
(idempotent), imports the image, installs the chart with the dummy backend
(values-examples/dummy-npu.yaml + local-cluster.yaml) and waits for the node to advertise
the devices. At the end it uninstalls the chart (no agent is left running), takes the
cluster down if it started it (unless GPU_SHARE_CLUSTER_KEEP=1) and releases the lock.

``agent`` (function): the chart installed and serving (re-installs it after a story that
uninstalled it). ``namespace`` (function): a fresh namespace, deleted afterwards.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.e2e.support import (
    AGENT_NS,
    BUILD_SCRIPT,
    CLUSTER_SCRIPT,
    LOCK_FILE,
    REPO,
    Kube,
    parse_env,
)

BUILD_TIMEOUT_S = int(os.environ.get("GPU_SHARE_E2E_BUILD_TIMEOUT", str(40 * 60)))
LOCK_TIMEOUT_S = int(os.environ.get("GPU_SHARE_E2E_LOCK_TIMEOUT", str(45 * 60)))
UP_TIMEOUT_S = int(os.environ.get("GPU_SHARE_CLUSTER_UP_TIMEOUT", str(80 * 60)))


def _skip_loudly(reason: str) -> None:
    bar = "!" * 78
    sys.stderr.write(f"\n{bar}\n!!! SKIPPING e2e stories: {reason}\n{bar}\n")
    pytest.skip(f"e2e skipped: {reason}")


def _environment_problem() -> str | None:
    if sys.platform != "linux":
        return "not Linux"
    if os.geteuid() != 0:
        return "not root (the local cluster starts containerd and the kubelet)"
    if not Path("/sys/fs/cgroup/memory").is_dir():
        return "no cgroup v1 memory controller (the local cluster needs cgroup v1)"
    if shutil.which("go") is None:
        return "no Go toolchain (needed to build Kubernetes)"
    if shutil.which("apt-get") is None and shutil.which("buildah") is None:
        return "buildah missing and no apt-get to install it"
    return None


def _script(*args: str, timeout: float, stream: bool = True) -> subprocess.CompletedProcess[str]:
    # Progress (stderr) goes to fd 2: visible with -s / in CI logs, else shown on failure.
    if stream:
        return subprocess.run(
            ["bash", *args], stdout=subprocess.PIPE, stderr=2, text=True, timeout=timeout
        )
    return subprocess.run(["bash", *args], capture_output=True, text=True, timeout=timeout)


def _helm() -> str:
    out = _script(str(REPO / "hack" / "install-tools.sh"), timeout=600, stream=False)
    assert out.returncode == 0, out.stderr
    paths = dict(line.split("=", 1) for line in out.stdout.split() if "=" in line)
    return paths.get("helm3") or next(iter(paths.values()))


class _Session:
    """What pytest_collection_finish prepared (outside any test timeout)."""

    tar: str = ""
    helm: str = ""
    lock: IO[str] | None = None
    problem: str | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """When e2e stories are selected: build the image (before the lock: it does not need
    the cluster), then wait for the cluster lock. Done here, not in a fixture, so neither
    the build nor the wait counts against pytest-timeout."""
    if session.config.option.collectonly or not any(
        item.get_closest_marker("e2e") for item in session.items
    ):
        return
    _Session.problem = _environment_problem()
    if _Session.problem:
        return
    t0 = time.monotonic()
    build = _script(str(BUILD_SCRIPT), "--no-import", timeout=BUILD_TIMEOUT_S)
    if build.returncode != 0:
        _Session.problem = "hack/build-image.sh failed: see its output above"
        return
    _Session.tar = build.stdout.strip().splitlines()[-1]
    _Session.helm = _helm()
    sys.stderr.write(
        f"\n=== e2e: image ready in {time.monotonic() - t0:.0f}s; waiting for {LOCK_FILE}\n"
    )
    lock = open(LOCK_FILE, "w")  # noqa: SIM115 - held until pytest_sessionfinish
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                lock.close()
                _Session.problem = f"{LOCK_FILE} still held by someone else after {LOCK_TIMEOUT_S}s"
                return
            time.sleep(2)
    _Session.lock = lock
    sys.stderr.write(f"=== e2e: cluster lock taken after {time.monotonic() - t0:.0f}s\n")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _Session.lock is not None:
        fcntl.flock(_Session.lock, fcntl.LOCK_UN)
        _Session.lock.close()
        _Session.lock = None


# Package scope: the chart is uninstalled right after the last story, so later cluster
# tests of the same pytest run (which start their own agent on the same kubelet
# device-plugin dir) never meet this one.
@pytest.fixture(scope="package")
def kube() -> Iterator[Kube]:
    if _Session.problem:
        if "failed" in _Session.problem or "held" in _Session.problem:
            pytest.fail(_Session.problem, pytrace=False)
        _skip_loudly(_Session.problem)
    assert _Session.lock is not None, "the cluster lock was not taken"
    t0 = time.monotonic()
    started_here = False
    k: Kube | None = None
    try:
        if _script(str(CLUSTER_SCRIPT), "status", timeout=60, stream=False).returncode != 0:
            started_here = True
            up = _script(str(CLUSTER_SCRIPT), "up", timeout=UP_TIMEOUT_S)
            assert up.returncode == 0, "hack/local-up-cluster.sh up failed: see above"
        # The image built before the lock, even if the sources changed meanwhile.
        imp = _script(str(BUILD_SCRIPT), "--import-tar", _Session.tar, timeout=600)
        assert imp.returncode == 0, "importing the image failed: see above"
        env = _script(str(CLUSTER_SCRIPT), "env", timeout=60, stream=False)
        k = Kube(env=parse_env(env.stdout), helm_bin=_Session.helm)
        if k.kubectl("get", "namespace", AGENT_NS, check=False).returncode != 0:
            k.kubectl("create", "namespace", AGENT_NS)
        k.kubectl(
            "label",
            "namespace",
            AGENT_NS,
            "--overwrite",
            "pod-security.kubernetes.io/enforce=privileged",
        )
        if k.installed():  # a leftover of an interrupted run: start clean
            k.uninstall()
        k.install()
        k.wait_agent_serving()
        sys.stderr.write(
            f"=== e2e: chart installed, agent serving ({time.monotonic() - t0:.0f}s)\n"
        )
        yield k
    finally:
        if k is not None:
            k.uninstall()
        if started_here and os.environ.get("GPU_SHARE_CLUSTER_KEEP") != "1":
            _script(str(CLUSTER_SCRIPT), "down", timeout=300)


@pytest.fixture
def agent(kube: Kube) -> Kube:
    """The chart installed and its agent serving every device."""
    if not kube.installed():
        kube.install()
    kube.wait_agent_serving()
    return kube


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    base = request.node.name.split("[")[0].removeprefix("test_").replace("_", "-")[:40]
    name = kube.create_namespace(f"e2e-{base}-{uuid.uuid4().hex[:5]}")
    yield name
    kube.delete_namespace(name)
