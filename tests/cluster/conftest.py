"""Fixtures for the tests that need the real local cluster.

When cluster tests are selected, ``pytest_collection_finish`` takes the cluster lock
(/tmp/gpu-share-cluster.lock, shared with every other user of the one local cluster;
re-entrant, so e2e stories in the same run share it) outside any test timeout, and
``pytest_sessionfinish`` releases it.

The session fixture ``cluster`` runs ``hack/local-up-cluster.sh up`` (a no-op when the
cluster already runs; on a fresh machine it builds Kubernetes and etcd first) and yields
a ``Cluster`` with the cluster's environment (testkit/harness: ``env --json``). A cluster
that this fixture started is taken down at the end of the session unless
GPU_SHARE_CLUSTER_KEEP=1; one that was already running is left running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from testkit.harness import (
    CLUSTER_SCRIPT,
    LOCK_FILE,
    UP_TIMEOUT_S,
    acquire_lock,
    cluster_info,
    cluster_is_up,
    loud_skip,
    release_lock,
    run_script,
    wait_until,
)
from tests.cluster.cluster_support import Cluster

LOCK_TIMEOUT_S = int(os.environ.get("GPU_SHARE_E2E_LOCK_TIMEOUT", str(45 * 60)))


class _Session:
    locked = False
    problem: str | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or not any(
        item.get_closest_marker("cluster") for item in session.items
    ):
        return
    if cluster_info().problem:
        return  # the fixture skips, loudly
    t0 = time.monotonic()
    try:
        acquire_lock(
            LOCK_TIMEOUT_S,
            on_wait=lambda: sys.stderr.write(f"\n=== cluster tests: waiting for {LOCK_FILE}\n"),
        )
    except TimeoutError as exc:
        _Session.problem = str(exc)
        return
    _Session.locked = True
    if time.monotonic() - t0 > 1:
        sys.stderr.write(f"=== cluster tests: lock taken after {time.monotonic() - t0:.0f}s\n")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _Session.locked:
        release_lock()
        _Session.locked = False


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    problem = cluster_info().problem
    if problem:
        loud_skip("cluster tests", problem)
    if _Session.problem:
        pytest.fail(_Session.problem, pytrace=False)
    already_up = cluster_is_up()
    if not already_up:
        sys.stderr.write(
            f"\n=== starting the local cluster: {CLUSTER_SCRIPT} up (cold builds take a while)\n"
        )
        up = run_script("up", timeout=UP_TIMEOUT_S, stream=True)
        if up.returncode != 0:
            pytest.fail(
                f"{CLUSTER_SCRIPT} up failed with rc={up.returncode}; see the output above "
                f"and the logs under the cluster work dir",
                pytrace=False,
            )
    c = Cluster(env=cluster_info().env, started_here=not already_up)
    try:
        yield c
    finally:
        for p in c.processes:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        if c.started_here and os.environ.get("GPU_SHARE_CLUSTER_KEEP") != "1":
            run_script("down", timeout=300, stream=True)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace, deleted afterwards."""
    name = f"smoke-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_until(
        f"default ServiceAccount in {name}",
        lambda: cluster.kubectl("-n", name, "get", "sa", "default", check=False).returncode == 0,
        60,
        interval=0.5,
        fail=False,
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
