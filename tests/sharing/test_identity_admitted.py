"""identity.AdmittedPods: pods PodResources shows complete are skipped, by the very
objects they were checked on, and the answer of ``resolve`` is the same as without it."""

from __future__ import annotations

from gpu_share.sharing.model import (
    PodResourcesContainer,
    PodResourcesPod,
    PodResourcesView,
    ResourceKind,
)
from gpu_share.sharing.node import identity
from gpu_share.sharing.node.ledger import Ledger

from .helpers import NAMES, ctr, pod

MEM, CORE = NAMES.memory, NAMES.core
DONE = pod("done", ctr("a", mem=2, cores=10), ctr("b", mem=1), created=1.0)
WAITING = pod("waiting", ctr("a", mem=2), ctr("b", mem=2, cores=5), created=2.0)


def _pr(done_devs: dict[str, tuple[str, ...]]) -> PodResourcesView:
    return PodResourcesView((
        PodResourcesPod("default", "done", (
            PodResourcesContainer("a", done_devs),
            PodResourcesContainer("b", {MEM: ("GPU-0::mem::2",)}),
        )),
        PodResourcesPod("default", "waiting", (
            PodResourcesContainer("a", {MEM: ("GPU-1::mem::0", "GPU-1::mem::1")}),
            PodResourcesContainer("b", {}),
        )),
    ))


FULL = {MEM: ("GPU-0::mem::0", "GPU-0::mem::1"), CORE: ("GPU-0::core::0",)}
VIEWS = {("default", "done"): DONE, ("default", "waiting"): WAITING}


def test_complete_pods_are_remembered_by_object() -> None:
    admitted = identity.AdmittedPods()
    pr = _pr(FULL)
    done, waiting = pr.pods
    assert admitted.complete(done, DONE, NAMES)
    assert not admitted.complete(waiting, WAITING, NAMES)
    # Same content, another object (the pod was listed anew): checked again.
    assert admitted.complete(_pr(FULL).pods[0], DONE, NAMES)
    # The same pod without its cores yet is not complete.
    assert not admitted.complete(_pr({MEM: FULL[MEM]}).pods[0], DONE, NAMES)


def test_resolve_answers_the_same_with_and_without_memory() -> None:
    admitted = identity.AdmittedPods()
    for devs in (FULL, {MEM: FULL[MEM]}, FULL):
        pr = _pr(devs)
        for kind, size in ((ResourceKind.MEMORY, 2), (ResourceKind.CORE, 5),
                           (ResourceKind.CORE, 10), (ResourceKind.MEMORY, 1)):
            for _ in range(2):  # the second time from memory
                got = identity.resolve(kind, size, (), pr, VIEWS, Ledger(), NAMES, admitted)
                want = identity.resolve(kind, size, (), pr, VIEWS, Ledger(), NAMES)
                assert got == want
    # "done" without its cores: its container a waits for 10 cores.
    m = identity.resolve(ResourceKind.CORE, 10, (), _pr({MEM: FULL[MEM]}), VIEWS, Ledger(),
                         NAMES, admitted)
    assert m is not None and (m.pod.name, m.container.name) == ("done", "a")


def test_memory_forgets_pods_no_longer_listed() -> None:
    admitted = identity.AdmittedPods()
    for i in range(200):
        p = PodResourcesPod("default", f"p{i}", ())
        assert admitted.complete(p, pod(f"p{i}"), NAMES)
        admitted.keep_only(PodResourcesView((p,)))
    assert len(admitted._done) <= 2 + 64
