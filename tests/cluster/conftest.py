"""Fixtures for the tests that need the real local cluster.

The cluster's lock and lifecycle are the session's (``testkit.pytest_cluster``:
``local_cluster``). ``cluster`` adds what these tests share on top: a ``Cluster``
(testkit/harness and tests/cluster/cluster_support) whose processes are stopped at the
end of the session.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from testkit.harness import wait_until
from testkit.pytest_cluster import LocalCluster
from tests.cluster.cluster_support import Cluster


@pytest.fixture(scope="session")
def cluster(local_cluster: LocalCluster) -> Iterator[Cluster]:
    c = Cluster(env=local_cluster.env, started_here=local_cluster.started_here)
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


@pytest.fixture
def ns(cluster: Cluster, namespace: str) -> Iterator[str]:
    """``namespace``, but its pods are gone (devices freed) before the next test."""
    yield namespace
    cluster.kubectl(
        "delete", "namespace", namespace, "--wait=true", "--timeout=120s", check=False, timeout=150
    )
