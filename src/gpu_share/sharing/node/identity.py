"""Which container a kubelet GetPreferredAllocation/Allocate call belongs to.

The kubelet names neither pod nor container. It admits one pod at a time, containers
in admission order, and for each container every device-plugin resource (random
order), recording a resource's devices (visible in PodResources) only after its
Allocate returned. So the call for resource R with ``size`` units belongs to the FIRST
container (admission order) of an active pod that

* requests R with exactly ``size`` units,
* has no R devices in PodResources and no allocated R ids in the ledger,
* and is not preceded, in its pod, by a container still missing any of our resources.

Several qualifying pods (stale or racing pods) are ranked: an open ledger entry first,
then the earliest created pod, then namespace/name; the others are counted.
IDs that the caller passes (``must_include`` / Allocate IDs) held by an init container
of one pod restrict the candidates to that pod (init-container reuse).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_share.sharing.model import (
    ContainerView,
    PodResourcesPod,
    PodResourcesView,
    PodView,
    ResourceKind,
    ResourceNames,
)
from gpu_share.sharing.node.ledger import Ledger, LedgerEntry, PodKey


@dataclass(frozen=True)
class IdentityMatch:
    pod: PodView
    container: ContainerView
    order: int  # index in PodView.containers (admission order)
    entry: LedgerEntry | None  # the container's ledger entry, if any
    ambiguity: int  # how many other containers qualified too


def _present(
    kind: ResourceKind,
    pr_devices: Mapping[str, Sequence[str]],
    names: ResourceNames,
    entry: LedgerEntry | None,
) -> bool:
    return bool(pr_devices.get(names.name_of(kind))) or (
        entry is not None and entry.allocated(kind)
    )


class AdmittedPods:
    """Pods PodResources shows complete: every container holds every resource of ours it
    requests, so none of them waits for a call (``_waiting_container`` is None). Known
    by the very (PodResourcesPod, PodView) objects it was checked on: the PodResources
    client hands back the same object for a pod listed unchanged, so on a busy node
    most pods are skipped by two identity tests. Holds pods of the last lists only."""

    def __init__(self) -> None:
        self._done: dict[PodKey, tuple[PodResourcesPod, PodView]] = {}

    def complete(self, prp: PodResourcesPod, view: PodView, names: ResourceNames) -> bool:
        key = (prp.namespace, prp.name)
        hit = self._done.get(key)
        if hit is not None and hit[0] is prp and hit[1] is view:
            return True
        devs = {c.name: c.devices for c in prp.containers}
        if any(
            c.request.amount(k) > 0 and not devs.get(c.name, {}).get(names.name_of(k))
            for c in view.containers
            for k in ResourceKind
        ):
            return False
        self._done[key] = (prp, view)
        return True

    def keep_only(self, pr: PodResourcesView) -> None:
        """Forget pods no longer listed, once they are many (bounded memory)."""
        if len(self._done) > 2 * len(pr.pods) + 64:
            listed = {(p.namespace, p.name) for p in pr.pods}
            self._done = {k: v for k, v in self._done.items() if k in listed}


def resolve(
    kind: ResourceKind,
    size: int,
    hint_ids: Sequence[str],
    pr: PodResourcesView,
    pods: Mapping[PodKey, PodView],
    ledger: Ledger,
    names: ResourceNames,
    admitted: AdmittedPods | None = None,
) -> IdentityMatch | None:
    """The container this call belongs to, or None when no active pod qualifies.
    ``admitted``: the caller's memory of complete pods (skipped without a look)."""
    hint = set(hint_ids)
    hinted_pods: set[PodKey] = set()
    candidates: list[IdentityMatch] = []
    admitted = admitted or AdmittedPods()
    for prp in pr.pods:
        key = (prp.namespace, prp.name)
        view = pods.get(key)
        if view is None or view.terminal or view.deleted:
            continue
        if hint and _holds_any(prp, hint, names.name_of(kind)):
            hinted_pods.add(key)
        if admitted.complete(prp, view, names):
            continue
        match = _waiting_container(view, prp, kind, size, ledger, names)
        if match is not None:
            candidates.append(match)
    admitted.keep_only(pr)
    if hinted_pods:
        narrowed = [m for m in candidates if (m.pod.namespace, m.pod.name) in hinted_pods]
        candidates = narrowed or candidates
    if not candidates:
        return None
    candidates.sort(key=_rank)
    best = candidates[0]
    return IdentityMatch(best.pod, best.container, best.order, best.entry, len(candidates) - 1)


def second_half(
    kind: ResourceKind, size: int, pr: PodResourcesView, ledger: Ledger, names: ResourceNames
) -> tuple[LedgerEntry | None, int]:
    """When the pod of a call is unknown (its spec could not be read): the container
    whose other resource was decided a call earlier, while its pod was known, and whose
    second half this call must be (deciding it blind could split the container over two
    devices). A named entry qualifies when it asks ``size`` units of ``kind``, holds none
    yet, and PodResources shows its container holding exactly the entry's ids of the
    other kind and nothing of ``kind`` (the kubelet admits a container's resources back
    to back; a rejected pod's half is no longer listed). The latest such entry, and how
    many others qualified."""
    listed = {(p.namespace, p.name): {c.name: c.devices for c in p.containers}
              for p in pr.pods}
    other = kind.other
    found = [
        e for e in ledger.unordered()
        if not e.degraded
        and e.request.amount(kind) == size > 0
        and not e.allocated(kind)
        and e.allocated(other)
        and _holds_exactly(listed.get(e.pod_key, {}).get(e.ref.container_name),
                           names.name_of(other), e.ids(other), names.name_of(kind))
    ]
    if not found:
        return None, 0
    return max(found, key=lambda e: (e.updated_at, e.ref)), len(found) - 1


def _holds_exactly(devices: Mapping[str, Sequence[str]] | None, other: str,
                   ids: Sequence[str], resource: str) -> bool:
    return devices is not None and not devices.get(resource) and (
        set(devices.get(other, ())) == set(ids)
    )


def _holds_any(prp: PodResourcesPod, hint: set[str], resource: str) -> bool:
    return any(i in hint for c in prp.containers for i in c.devices.get(resource, ()))


def _waiting_container(
    view: PodView,
    prp: PodResourcesPod,
    kind: ResourceKind,
    size: int,
    ledger: Ledger,
    names: ResourceNames,
) -> IdentityMatch | None:
    """The pod's first container still missing one of our resources, if it is the one
    asking for ``size`` units of ``kind``."""
    pr_containers = {c.name: c.devices for c in prp.containers}
    for order, c in enumerate(view.containers):
        if c.request.empty:
            continue
        devs = pr_containers.get(c.name, {})
        entry = ledger.find(view.namespace, view.name, c.name, view.uid)
        if c.request.amount(kind) == size and size > 0 and not _present(kind, devs, names, entry):
            return IdentityMatch(view, c, order, entry, 0)
        if any(
            c.request.amount(k) > 0 and not _present(k, devs, names, entry) for k in ResourceKind
        ):
            return None  # an earlier container is still being admitted
    return None


def _rank(m: IdentityMatch) -> tuple[int, float, str, str]:
    open_entry = m.entry is not None
    return (0 if open_entry else 1, m.pod.created_at, m.pod.namespace, m.pod.name)
