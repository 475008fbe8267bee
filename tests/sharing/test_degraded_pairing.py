"""Degraded mode with the API server down and PodResources up (the kubelet still admits
the pods it was sent): the engine pairs a container's memory and core calls, but never
across pods. The kubelet lists a pod in PodResources before admitting it, so a pod that
appeared since a blind decision means the call is for another pod.

Found on the local cluster (tests/e2e/test_9_failures.py, story 9a): a memory-only pod
admitted after a cores-only one was paired with it and told the other pod's core
percentage (and a memory+cores pod whose memory call came first could be split).
"""

from __future__ import annotations

import random

import pytest

from gpu_share.sharing.engine import CallContext
from gpu_share.sharing.ledger import LedgerEntry
from gpu_share.sharing.model import ResourceKind
from tests.sharing.helpers import ctr, engine, pod
from tests.sharing.kubesim import KubeletSim


class ApiDownSim(KubeletSim):
    """PodResources answers, the API server does not (no pod specs)."""

    def ctx(self) -> CallContext:
        self.now += 0.5
        return CallContext(self.pr(), None, self.now)


def _holder(sim: KubeletSim, ids: list[str]) -> LedgerEntry:
    (e,) = [x for x in sim.engine.ledger.entries if set(ids) & {*x.memory_ids, *x.core_ids}]
    return e


@pytest.mark.parametrize("seed", range(8))
def test_a_blind_decision_is_never_paired_with_the_next_pods_call(seed: int) -> None:
    sim = ApiDownSim(engine(), random.Random(seed))
    assert sim.admit(pod("cores-only", ctr("c", cores=20)))
    assert sim.admit(pod("memory-only", ctr("c", mem=3)))
    mem_ids = sim.held[("default", "memory-only")]["c"][ResourceKind.MEMORY]
    e = _holder(sim, mem_ids)
    # Its Allocate answer (built from this entry) names no core share of the other pod.
    assert e.core_ids == () and all(s.cores == 0 for s in e.shares), e
    sim.check_invariants()


@pytest.mark.parametrize("seed", range(12))
def test_memory_and_cores_of_one_container_still_pair_after_another_pod(seed: int) -> None:
    sim = ApiDownSim(engine(), random.Random(seed))
    assert sim.admit(pod("cores-only", ctr("c", cores=30)))
    assert sim.admit(pod("both", ctr("c", mem=2, cores=10)))
    held = sim.held[("default", "both")]["c"]
    e = _holder(sim, held[ResourceKind.MEMORY])
    assert set(e.memory_ids) == set(held[ResourceKind.MEMORY])
    assert set(e.core_ids) == set(held[ResourceKind.CORE]), e
    sim.check_invariants()  # one device per container
