"""The local cluster's lifecycle in a pytest session: one lock, one ``up``, one ``down``.

Registered by tests/conftest.py for every test directory. When items marked ``cluster``
or ``e2e`` are selected, ``pytest_collection_finish`` takes the cluster lock (shared with
every other user of the one local cluster) outside any test timeout, after the other
plugins' hooks (the e2e image build runs before, not under the lock);
``pytest_sessionfinish`` releases it.

The session fixture ``local_cluster`` brings the cluster up once (a no-op when it runs
already; on a fresh machine ``hack/local-up-cluster.sh up`` builds Kubernetes and etcd
first) and, when this session started it, takes it down at the session's end unless
GPU_SHARE_CLUSTER_KEEP=1. Every fixture that needs the cluster builds on it: the
``cluster`` fixture of tests/cluster, the ``kube`` fixture of the e2e stories, and
``testkit.harness.live_cluster``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pytest

from testkit.harness.env import (
    CLUSTER_SCRIPT,
    UP_TIMEOUT_S,
    cluster_info,
    cluster_is_up,
    loud_skip,
    run_script,
)
from testkit.harness.lock import LOCK_FILE, acquire_lock, release_lock

LOCK_TIMEOUT_S = int(os.environ.get("GPU_SHARE_E2E_LOCK_TIMEOUT", str(45 * 60)))
MARKERS = ("cluster", "e2e")


@dataclass(frozen=True)
class LocalCluster:
    env: Mapping[str, str]  # hack/local-up-cluster.sh env --json
    started_here: bool


class _Session:
    locked = False
    problem: str | None = None  # the lock could not be taken


def needs_cluster(items: list[pytest.Item]) -> bool:
    return any(item.get_closest_marker(m) for item in items for m in MARKERS)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or not needs_cluster(session.items):
        return
    if cluster_info().problem:
        return  # the fixture skips, loudly
    t0 = time.monotonic()
    try:
        acquire_lock(
            LOCK_TIMEOUT_S,
            on_wait=lambda: sys.stderr.write(f"\n=== waiting for the cluster lock {LOCK_FILE}\n"),
        )
    except TimeoutError as exc:
        _Session.problem = str(exc)
        return
    _Session.locked = True
    if time.monotonic() - t0 > 1:
        sys.stderr.write(f"=== cluster lock taken after {time.monotonic() - t0:.0f}s\n")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _Session.locked:
        release_lock()
        _Session.locked = False


def lock_taken() -> bool:
    """True when this session holds the cluster lock (``cluster``/``e2e`` items ran)."""
    return _Session.locked


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
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
                "and the logs under the cluster work dir",
                pytrace=False,
            )
    try:
        yield LocalCluster(env=cluster_info().env, started_here=not already_up)
    finally:
        if not already_up and os.environ.get("GPU_SHARE_CLUSTER_KEEP") != "1":
            run_script("down", timeout=300, stream=True)
