"""Fixtures for the tests that need the real local cluster.

The session fixture ``cluster`` runs ``hack/local-up-cluster.sh up`` (a no-op
when the cluster already runs; on a fresh machine it builds Kubernetes and
etcd first) and yields a ``cluster_support.Cluster`` with the cluster's
environment (the ``export`` lines of ``hack/local-up-cluster.sh env``).  A
cluster that this fixture started is taken down at the end of the session
unless GPU_SHARE_CLUSTER_KEEP=1; one that was already running is left running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from cluster_support import (
    SCRIPT,
    UP_TIMEOUT_S,
    Cluster,
    environment_problem,
    loud_skip,
    parse_env,
    run_script,
)


@pytest.fixture(scope="session")
def cluster():
    problem = environment_problem()
    if problem:
        loud_skip(problem)
    already_up = run_script("status").returncode == 0
    if not already_up:
        sys.stderr.write(
            f"\n=== starting the local cluster: {SCRIPT} up (cold builds take a while)\n"
        )
        up = run_script("up", timeout=UP_TIMEOUT_S, stream=True)
        if up.returncode != 0:
            pytest.fail(
                f"{SCRIPT} up failed with rc={up.returncode}; see the output above "
                f"and the logs under the cluster work dir",
                pytrace=False,
            )
    env_proc = run_script("env")
    assert env_proc.returncode == 0, env_proc.stderr
    c = Cluster(env=parse_env(env_proc.stdout), started_here=not already_up)
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
def namespace(cluster: Cluster):
    """A fresh namespace, deleted afterwards."""
    name = f"smoke-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (
            cluster.kubectl("-n", name, "get", "serviceaccount", "default", check=False).returncode
            == 0
        ):
            break
        time.sleep(0.5)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
