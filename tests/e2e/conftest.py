"""Session fixtures of the end-to-end stories.

When e2e stories are selected, ``pytest_collection_finish`` builds the image
(hack/build-image.sh, cached by source hash) outside any test timeout and before the
session takes the cluster lock (``testkit.pytest_cluster``, which also brings the
cluster up and down: ``local_cluster``).

``kube`` (package): on the session's cluster, imports the image, installs the chart with
the dummy backend (values-examples/dummy-npu.yaml + local-cluster.yaml) and waits for the
node to advertise the devices. At the end it uninstalls the chart (no agent is left
running).

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

from testkit.e2e import Kube
from testkit.harness import BUILD_SCRIPT, cluster_info, helm_path, loud_skip, run_script
from testkit.pytest_cluster import LocalCluster, lock_taken

BUILD_TIMEOUT_S = int(os.environ.get("GPU_SHARE_E2E_BUILD_TIMEOUT", str(40 * 60)))


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
    """When e2e stories are selected: build the image (before the session's cluster lock:
    it does not need the cluster). Done here, not in a fixture, so that the build does
    not count against pytest-timeout."""
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
    sys.stderr.write(f"\n=== e2e: image ready in {time.monotonic() - t0:.0f}s\n")


# Package scope: the chart is uninstalled right after the last story, so later cluster
# tests of the same pytest run (which start their own agent on the same kubelet
# device-plugin dir) never meet this one.
@pytest.fixture(scope="package")
def kube(local_cluster: LocalCluster) -> Iterator[Kube]:
    if _Session.problem:
        if "failed" in _Session.problem:
            pytest.fail(_Session.problem, pytrace=False)
        loud_skip("e2e stories", _Session.problem)
    assert lock_taken(), "the cluster lock was not taken"
    t0 = time.monotonic()
    k: Kube | None = None
    try:
        # The image built before the lock, even if the sources changed meanwhile.
        imp = run_script(
            "--import-tar", _Session.tar, script=BUILD_SCRIPT, timeout=600, stream=True
        )
        assert imp.returncode == 0, "importing the image failed: see above"
        k = Kube(env=local_cluster.env, helm_bin=_Session.helm)
        k.ensure_agent_namespace()
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
