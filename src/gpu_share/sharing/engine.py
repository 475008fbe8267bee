"""AllocationEngine: the single entry point the agent calls (under its lock).

Pure: no I/O, no clock (``now`` is passed in), no logging (results carry notes).
See docs/allocation.md for the algorithm and its assumptions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from gpu_share.config.model import PlacementPolicyName
from gpu_share.devices.base import Device
from gpu_share.errors import AllocationError, IdentityError
from gpu_share.sharing import identity
from gpu_share.sharing.annotations import (
    ContainerAssignment,
    InventoryAnnotation,
    InventoryDevice,
    PodAssignment,
)
from gpu_share.sharing.decision import DecisionError, decision_key, verify
from gpu_share.sharing.ids import count_by_device, group_by_device, parse_unit_ids
from gpu_share.sharing.inventory import CORES_PER_DEVICE, DeviceCapacity, Inventory
from gpu_share.sharing.ledger import (
    DeviceUsage,
    EntrySource,
    EntryState,
    Ledger,
    LedgerEntry,
    PodKey,
)
from gpu_share.sharing.model import (
    AdvertisedDevice,
    ContainerKind,
    ContainerRef,
    ContainerRequest,
    DeviceShare,
    PodResourcesView,
    PodView,
    ResourceKind,
    ResourceNames,
)
from gpu_share.sharing.policy import (
    DeviceState,
    PlacementPolicy,
    choose_whole_devices,
    get_policy,
)

__all__ = [
    "Allocation",
    "AllocationEngine",
    "CallContext",
    "DegradedMode",
    "Preferred",
    "ReconcileResult",
    "ResourceNames",
]

DegradedMode = Literal["refuse", "single-device"]
DEFAULT_RELEASE_GRACE_S = 60.0
DEFAULT_PAIRING_WINDOW_S = 10.0
# The kubelet calls Allocate right after GetPreferredAllocation: an offer still without
# its Allocate after this long was abandoned (e.g. the pod's admission failed).
DEFAULT_OFFER_TTL_S = 30.0


@dataclass(frozen=True)
class CallContext:
    """What the agent could learn for one kubelet call.

    ``pr``: PodResources ``List`` (None: kubelet unreachable). ``pods``: PodViews the
    agent fetched for ``context_needs`` (None: API server unreachable); a key mapped to
    None means the API server says the pod does not exist.
    """

    pr: PodResourcesView | None
    pods: Mapping[PodKey, PodView | None] | None
    now: float


@dataclass(frozen=True)
class Preferred:
    ids: list[str]
    entry: LedgerEntry
    identity_source: EntrySource  # node-agent, or degraded (synthetic ref)
    notes: tuple[str, ...] = ()  # facts for logs/events, e.g. "degraded: ..."
    ambiguity: int = 0  # other containers that qualified for this call
    changed: bool = True  # the ledger changed (the offer is recorded): persist it


@dataclass(frozen=True)
class Allocation:
    entry: LedgerEntry
    complete_container: bool  # every requested resource of the container allocated
    identity_source: EntrySource
    notes: tuple[str, ...] = ()
    ambiguity: int = 0


@dataclass(frozen=True)
class ReconcileResult:
    released: tuple[ContainerRef, ...] = ()
    adopted: tuple[ContainerRef, ...] = ()  # new entries from PodResources
    attributed: tuple[ContainerRef, ...] = ()  # degraded entries now named
    corrected: tuple[ContainerRef, ...] = ()  # ids replaced by what PodResources says
    waiting: tuple[PodKey, ...] = ()  # absent pods still inside the grace period

    @property
    def changed(self) -> bool:
        return bool(self.released or self.adopted or self.attributed or self.corrected)

    @property
    def pods_touched(self) -> list[PodKey]:
        refs = [*self.released, *self.adopted, *self.attributed, *self.corrected]
        return sorted({(r.namespace, r.pod_name) for r in refs if r.namespace})


def _ref_of(match: identity.IdentityMatch) -> ContainerRef:
    p = match.pod
    return ContainerRef(p.namespace, p.name, match.container.name, p.uid)


def _pods_of(pr: PodResourcesView | None) -> frozenset[PodKey] | None:
    return None if pr is None else frozenset((p.namespace, p.name) for p in pr.pods)


def _err(reason: str, msg: str) -> AllocationError:
    return AllocationError(msg, reason=reason)


class AllocationEngine:
    def __init__(
        self,
        inventory: Inventory,
        ledger: Ledger,
        resources: ResourceNames,
        policy: PlacementPolicy | PlacementPolicyName = PlacementPolicyName.BEST_FIT,
        *,
        degraded_mode: DegradedMode = "single-device",
        release_grace_s: float = DEFAULT_RELEASE_GRACE_S,
        pairing_window_s: float = DEFAULT_PAIRING_WINDOW_S,
        decision_key: bytes | None = None,
        node_name: str = "",
        offer_ttl_s: float = DEFAULT_OFFER_TTL_S,
    ) -> None:
        self._inventory = inventory
        self.ledger = ledger
        self.resources = resources
        self.policy = policy if not isinstance(policy, str) else get_policy(policy)
        self.degraded_mode: DegradedMode = degraded_mode
        self.release_grace_s = release_grace_s
        self.pairing_window_s = pairing_window_s
        self.offer_ttl_s = offer_ttl_s
        self._views: dict[PodKey, PodView] = {}  # PodViews seen (requests never change)
        # Key of the extender's signed decisions; None: decisions are ignored.
        self.decision_key = decision_key
        self.node_name = node_name
        self._notes: list[str] = []  # facts found while deciding, drained per call
        # Degraded mode: the pods PodResources listed at this call (None: unreachable),
        # and at each open blind decision (pairing never crosses into a newer pod).
        self._call_pods: frozenset[PodKey] | None = None
        self._blind_pods: dict[ContainerRef, frozenset[PodKey]] = {}

    # ------------------------------------------------------------------ inventory
    @property
    def inventory(self) -> Inventory:
        return self._inventory

    def advertised(self, kind: ResourceKind) -> list[AdvertisedDevice]:
        return self._inventory.advertised(kind)

    def set_health(self, uuid: str, healthy: bool) -> bool:
        """Returns True when the health changed (the agent then bumps ListAndWatch)."""
        d = self._inventory.require(uuid)
        if d.healthy == healthy:
            return False
        self._inventory = self._inventory.with_health(uuid, healthy)
        return True

    def set_devices(self, devices: Sequence[Device]) -> list[ContainerRef]:
        """Replace the device list. Returns the entries still holding a vanished device
        (kept in the ledger: their containers still run; the agent should warn)."""
        self._inventory = Inventory.from_devices(devices, self._inventory.unit_mib)
        return [
            e.ref
            for e in self.ledger.entries
            if any(self._inventory.get(d) is None for d in e.devices)
        ]

    def set_unit_mib(self, unit_mib: int) -> bool:
        """Cut memory into units of ``unit_mib`` from now on. Only while the ledger is
        empty (ids and amounts of another size would be misread); True when changed."""
        if unit_mib == self._inventory.unit_mib or self.ledger.entries:
            return False
        self._inventory = Inventory.from_devices(
            [d.device for d in self._inventory.devices], unit_mib
        )
        self.ledger.unit_mib = unit_mib
        return True

    def usage(self) -> dict[str, DeviceUsage]:
        return self.ledger.usage(self._inventory)

    def inventory_view(self, node: str) -> InventoryAnnotation:
        """Content of the node's inventory annotation (used = held + reserved)."""
        usage = self.usage()
        return InventoryAnnotation(
            node,
            self._inventory.unit_mib,
            tuple(
                InventoryDevice(
                    d.uuid,
                    d.index,
                    d.model,
                    d.memory_units,
                    usage[d.uuid].memory_used,
                    d.cores,
                    usage[d.uuid].cores_used,
                    d.healthy,
                    d.numa_node,
                )
                for d in self._inventory.devices
            ),
        )

    def inventory_document(self, node: str, unit_mib: int | None = None) -> InventoryAnnotation:
        """Alias of ``inventory_view`` (the unit size is the inventory's)."""
        return self.inventory_view(node)

    def assignment_document(self, namespace: str, name: str) -> PodAssignment | None:
        return self.assignment_of(namespace, name)

    def assignment_of(self, namespace: str, name: str) -> PodAssignment | None:
        """Content of the pod's assignment annotation; None when we hold nothing for it."""
        entries = self.ledger.pod_entries((namespace, name))
        if not entries:
            return None
        return PodAssignment(
            {e.ref.container_name: ContainerAssignment(e.shares, e.source.value) for e in entries}
        )

    # ------------------------------------------------------------------ context
    def context_needs(self, pr: PodResourcesView) -> list[PodKey]:
        """Pods whose PodView the agent must fetch: unknown ones, and those with a
        container still missing a resource it requests (being admitted, or a new pod of
        a reused name)."""
        need: list[PodKey] = []
        for p in pr.pods:
            key = (p.namespace, p.name)
            view = self._views.get(key)
            if view is None:
                need.append(key)
                continue
            devs = {c.name: c.devices for c in p.containers}
            for c in view.containers:
                if any(
                    c.request.amount(k) > 0
                    and not devs.get(c.name, {}).get(self.resources.name_of(k))
                    for k in ResourceKind
                ):
                    need.append(key)
                    break
        return need

    def _merge_views(self, pods: Mapping[PodKey, PodView | None] | None) -> None:
        if pods is None:
            return
        for key, view in pods.items():
            if view is None:
                self._views.pop(key, None)
            else:
                self._views[key] = view

    # ------------------------------------------------------------------ GPA
    def preferred(
        self,
        kind: ResourceKind,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        ctx: CallContext,
    ) -> Preferred:
        if size <= 0:
            raise _err("InvalidRequest", f"allocation size must be positive, got {size}")
        self._check_id_count(kind, available, "available")
        self._check_id_count(kind, must_include, "must_include")
        parse_unit_ids(must_include, kind)
        for u in parse_unit_ids(available, kind):
            self._check_unit(u.device, kind, u.index)
        avail = sorted(set(available))
        if len(must_include) > size:
            raise _err(
                "InvalidRequest",
                f"must_include names {len(must_include)} ids but only {size} are requested",
            )
        if size > len(avail):
            raise _err(
                "InvalidRequest",
                f"{size} {kind.value} units requested but only {len(avail)} are available",
            )
        if not set(must_include) <= set(avail):
            missing = sorted(set(must_include) - set(avail))
            raise _err("InvalidRequest", f"must_include ids not in available: {missing[:3]}")
        self._merge_views(ctx.pods)
        self._notes = []
        self._call_pods = _pods_of(ctx.pr)
        notes = self._expired_notes(self.expire_offers(ctx.now))
        notes += self._release_stale(kind, sorted(set(avail) - set(must_include)), None)
        match, reason = self._identify(kind, size, must_include, ctx)
        entry, ambiguity = self._resolve(
            match, reason, kind, size, avail, must_include, ctx.now, notes
        )
        try:
            ids = self._pick_ids(entry, kind, avail, must_include, size)
        except AllocationError as exc:
            exc.ref = exc.ref or (None if entry.degraded else entry.ref)
            raise
        entry = entry.with_offer(kind, ids, ctx.now)
        self.ledger.put(entry)
        notes.extend(self._drain_notes())
        return Preferred(ids, entry, entry.source, tuple(notes), ambiguity)

    # ------------------------------------------------------------------ Allocate
    def has_offer(self, kind: ResourceKind, ids: Sequence[str]) -> bool:
        """True when ``ids`` are exactly what our last GetPreferredAllocation offered an
        entry: ``allocate`` then needs no PodResources/API facts (the agent skips them)."""
        idset = set(ids)
        return any(
            not e.allocated(kind) and set(e.offered(kind)) == idset
            for e in self.ledger.entries
            if e.offered(kind)
        )

    def allocate(self, kind: ResourceKind, ids: Sequence[str], ctx: CallContext) -> Allocation:
        if not ids:
            raise _err("InvalidRequest", "Allocate named no device ids")
        self._check_id_count(kind, ids, "Allocate")
        if len(set(ids)) != len(ids):
            raise _err("InvalidRequest", "Allocate named a device id twice")
        for u in parse_unit_ids(ids, kind):
            self._check_unit(u.device, kind, u.index)
            if not self._inventory.require(u.device).healthy:
                raise _err("DeviceUnhealthy", f"device {u.device} is unhealthy")
        self._merge_views(ctx.pods)
        self._notes = []
        self._call_pods = _pods_of(ctx.pr)
        ambiguity = 0
        idset = set(ids)
        entry = next(
            (
                e
                for e in self.ledger.entries
                if not e.allocated(kind) and e.offered(kind) and set(e.offered(kind)) == idset
            ),
            None,
        )
        # The Allocate of an offer is honoured even when late; other stale offers go.
        notes = self._expired_notes(
            self.expire_offers(ctx.now, keep=entry.ref if entry is not None else None)
        )
        if entry is None:
            match, reason = self._identify(kind, len(ids), ids, ctx)
            entry, ambiguity = self._resolve(
                match, reason, kind, len(ids), sorted(ids), ids, ctx.now, notes
            )
        try:
            entry = self._validate_allocate(entry, kind, list(ids), notes)
        except AllocationError as exc:
            exc.ref = exc.ref or (None if entry.degraded else entry.ref)
            raise
        entry = entry.with_ids(kind, ids, ctx.now)
        self.ledger.put(entry)
        notes.extend(self._drain_notes())
        return Allocation(
            entry, entry.state is EntryState.COMPLETE, entry.source, tuple(notes), ambiguity
        )

    # ------------------------------------------------------------------ reconcile
    def reconcile(
        self,
        pr: PodResourcesView | None,
        pods: Mapping[PodKey, PodView | None] | None,
        now: float,
    ) -> ReconcileResult:
        """Align the ledger with what the kubelet holds. See docs/allocation.md.
        Abandoned offers expire even when PodResources is unreachable (``pr`` None)."""
        released: list[ContainerRef] = self.expire_offers(now)
        if pr is None:
            return ReconcileResult(released=tuple(released))
        self._merge_views(pods)
        adopted: list[ContainerRef] = []
        attributed: list[ContainerRef] = []
        corrected: list[ContainerRef] = []
        waiting: list[PodKey] = []
        in_pr: set[PodKey] = set()
        for p in pr.pods:
            key = (p.namespace, p.name)
            in_pr.add(key)
            self.ledger.absent_since.pop(key, None)
            view = self._views.get(key)
            for c in p.containers:
                held = {
                    k: tuple(sorted(c.devices.get(self.resources.name_of(k), ())))
                    for k in ResourceKind
                }
                if not any(held.values()):
                    continue
                try:
                    for k in ResourceKind:
                        parse_unit_ids(held[k], k)
                except AllocationError:
                    continue  # not our ids (should not happen): ignore
                uid = view.uid if view is not None else ""
                order, ckind, request = self._spec_of(view, c.name)
                entry = self.ledger.find(p.namespace, p.name, c.name, uid)
                deg = self._degraded_holding(held)
                if deg is not None:
                    # Its ids are this container's: the blind decision is now named.
                    self.ledger.remove(deg.ref)
                    attributed.append(ContainerRef(p.namespace, p.name, c.name, uid))
                if entry is None:
                    ref = ContainerRef(p.namespace, p.name, c.name, uid)
                    if deg is None:
                        adopted.append(ref)
                    req = request or ContainerRequest(
                        len(held[ResourceKind.MEMORY]), len(held[ResourceKind.CORE])
                    )
                    entry = LedgerEntry(
                        ref=ref,
                        request=req,
                        shares=self._shares_from_ids(held, req),
                        source=EntrySource.RECONCILED,
                        created_at=now,
                        updated_at=now,
                        container_kind=ckind,
                        order=order,
                        memory_ids=held[ResourceKind.MEMORY],
                        core_ids=held[ResourceKind.CORE],
                    )
                    self.ledger.put(entry)
                    continue
                changed = False
                if uid and not entry.ref.pod_uid:
                    self.ledger.remove(entry.ref)
                    entry = replace(entry, ref=replace(entry.ref, pod_uid=uid))
                    changed = True
                if request is not None and entry.request != request:
                    entry = replace(entry, request=request, order=order, container_kind=ckind)
                    changed = True
                for k in ResourceKind:
                    if held[k] and tuple(sorted(entry.ids(k))) != held[k]:
                        entry = entry.with_ids(k, held[k], now)
                        changed = True
                if changed:
                    entry = replace(
                        entry,
                        shares=self._shares_from_ids(
                            {k: entry.ids(k) for k in ResourceKind}, entry.request, entry.shares
                        ),
                    )
                    corrected.append(entry.ref)
                    self.ledger.put(entry)
        # Degraded entries: drop ids the kubelet gave to someone else; expire old ones.
        for e in self.ledger.entries:
            if not e.degraded:
                continue
            if now - e.updated_at >= self.release_grace_s:
                self.ledger.remove(e.ref)
                released.append(e.ref)
        # Pods the kubelet no longer lists.
        for key in sorted(self.ledger.pod_keys() - in_pr):
            entries = self.ledger.pod_entries(key)
            if not entries or entries[0].degraded:
                continue
            view_known = pods is not None and key in pods
            view = pods.get(key) if pods is not None else None
            # A different uid means our pod is gone and a new one took its name; an
            # unknown uid ("") proves nothing.
            replaced = view is not None and all(
                e.ref.pod_uid and e.ref.pod_uid != view.uid for e in entries
            )
            gone = view_known and (view is None or view.terminal or replaced)
            since = self.ledger.absent_since.setdefault(key, now)
            if gone or now - since >= self.release_grace_s:
                released.extend(self.ledger.release_pod(key))
                self._views.pop(key, None)
            else:
                waiting.append(key)
        return ReconcileResult(
            tuple(released), tuple(adopted), tuple(attributed), tuple(corrected), tuple(waiting)
        )

    def expire_offers(self, now: float, keep: ContainerRef | None = None) -> list[ContainerRef]:
        """Release decisions that hold no unit yet and whose last offer is at least
        ``offer_ttl_s`` old (all but ``keep``). Without this, offers made while
        PodResources is down (which reconcile cannot judge) would reserve units for good."""
        expired = [
            e.ref
            for e in self.ledger.entries
            if e.ref != keep
            and e.state is EntryState.DECIDED
            and now - e.updated_at >= self.offer_ttl_s
        ]
        for ref in expired:
            self.ledger.remove(ref)
        return expired

    def release_pod(self, namespace: str, name: str) -> list[ContainerRef]:
        """Release at once (the agent saw the pod deleted/terminal)."""
        self._views.pop((namespace, name), None)
        return self.ledger.release_pod((namespace, name))

    # ------------------------------------------------------------------ internals
    def _check_id_count(self, kind: ResourceKind, ids: Sequence[str], what: str) -> None:
        """More ids than we advertise units of ``kind`` cannot be a kubelet call: refuse
        before parsing them."""
        limit = sum(d.total(kind) for d in self._inventory.devices)
        if len(ids) > limit:
            raise _err(
                "InvalidRequest",
                f"{what} names {len(ids)} {kind.value} ids; this node advertises {limit}",
            )

    @staticmethod
    def _expired_notes(refs: Sequence[ContainerRef]) -> list[str]:
        return [f"released expired offer of {r}" for r in refs]

    def _check_unit(self, device: str, kind: ResourceKind, index: int) -> None:
        if not self._inventory.contains_unit(device, kind, index):
            self._inventory.require(device)
            raise _err("UnknownDevice", f"device {device} has no {kind.value} unit {index}")

    def _release_stale(
        self, kind: ResourceKind, free_ids: Sequence[str], own: PodKey | None
    ) -> list[str]:
        """The kubelet lists as free only ids no active pod holds, so a pod whose ledger
        entries hold one of ``free_ids`` is gone: release it whole (its reservations
        too) before it distorts the accounting."""
        free = set(free_ids)
        stale = sorted(
            {
                e.pod_key
                for e in self.ledger.entries
                if e.pod_key != own and free.intersection(e.ids(kind))
            }
        )
        notes = []
        for key in stale:
            self.ledger.release_pod(key)
            self._views.pop(key, None)
            notes.append(f"released stale pod {key[0]}/{key[1]}: kubelet lists its ids as free")
        return notes

    def _identify(
        self, kind: ResourceKind, size: int, hint: Sequence[str], ctx: CallContext
    ) -> tuple[identity.IdentityMatch | None, str]:
        if ctx.pr is None:
            return None, "PodResources unreachable"
        if ctx.pods is None:
            return None, "API server unreachable"
        match = identity.resolve(kind, size, hint, ctx.pr, self._views, self.ledger, self.resources)
        if match is None:
            return None, f"no active pod has a container waiting for {size} {kind.value} units"
        return match, ""

    def _spec_of(
        self, view: PodView | None, container: str
    ) -> tuple[int, ContainerKind, ContainerRequest | None]:
        if view is not None:
            for i, c in enumerate(view.containers):
                if c.name == container:
                    return i, c.kind, c.request
        return -1, ContainerKind.APP, None

    def _degraded_holding(self, held: Mapping[ResourceKind, Sequence[str]]) -> LedgerEntry | None:
        for e in self.ledger.entries:
            if not e.degraded:
                continue
            ks = [k for k in ResourceKind if e.ids(k)]
            if ks and all(set(e.ids(k)) <= set(held[k]) for k in ks):
                return e
        return None

    def _shares_from_ids(
        self,
        held: Mapping[ResourceKind, Sequence[str]],
        request: ContainerRequest,
        previous: Sequence[DeviceShare] = (),
    ) -> tuple[DeviceShare, ...]:
        mem = count_by_device(held[ResourceKind.MEMORY])
        cores = count_by_device(held[ResourceKind.CORE])
        devices = list(dict.fromkeys([*cores, *mem, *(s.device for s in previous)]))
        exclusive = request.cores >= CORES_PER_DEVICE
        out = []
        for d in devices:
            # Not yet allocated dimension: keep the decided amount on that device.
            prev = next((s for s in previous if s.device == d), None)
            m = mem.get(d, 0) if held[ResourceKind.MEMORY] else (prev.memory_units if prev else 0)
            c = cores.get(d, 0) if held[ResourceKind.CORE] else (prev.cores if prev else 0)
            if len(devices) == 1:
                m = m or (request.memory_units if not held[ResourceKind.MEMORY] else m)
                c = c or (request.cores if not held[ResourceKind.CORE] else c)
            out.append(DeviceShare(d, m, c, exclusive))
        return tuple(out)

    def _validate_request(self, req: ContainerRequest, who: str) -> None:
        if req.memory_units < 0 or req.cores < 0:
            raise _err("InvalidRequest", f"{who}: negative request {req}")
        if req.empty:
            raise _err("InvalidRequest", f"{who}: requests none of our resources")
        if req.cores > CORES_PER_DEVICE and req.cores % CORES_PER_DEVICE:
            raise _err(
                "InvalidRequest",
                f"{who}: {req.cores} cores is more than one device but not a multiple of "
                f"{CORES_PER_DEVICE}",
            )

    def _entry_for(
        self,
        match: identity.IdentityMatch,
        kind: ResourceKind,
        available: Sequence[str],
        must_include: Sequence[str],
        now: float,
    ) -> LedgerEntry:
        """The container's decision: the existing one, or a new one from its full request."""
        pod, c = match.pod, match.container
        if match.entry is not None:
            e = match.entry
            if e.request != c.request and e.request.amount(kind) == 0:
                # Adopted without the pod spec: extend the decision on the same device(s).
                e = self._extend(e, kind, c.request.amount(kind), available, now)
                e = replace(e, request=c.request, order=match.order, container_kind=c.kind)
            return e
        ref = ContainerRef(pod.namespace, pod.name, c.name, pod.uid)
        self._validate_request(c.request, str(ref))
        probe = LedgerEntry(
            ref, c.request, (), EntrySource.NODE_AGENT, now, now, c.kind, match.order
        )
        pinned = self._pinned(pod, c.name, now)
        if pinned:
            try:
                shares = self._decide(probe, kind, available, must_include, pinned)
                return replace(probe, shares=shares, source=EntrySource.EXTENDER)
            except AllocationError as exc:
                self._notes.append(
                    f"extender decision for {ref} not followed ({exc.reason}: {exc.message}); "
                    "placing by the node policy"
                )
        shares = self._decide(probe, kind, available, must_include)
        return replace(probe, shares=shares)

    def _resolve(
        self,
        match: identity.IdentityMatch | None,
        reason: str,
        kind: ResourceKind,
        size: int,
        available: Sequence[str],
        must_include: Sequence[str],
        now: float,
        notes: list[str],
    ) -> tuple[LedgerEntry, int]:
        """The entry a call works on (the container's decision, or a degraded one) and
        how many other containers qualified."""
        if match is None:
            notes.append(f"degraded: {reason}")
            return self._degraded_entry(kind, size, available, must_include, now, reason), 0
        try:
            entry = self._entry_for(match, kind, available, must_include, now)
        except AllocationError as exc:
            exc.ref = _ref_of(match)
            raise
        if match.ambiguity:
            notes.append(f"ambiguous: {match.ambiguity} other container(s) qualified")
        return entry, match.ambiguity

    def _drain_notes(self) -> list[str]:
        out, self._notes = self._notes, []
        return out

    def _pinned(self, pod: PodView, container: str, now: float) -> tuple[str, ...] | None:
        """Devices the extender chose for ``container``, if its decision verifies."""
        text = pod.annotations.get(decision_key(self.resources.memory.split("/", 1)[0]))
        if not text or self.decision_key is None:
            return None
        try:
            d = verify(text, self.decision_key, pod, now, node=self.node_name or None)
        except DecisionError as exc:
            self._notes.append(
                f"extender decision on {pod.namespace}/{pod.name} rejected "
                f"({exc.reason}: {exc.message}); placing by the node policy"
            )
            return None
        devices = d.devices_of(container)
        return devices or None

    def _extend(
        self,
        e: LedgerEntry,
        kind: ResourceKind,
        amount: int,
        available: Sequence[str],
        now: float,
    ) -> LedgerEntry:
        """Add ``amount`` of ``kind`` to a single-device decision (pairing/adoption)."""
        if (
            len(e.shares) != 1
            or e.exclusive
            or (kind is ResourceKind.CORE and amount >= CORES_PER_DEVICE)
        ):
            raise _err("NoFit", f"{e.ref}: cannot add {amount} {kind.value} units to its decision")
        s = e.shares[0]
        free = self._free(s.device, kind, available, e)
        if free < amount:
            raise _err(
                "NoFit",
                f"{e.ref}: device {s.device} has only {free} free {kind.value} units, "
                f"{amount} needed",
            )
        ns = (
            replace(s, memory_units=amount)
            if kind is ResourceKind.MEMORY
            else replace(s, cores=amount)
        )
        m = amount if kind is ResourceKind.MEMORY else e.request.memory_units
        c = amount if kind is ResourceKind.CORE else e.request.cores
        return replace(e, shares=(ns,), request=ContainerRequest(m, c), updated_at=now)

    def _free(
        self, device: str, kind: ResourceKind, available: Sequence[str] | None, e: LedgerEntry
    ) -> int:
        """Free ``kind`` units of ``device`` for entry ``e`` (its reuse pool counts as
        free); for the kind of the current call also capped by the kubelet's list."""
        d = self._inventory.require(device)
        usage = self.usage()[device]
        if usage.exclusive_pods - {e.pod_key}:
            return 0
        pool = [u for u in self.ledger.reuse_pool(e, kind) if u.startswith(device + "::")]
        free = d.total(kind) - usage.used(kind) + len(pool)
        if available is not None:
            on_dev = sum(1 for a in available if a.startswith(device + "::"))
            free = min(free, on_dev)
        return max(0, free)

    def _decide(
        self,
        e: LedgerEntry,
        kind: ResourceKind,
        available: Sequence[str],
        must_include: Sequence[str],
        pinned: Sequence[str] | None = None,
    ) -> tuple[DeviceShare, ...]:
        """Choose the container's device(s). ``pinned``: only these devices (the
        extender's decision); NoFit when they cannot hold it."""
        req = e.request
        forced = list(dict.fromkeys(u.device for u in parse_unit_ids(must_include)))
        if pinned:
            unknown = [p for p in pinned if self._inventory.get(p) is None]
            if unknown:
                raise _err("UnknownDevice", f"{e.ref}: decision names unknown devices {unknown}")
            if req.cores < CORES_PER_DEVICE and len(pinned) != 1:
                raise _err("SplitAcrossDevices", f"{e.ref}: decision names {len(pinned)} devices")
            if any(f not in pinned for f in forced):
                raise _err("DecisionMismatch", f"{e.ref}: reused ids are not on {list(pinned)}")
        usage = self.usage()
        pools = {k: self.ledger.reuse_pool(e, k) for k in ResourceKind}
        # The kubelet will hand this container pooled ids of every kind it requests
        # (later calls, without asking us): their device must be part of the decision.
        for k in ResourceKind:
            pool_devs = {x.split("::")[0] for x in pools[k]}
            if req.amount(k) > 0 and len(pool_devs) == 1:
                forced = list(dict.fromkeys([*forced, *pool_devs]))
        healthy = [d for d in self._inventory.devices if d.healthy]
        if req.cores >= CORES_PER_DEVICE:
            if pinned:
                if len(pinned) != req.cores // CORES_PER_DEVICE:
                    raise _err("DecisionMismatch", f"{e.ref}: decision names {len(pinned)} "
                               f"devices for {req.cores} cores")
                forced = list(dict.fromkeys([*forced, *pinned]))
            return self._decide_exclusive(e, kind, available, forced, usage, healthy)
        if pinned:
            forced = [pinned[0]]
        if len(forced) > 1:
            raise _err(
                "SplitAcrossDevices",
                f"{e.ref}: reused ids span devices {forced}; one container needs one device",
            )
        states: list[DeviceState] = []
        best_mem, best_core = 0, 0
        for d in healthy:
            u = usage[d.uuid]
            if u.exclusive_pods - {e.pod_key}:
                continue
            free = {}
            for k in ResourceKind:
                pool = sum(1 for x in pools[k] if x.startswith(d.uuid + "::"))
                free[k] = d.total(k) - u.used(k) + pool
            on_dev = sum(1 for a in available if a.startswith(d.uuid + "::"))
            free[kind] = min(free[kind], on_dev)
            st = DeviceState(
                d.uuid,
                d.index,
                d.numa_node,
                d.memory_units,
                free[ResourceKind.MEMORY],
                d.cores,
                free[ResourceKind.CORE],
            )
            best_mem = max(best_mem, st.memory_free)
            best_core = max(best_core, st.cores_free)
            if forced and d.uuid != forced[0]:
                continue
            if st.memory_free >= req.memory_units and st.cores_free >= req.cores:
                states.append(st)
        # Prefer devices the pod's reuse pool is on: the kubelet may hand any pooled ids.
        pool_devs = {x.split("::")[0] for k in ResourceKind for x in pools[k]}
        preferred_states = [s for s in states if s.uuid in pool_devs] or states
        chosen = self.policy.choose(preferred_states, req.memory_units, req.cores)
        if chosen is None:
            where = f"device {forced[0]} (holding reused ids)" if forced else "no single device"
            raise _err(
                "NoFit",
                f"{e.ref}: {where} has {req.memory_units} free memory units and "
                f"{req.cores} free cores; largest free block is {best_mem} memory units "
                f"/ {best_core} cores",
            )
        return (DeviceShare(chosen.uuid, req.memory_units, req.cores, False),)

    def _decide_exclusive(
        self,
        e: LedgerEntry,
        kind: ResourceKind,
        available: Sequence[str],
        forced: list[str],
        usage: Mapping[str, DeviceUsage],
        healthy: Sequence[DeviceCapacity],
    ) -> tuple[DeviceShare, ...]:
        req = e.request
        n = req.cores // CORES_PER_DEVICE
        free: list[DeviceState] = []
        for d in healthy:
            u = usage[d.uuid]
            if u.pods - {e.pod_key}:
                continue  # someone else holds or reserves part of it
            free.append(
                DeviceState(
                    d.uuid, d.index, d.numa_node, d.memory_units, d.memory_units, d.cores, d.cores
                )
            )
        free_ids = {s.uuid for s in free}
        bad = [f for f in forced if f not in free_ids]
        if bad or len(forced) > n:
            raise _err(
                "ExclusiveConflict" if bad else "SplitAcrossDevices",
                f"{e.ref}: reused ids on {forced} cannot all be part of {n} whole device(s)",
            )
        rest = [s for s in free if s.uuid not in forced]
        numa = {s.numa_node for s in free if s.uuid in forced}
        if len(numa) == 1:
            same = [s for s in rest if s.numa_node in numa]
            if len(same) >= n - len(forced):
                rest = same
        extra = choose_whole_devices(rest, n - len(forced)) if n > len(forced) else []
        if extra is None:
            raise _err(
                "NoFit",
                f"{e.ref}: {req.cores} cores need {n} wholly free healthy devices; "
                f"{len(free)} are free",
            )
        chosen = [self._inventory.require(u) for u in forced] + [
            self._inventory.require(s.uuid) for s in extra
        ]
        chosen.sort(key=lambda d: d.index)
        total_mem = sum(d.memory_units for d in chosen)
        if req.memory_units > total_mem:
            raise _err(
                "NoFit",
                f"{e.ref}: {req.memory_units} memory units exceed the {total_mem} of "
                f"{n} whole device(s)",
            )
        # Memory ids fill the first device before the next: if an app container later
        # reuses some of them, the kubelet's pick then stays on one device.
        shares = []
        left = req.memory_units
        for d in chosen:
            take = min(d.memory_units, left)
            shares.append(DeviceShare(d.uuid, take, CORES_PER_DEVICE, True))
            left -= take
        return tuple(shares)

    def _degraded_entry(
        self,
        kind: ResourceKind,
        size: int,
        available: Sequence[str],
        must_include: Sequence[str],
        now: float,
        reason: str,
    ) -> LedgerEntry:
        if self.degraded_mode == "refuse":
            raise IdentityError(
                f"cannot tell which container asks for {size} {kind.value} units: {reason}"
            )
        # Pair with the immediately preceding unattributed decision of the other kind.
        latest = max(
            (e for e in self.ledger.entries if e.degraded),
            key=lambda e: e.updated_at,
            default=None,
        )
        forced = {u.device for u in parse_unit_ids(must_include)}
        if (
            latest is not None
            and now - latest.updated_at < self.pairing_window_s
            and latest.request.amount(kind) == 0
            and not latest.exclusive
            and len(latest.shares) == 1
            and (not forced or forced == {latest.shares[0].device})
            and self._same_pod_admission(latest.ref)
        ):
            try:
                return self._extend(latest, kind, size, available, now)
            except AllocationError:
                pass
        req = (
            ContainerRequest(memory_units=size)
            if kind is ResourceKind.MEMORY
            else ContainerRequest(cores=size)
        )
        ref = self.ledger.next_synthetic_ref(kind)
        self._validate_request(req, str(ref))
        self._blind_pods = {
            r: ps for r, ps in self._blind_pods.items() if self.ledger.get(r) is not None
        }
        if self._call_pods is not None:
            self._blind_pods[ref] = self._call_pods
        probe = LedgerEntry(ref, req, (), EntrySource.DEGRADED, now, now)
        return replace(probe, shares=self._decide(probe, kind, available, must_include))

    def _same_pod_admission(self, ref: ContainerRef) -> bool:
        """No pod appeared in PodResources since the blind decision ``ref``: the kubelet
        admits one pod at a time and lists it before admitting it, so a new pod means
        this call is for a later pod, whose container must not take over (and be told)
        ``ref``'s other resource. Unknown (PodResources unreachable): pair as before."""
        then = self._blind_pods.get(ref)
        now = self._call_pods
        return then is None or now is None or now <= then

    def _pick_ids(
        self,
        e: LedgerEntry,
        kind: ResourceKind,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
    ) -> list[str]:
        devices = e.devices
        for m in parse_unit_ids(must_include):
            if m.device not in devices:
                raise _err(
                    "DecisionMismatch",
                    f"{e.ref}: reused id {m} is not on its decided device(s) {list(devices)}",
                )
        want = {
            s.device: (s.memory_units if kind is ResourceKind.MEMORY else s.cores) for s in e.shares
        }
        if sum(want.values()) != size:
            if len(devices) == 1:
                want = {devices[0]: size}
            else:
                raise _err(
                    "DecisionMismatch",
                    f"{e.ref}: {size} {kind.value} units asked, decision has {sum(want.values())}",
                )
        chosen: list[str] = list(dict.fromkeys(must_include))
        by_dev = group_by_device(available)
        taken = set(chosen)
        for d in devices:
            have = sum(1 for x in chosen if x.startswith(d + "::"))
            for u in by_dev.get(d, []):
                if have >= want[d] or len(chosen) >= size:
                    break
                s = str(u)
                if s not in taken:
                    chosen.append(s)
                    taken.add(s)
                    have += 1
        if len(chosen) < size and e.exclusive:
            # Exclusive: any unit of the owned devices will do.
            for d in devices:
                for u in by_dev.get(d, []):
                    if len(chosen) >= size:
                        break
                    if str(u) not in taken:
                        chosen.append(str(u))
                        taken.add(str(u))
        if len(chosen) != size:
            raise _err(
                "NoFit",
                f"{e.ref}: decided device(s) {list(devices)} have only {len(chosen)} of the "
                f"{size} {kind.value} units the kubelet lists as available",
            )
        return chosen

    def _validate_allocate(
        self, e: LedgerEntry, kind: ResourceKind, ids: list[str], notes: list[str]
    ) -> LedgerEntry:
        by_dev = count_by_device(ids)
        devices = set(e.devices)
        if not e.exclusive and len(by_dev) > 1:
            raise _err(
                "SplitAcrossDevices",
                f"{e.ref}: {kind.value} ids span devices {sorted(by_dev)}; one container "
                "needs one device",
            )
        if not set(by_dev) <= devices:
            raise _err(
                "DecisionMismatch",
                f"{e.ref}: decided device(s) {sorted(devices)}, kubelet allocated "
                f"{kind.value} units on {sorted(set(by_dev) - devices)}",
            )
        want = e.request.amount(kind)
        if len(ids) != want:
            raise _err(
                "DecisionMismatch",
                f"{e.ref}: decision has {want} {kind.value} units, kubelet allocated {len(ids)}",
            )
        usage = self.usage()
        for d in by_dev:
            others = usage[d].exclusive_pods - {e.pod_key}
            if others:
                raise _err(
                    "ExclusiveConflict",
                    f"{e.ref}: device {d} is held exclusively by {sorted(others)[0]}",
                )
            if e.exclusive:
                other_holders = {
                    h.pod_key
                    for k in ResourceKind
                    for h in self.ledger.entries
                    if h.pod_key != e.pod_key and any(x.startswith(d + "::") for x in h.ids(k))
                }
                if other_holders:
                    raise _err(
                        "ExclusiveConflict",
                        f"{e.ref}: device {d} must be exclusive but "
                        f"{sorted(other_holders)[0]} holds part of it",
                    )
        notes.extend(self._release_stale(kind, ids, e.pod_key))
        if e.exclusive and kind is ResourceKind.MEMORY:
            e = replace(
                e,
                shares=tuple(replace(s, memory_units=by_dev.get(s.device, 0)) for s in e.shares),
            )
        return e
