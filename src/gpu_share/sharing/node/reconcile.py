"""Aligning the ledger with what the kubelet holds (docs/allocation.md, "Reconcile").

Four steps, each a function on the ledger: expire abandoned offers, adopt/attribute/
correct from PodResources, expire old blind (degraded) entries, release pods the
kubelet no longer lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpu_share.errors import AllocationError
from gpu_share.sharing.ids import count_by_device, parse_unit_ids
from gpu_share.sharing.inventory import CORES_PER_DEVICE
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRef,
    ContainerRequest,
    DeviceShare,
    PerKind,
    PodResourcesContainer,
    PodResourcesView,
    PodView,
    ResourceKind,
    ResourceNames,
)
from gpu_share.sharing.node.ledger import EntrySource, EntryState, Ledger, LedgerEntry, PodKey

Held = PerKind[tuple[str, ...]]  # a container's ids per kind, sorted


@dataclass(frozen=True)
class _Spec:
    order: int = -1
    kind: ContainerKind = ContainerKind.APP
    request: ContainerRequest | None = None  # None: the pod spec is unknown


@dataclass
class Adoption:
    adopted: list[ContainerRef] = field(default_factory=list)
    attributed: list[ContainerRef] = field(default_factory=list)
    corrected: list[ContainerRef] = field(default_factory=list)
    present: set[PodKey] = field(default_factory=set)  # pods PodResources lists
    # blind (synthetic) ref -> the container it turned out to be
    renamed: dict[ContainerRef, ContainerRef] = field(default_factory=dict)


def expire_offers(
    ledger: Ledger, now: float, ttl_s: float, keep: ContainerRef | None = None
) -> list[ContainerRef]:
    """Release decisions that hold no unit yet and whose last offer is at least ``ttl_s``
    old (all but ``keep``). Without this, offers made while PodResources is down (which
    reconcile cannot judge) would reserve units for good."""
    expired = [
        e.ref
        for e in sorted(
            (e for e in ledger.unordered() if now - e.updated_at >= ttl_s),
            key=lambda e: (e.ref, e.order),
        )
        if e.ref != keep and e.state is EntryState.DECIDED
    ]
    for ref in expired:
        ledger.remove(ref)
    return expired


def adopt(
    ledger: Ledger,
    pr: PodResourcesView,
    views: Mapping[PodKey, PodView],
    names: ResourceNames,
    now: float,
) -> Adoption:
    """Every container PodResources lists with our ids gets an entry holding exactly
    those ids: new (adopted), named (a blind entry attributed), or corrected."""
    out = Adoption()
    for p in pr.pods:
        key = (p.namespace, p.name)
        out.present.add(key)
        ledger.mark_present(key)
        view = views.get(key)
        for c in p.containers:
            held = held_ids(c, names)
            if held is not None:
                _adopt_container(ledger, ContainerRef(*key, c.name, view.uid if view else ""),
                                 _spec_of(view, c.name), held, now, out)
    return out


def held_ids(c: PodResourcesContainer, names: ResourceNames) -> Held | None:
    """The container's ids of our resources; None when it holds none (or ids that are
    not ours, which should not happen)."""
    held = PerKind.build(lambda k: tuple(sorted(c.devices.get(names.name_of(k), ()))))
    if not any(held.values()):
        return None
    try:
        for k in ResourceKind:
            parse_unit_ids(held[k], k)
    except AllocationError:
        return None
    return held


def _spec_of(view: PodView | None, container: str) -> _Spec:
    if view is not None:
        for i, c in enumerate(view.containers):
            if c.name == container:
                return _Spec(i, c.kind, c.request)
    return _Spec()


def _adopt_container(
    ledger: Ledger, ref: ContainerRef, spec: _Spec, held: Held, now: float, out: Adoption
) -> None:
    entry = ledger.find(ref.namespace, ref.pod_name, ref.container_name, ref.pod_uid)
    deg = _degraded_holding(ledger, held)
    if deg is not None:
        # Its ids are this container's: the blind decision is now named.
        ledger.remove(deg.ref)
        out.attributed.append(ref)
        out.renamed[deg.ref] = ref
    if entry is None:
        if deg is None:
            out.adopted.append(ref)
        ledger.put(_new_entry(ref, spec, held, now))
        return
    fixed = _corrected(ledger, entry, ref.pod_uid, spec, held, now)
    if fixed is not None:
        out.corrected.append(fixed.ref)
        ledger.put(fixed)


def attribute_blind(
    ledger: Ledger,
    pr: PodResourcesView,
    ref: ContainerRef,
    names: ResourceNames,
    now: float,
) -> LedgerEntry | None:
    """Name, during a call, a blind decision PodResources already shows ``ref`` holding
    (its other resource was decided while the pod was unknown): the call then extends
    that decision on the same device instead of deciding anew (which could split the
    container over two devices). None when there is no such decision."""
    for p in pr.pods:
        if (p.namespace, p.name) != (ref.namespace, ref.pod_name):
            continue
        for c in p.containers:
            held = held_ids(c, names) if c.name == ref.container_name else None
            deg = _degraded_holding(ledger, held) if held is not None else None
            if held is not None and deg is not None:
                ledger.remove(deg.ref)
                entry = _new_entry(ref, _Spec(), held, now)
                ledger.put(entry)
                return entry
    return None


def _degraded_holding(ledger: Ledger, held: Held) -> LedgerEntry | None:
    for e in ledger.entries:
        if not e.degraded:
            continue
        ks = [k for k in ResourceKind if e.ids(k)]
        if ks and all(set(e.ids(k)) <= set(held[k]) for k in ks):
            return e
    return None


def _new_entry(ref: ContainerRef, spec: _Spec, held: Held, now: float) -> LedgerEntry:
    req = spec.request or ContainerRequest(*(len(ids) for ids in held.values()))
    return LedgerEntry(
        ref=ref,
        request=req,
        shares=shares_from_ids(held, req),
        source=EntrySource.RECONCILED,
        created_at=now,
        updated_at=now,
        container_kind=spec.kind,
        order=spec.order,
        memory_ids=held.memory,
        core_ids=held.core,
    )


def _corrected(
    ledger: Ledger, entry: LedgerEntry, uid: str, spec: _Spec, held: Held, now: float
) -> LedgerEntry | None:
    """``entry`` with what PodResources and the pod spec say; None when nothing changed."""
    changed = False
    if uid and not entry.ref.pod_uid:
        ledger.remove(entry.ref)
        entry = replace(entry, ref=replace(entry.ref, pod_uid=uid))
        changed = True
    if spec.request is not None and entry.request != spec.request:
        entry = replace(entry, request=spec.request, order=spec.order, container_kind=spec.kind)
        changed = True
    for k in ResourceKind:
        if held[k] and tuple(sorted(entry.ids(k))) != held[k]:
            entry = entry.with_ids(k, held[k], now)
            changed = True
    if not changed:
        return None
    ids = PerKind.build(entry.ids)
    return replace(entry, shares=shares_from_ids(ids, entry.request, entry.shares))


def shares_from_ids(
    held: PerKind[tuple[str, ...]],
    request: ContainerRequest,
    previous: Sequence[DeviceShare] = (),
) -> tuple[DeviceShare, ...]:
    """Shares that match the held ids; a kind not yet allocated keeps its decided
    amount on that device (or, on a single device, the whole request)."""
    per_dev = held.map(count_by_device)
    devices = list(dict.fromkeys([*per_dev.core, *per_dev.memory, *(s.device for s in previous)]))
    exclusive = request.cores >= CORES_PER_DEVICE
    out = []
    for d in devices:
        prev = next((s for s in previous if s.device == d), None)
        amounts = {}
        for k in ResourceKind:
            n = per_dev[k].get(d, 0) if held[k] else (prev.amount(k) if prev else 0)
            if len(devices) == 1 and not held[k]:
                n = n or request.amount(k)
            amounts[k] = n
        out.append(
            DeviceShare(d, amounts[ResourceKind.MEMORY], amounts[ResourceKind.CORE], exclusive)
        )
    return tuple(out)


def expire_degraded(ledger: Ledger, now: float, grace_s: float) -> list[ContainerRef]:
    """Blind entries PodResources never attributed within ``grace_s``."""
    old = [e.ref for e in ledger.entries if e.degraded and now - e.updated_at >= grace_s]
    for ref in old:
        ledger.remove(ref)
    return old


def release_absent(
    ledger: Ledger,
    present: set[PodKey],
    pods: Mapping[PodKey, PodView | None] | None,
    now: float,
    grace_s: float,
) -> tuple[list[ContainerRef], list[PodKey], list[PodKey]]:
    """Pods the kubelet no longer lists: released when the API server says they are
    gone, or after ``grace_s``. Returns (released refs, released pods, waiting pods)."""
    released: list[ContainerRef] = []
    gone_pods: list[PodKey] = []
    waiting: list[PodKey] = []
    for key in sorted(ledger.pod_keys() - present):
        entries = ledger.pod_entries(key)
        if not entries or entries[0].degraded:
            continue
        absent_s = ledger.absent_for(key, now)
        if _gone(entries, key, pods) or absent_s >= grace_s:
            released.extend(ledger.release_pod(key))
            gone_pods.append(key)
        else:
            waiting.append(key)
    return released, gone_pods, waiting


def _gone(
    entries: Sequence[LedgerEntry], key: PodKey, pods: Mapping[PodKey, PodView | None] | None
) -> bool:
    if pods is None or key not in pods:
        return False  # the API server's view says nothing about it
    view = pods[key]
    # A different uid means our pod is gone and a new one took its name; an unknown
    # uid ("") proves nothing.
    replaced = view is not None and all(
        e.ref.pod_uid and e.ref.pod_uid != view.uid for e in entries
    )
    return view is None or view.terminal or replaced
