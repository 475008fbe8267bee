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

import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from testkit.e2e import AGENT_NS, Kube
from testkit.harness import (
    BUILD_SCRIPT,
    LOCK_FILE,
    UP_TIMEOUT_S,
    acquire_lock,
    cluster_info,
    helm_path,
    loud_skip,
    release_lock,
    run_script,
)

BUILD_TIMEOUT_S = int(os.environ.get("GPU_SHARE_E2E_BUILD_TIMEOUT", str(40 * 60)))
LOCK_TIMEOUT_S = int(os.environ.get("GPU_SHARE_E2E_LOCK_TIMEOUT", str(45 * 60)))


def _environment_problem() -> str | None:
    """The cluster's own check, and what building the image needs on top of it."""
    problem = cluster_info().problem
    if problem is None and shutil.which("apt-get") is None and shutil.which("buildah") is None:
        return "buildah missing and no apt-get to install it"
    return problem


class _Session:
    """What pytest_collection_finish prepared (outside any test timeout)."""

    tar: str = ""
    helm: str = ""
    locked: bool = False
    problem: str | None = None


def _story(item: pytest.Item) -> int:
    """The story number of ``test_<n>_*.py`` (test_10 after test_9, not before test_1)."""
    digits = item.path.name.removeprefix("test_").split("_", 1)[0]
    return int(digits) if digits.isdigit() else 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Stories run in their numeric order, in the slots e2e items already hold."""
    slots = [i for i, it in enumerate(items) if "/tests/e2e/" in str(it.path)]
    ordered = sorted((items[i] for i in slots), key=_story)  # stable within a file
    for i, it in zip(slots, ordered, strict=True):
        items[i] = it


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
    build = run_script("--no-import", script=BUILD_SCRIPT, timeout=BUILD_TIMEOUT_S, stream=True)
    if build.returncode != 0:
        _Session.problem = "hack/build-image.sh failed: see its output above"
        return
    _Session.tar = build.stdout.strip().splitlines()[-1]
    _Session.helm = helm_path(3)
    sys.stderr.write(
        f"\n=== e2e: image ready in {time.monotonic() - t0:.0f}s; waiting for {LOCK_FILE}\n"
    )
    try:
        acquire_lock(LOCK_TIMEOUT_S)
    except TimeoutError as exc:
        _Session.problem = str(exc)
        return
    _Session.locked = True
    sys.stderr.write(f"=== e2e: cluster lock taken after {time.monotonic() - t0:.0f}s\n")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _Session.locked:
        release_lock()
        _Session.locked = False


# Package scope: the chart is uninstalled right after the last story, so later cluster
# tests of the same pytest run (which start their own agent on the same kubelet
# device-plugin dir) never meet this one.
@pytest.fixture(scope="package")
def kube() -> Iterator[Kube]:
    if _Session.problem:
        if "failed" in _Session.problem or "held" in _Session.problem:
            pytest.fail(_Session.problem, pytrace=False)
        loud_skip("e2e stories", _Session.problem)
    assert _Session.locked, "the cluster lock was not taken"
    t0 = time.monotonic()
    started_here = False
    k: Kube | None = None
    try:
        if run_script("status", timeout=60).returncode != 0:
            started_here = True
            up = run_script("up", timeout=UP_TIMEOUT_S, stream=True)
            assert up.returncode == 0, "hack/local-up-cluster.sh up failed: see above"
        # The image built before the lock, even if the sources changed meanwhile.
        imp = run_script(
            "--import-tar", _Session.tar, script=BUILD_SCRIPT, timeout=600, stream=True
        )
        assert imp.returncode == 0, "importing the image failed: see above"
        k = Kube(env=cluster_info().env, helm_bin=_Session.helm)
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
            run_script("down", timeout=300, stream=True)


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
