"""AllocationEngine: the single entry point the agent calls (under its lock).

Pure: no I/O, no clock (``now`` is passed in), no logging (results carry notes).
Orchestration only; each step lives in its own module:

* ``validate`` -- arguments of kubelet calls, requests, what the kubelet allocated
* ``identity`` -- which container a call is for; ``degraded`` -- when that is unknown
* ``choose`` -- device choice (``decide``: shared / exclusive, ``extend``) over a
  ``freeview.FreeView``; ``pick`` -- which unit ids to offer
* ``reconcile`` -- adopt / expire / release against PodResources
* ``views`` -- pod specs seen; ``notes`` -- typed facts for the agent

See docs/allocation.md for the algorithm and docs/architecture.md for the call path.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Literal

from gpu_share.config.model import PlacementPolicyName
from gpu_share.errors import AllocationError, AllocationReason, IdentityError
from gpu_share.sharing.decision import DecisionError, under_any_key, verify
from gpu_share.sharing.decision import decision_key as annotation_key
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import (
    AdvertisedDevice,
    ContainerRef,
    ContainerRequest,
    DeviceShare,
    PodResourcesView,
    PodView,
    ResourceKind,
    ResourceNames,
)
from gpu_share.sharing.node import choose, identity, reconcile
from gpu_share.sharing.node.degraded import BlindChoice, BlindPairing
from gpu_share.sharing.node.device_policy import PlacementPolicy, get_policy
from gpu_share.sharing.node.ledger import (
    DeviceUsage,
    EntrySource,
    EntryState,
    Ledger,
    LedgerEntry,
    PodKey,
)
from gpu_share.sharing.node.notes import Note, NoteKind
from gpu_share.sharing.node.pick import pick_ids
from gpu_share.sharing.node.results import Allocation, CallContext, Preferred, ReconcileResult
from gpu_share.sharing.node.validate import (
    check_allocate,
    check_allocated,
    check_preferred,
    check_request,
)
from gpu_share.sharing.node.views import PodViews

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
        previous_decision_keys: tuple[bytes, ...] = (),
        node_name: str = "",
        offer_ttl_s: float = DEFAULT_OFFER_TTL_S,
    ) -> None:
        self._inventory = inventory
        self.ledger = ledger
        self.resources = resources
        self.policy = policy if not isinstance(policy, str) else get_policy(policy)
        self.degraded_mode: DegradedMode = degraded_mode
        self.release_grace_s = release_grace_s
        self.offer_ttl_s = offer_ttl_s
        self._views = PodViews()
        self._admitted = identity.AdmittedPods()  # pods identity need not look into
        self._blind = BlindPairing(pairing_window_s)
        # Key of the extender's signed decisions; None: decisions are ignored.
        self.decision_key = decision_key
        # Keys before the last rotation: their decisions are still followed (rollout).
        self.previous_decision_keys = previous_decision_keys
        self.node_name = node_name
        self._decision_annotation = annotation_key(resources.domain)
        self._notes: list[Note] = []  # facts found while deciding, drained per call
        # has_offer's answer, for the allocate right after it (one scan per Allocate).
        self._offer_hit: LedgerEntry | None = None

    @property
    def pairing_window_s(self) -> float:
        return self._blind.window_s

    @pairing_window_s.setter
    def pairing_window_s(self, value: float) -> None:
        self._blind.window_s = value

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

    def set_cordons(self, uuids: Collection[str]) -> bool:
        """Cordon exactly these devices (unknown uuids are ignored); True when the set
        changed (the agent then bumps ListAndWatch and republishes)."""
        new = self._inventory.with_cordons(uuids)
        if new.cordoned == self._inventory.cordoned:
            return False
        self._inventory = new
        return True

    def set_unit_mib(self, unit_mib: int) -> bool:
        """Cut memory into units of ``unit_mib`` from now on. Only while the ledger is
        empty (ids and amounts of another size would be misread); True when changed."""
        if unit_mib == self._inventory.unit_mib or self.ledger.entries:
            return False
        self._inventory = Inventory.from_devices(
            [d.device for d in self._inventory.devices], unit_mib
        ).with_cordons(self._inventory.cordoned)
        self.ledger.unit_mib = unit_mib
        return True

    def usage(self) -> dict[str, DeviceUsage]:
        return self.ledger.usage(self._inventory)

    # ------------------------------------------------------------------ context
    def context_needs(self, pr: PodResourcesView) -> list[PodKey]:
        """Pods whose PodView the agent must fetch (``views.PodViews.needs``)."""
        return self._views.needs(pr, self.resources)

    # ------------------------------------------------------------------ GPA
    def preferred(self, kind: ResourceKind, available: Sequence[str],
                  must_include: Sequence[str], size: int, ctx: CallContext) -> Preferred:
        avail = check_preferred(self._inventory, kind, available, must_include, size)
        notes = self._begin(ctx, keep=None)
        notes += self._release_stale(kind, avail.members.difference(must_include), None)
        entry, ambiguity = self._entry(kind, size, avail, must_include, ctx, notes)
        avoid = self.ledger.offered_to_others(kind, entry.ref)
        ids = pick_ids(entry, kind, avail, must_include, size, avoid)
        entry = entry.with_offer(kind, ids, ctx.now)
        self.ledger.put(entry)
        notes.extend(self._drain_notes())
        return Preferred(ids, entry, entry.source, tuple(notes), ambiguity)

    # ------------------------------------------------------------------ Allocate
    def has_offer(self, kind: ResourceKind, ids: Sequence[str]) -> bool:
        """True when ``ids`` are exactly what our last GetPreferredAllocation offered an
        entry: ``allocate`` then needs no PodResources/API facts (the agent skips them)."""
        self._offer_hit = self._find_offer(kind, ids)
        return self._offer_hit is not None

    def allocate(self, kind: ResourceKind, ids: Sequence[str], ctx: CallContext) -> Allocation:
        check_allocate(self._inventory, kind, ids)
        entry = self._offer_for(kind, ids)
        # The Allocate of an offer is honoured even when late; other stale offers go.
        notes = self._begin(ctx, keep=entry.ref if entry is not None else None)
        ambiguity = 0
        if entry is None:
            entry, ambiguity = self._entry(kind, len(ids), sorted(ids), ids, ctx, notes)
        entry = check_allocated(entry, kind, ids, self._inventory, self.ledger)
        notes.extend(self._release_stale(kind, ids, entry.pod_key))
        entry = entry.with_ids(kind, ids, ctx.now)
        self.ledger.put(entry)
        notes.extend(self._drain_notes())
        return Allocation(
            entry, entry.state is EntryState.COMPLETE, entry.source, tuple(notes), ambiguity
        )

    # ------------------------------------------------------------------ reconcile
    def reconcile(self, pr: PodResourcesView | None,
                  pods: Mapping[PodKey, PodView | None] | None, now: float) -> ReconcileResult:
        """Align the ledger with what the kubelet holds. See docs/allocation.md.
        Abandoned offers expire even when PodResources is unreachable (``pr`` None)."""
        released = self.expire_offers(now)
        if pr is None:
            return ReconcileResult(released=tuple(released))
        self._views.merge(pods)
        found = reconcile.adopt(self.ledger, pr, self._views.views, self.resources, now)
        self._blind.renamed(found.renamed)
        released += reconcile.expire_degraded(self.ledger, now, self.release_grace_s)
        gone, gone_pods, waiting = reconcile.release_absent(
            self.ledger, found.present, pods, now, self.release_grace_s
        )
        released += gone
        for key in gone_pods:
            self._views.drop(key)
        self._views.prune({(p.namespace, p.name) for p in pr.pods}
                          | {e.pod_key for e in self.ledger.unordered()})
        return ReconcileResult(
            tuple(released),
            tuple(found.adopted),
            tuple(found.attributed),
            tuple(found.corrected),
            tuple(waiting),
        )

    def expire_offers(self, now: float, keep: ContainerRef | None = None) -> list[ContainerRef]:
        """Release decisions without any unit whose offer is ``offer_ttl_s`` old."""
        self._offer_hit = None
        return reconcile.expire_offers(self.ledger, now, self.offer_ttl_s, keep)

    def release_pod(self, namespace: str, name: str) -> list[ContainerRef]:
        """Release at once (the agent saw the pod deleted/terminal)."""
        self._offer_hit = None
        self._views.drop((namespace, name))
        return self.ledger.release_pod((namespace, name))

    # ------------------------------------------------------------------ internals
    def _find_offer(self, kind: ResourceKind, ids: Sequence[str]) -> LedgerEntry | None:
        return self.ledger.open_offer(kind, ids)

    def _offer_for(self, kind: ResourceKind, ids: Sequence[str]) -> LedgerEntry | None:
        """``has_offer``'s entry when it is still the ledger's (nothing ran between),
        else a fresh scan."""
        hit, self._offer_hit = self._offer_hit, None
        if (
            hit is not None
            and self.ledger.get(hit.ref) is hit
            and set(hit.offered(kind)) == set(ids)
            and not hit.allocated(kind)
        ):
            return hit
        return self._find_offer(kind, ids)

    def _begin(self, ctx: CallContext, keep: ContainerRef | None) -> list[Note]:
        """Start a kubelet call: take its facts, expire abandoned offers (but ``keep``)."""
        self._views.merge(ctx.pods)
        self._notes = []
        self._blind.begin_call(ctx.pr)
        return [
            Note(NoteKind.OFFER_EXPIRED, f"released expired offer of {r}")
            for r in self.expire_offers(ctx.now, keep=keep)
        ]

    def _drain_notes(self) -> list[Note]:
        out, self._notes = self._notes, []
        return out

    def _release_stale(
        self, kind: ResourceKind, free_ids: Collection[str], own: PodKey | None
    ) -> list[Note]:
        """The kubelet lists as free only ids no active pod holds, so a pod whose ledger
        entries hold one of ``free_ids`` is gone: release it whole (its reservations
        too) before it distorts the accounting."""
        free = free_ids if isinstance(free_ids, set | frozenset) else set(free_ids)
        stale = sorted(
            {
                e.pod_key
                for e in self.ledger.unordered()
                if e.pod_key != own and free.intersection(e.ids(kind))
            }
        )
        for key in stale:
            self.ledger.release_pod(key)
            self._views.drop(key)
        return [
            Note(NoteKind.STALE_RELEASED,
                 f"released stale pod {ns}/{name}: kubelet lists its ids as free")
            for ns, name in stale
        ]

    def _entry(
        self,
        kind: ResourceKind,
        size: int,
        available: Sequence[str],
        must_include: Sequence[str],
        ctx: CallContext,
        notes: list[Note],
    ) -> tuple[LedgerEntry, int]:
        """The entry a call works on (the container's decision, or a degraded one) and
        how many other containers qualified."""
        match, why = self._identify(kind, size, must_include, ctx)
        if match is None and ctx.pr is not None:
            half, others = identity.second_half(kind, size, ctx.pr, self.ledger, self.resources)
            if half is not None:
                notes.append(Note(NoteKind.SECOND_HALF, f"{why.text}; completes {half.ref}, "
                                  f"whose {kind.other.value} was decided with its pod known"))
                return half, others
        if match is None:
            notes.append(Note(why.kind, f"degraded: {why.text}"))
            entry = self._degraded_entry(kind, size, available, must_include, ctx.now, why.text)
            return entry, 0
        if match.entry is None and ctx.pr is not None:
            ref = ContainerRef(match.pod.namespace, match.pod.name, match.container.name,
                               match.pod.uid)
            named = reconcile.attribute_blind(self.ledger, ctx.pr, ref, self.resources, ctx.now)
            if named is not None:
                notes.append(Note(NoteKind.BLIND_ATTRIBUTED,
                                  f"earlier blind decision attributed to {ref}"))
                match = replace(match, entry=named)
        entry = self._entry_for(match, kind, available, must_include, ctx.now)
        if match.ambiguity:
            notes.append(
                Note(NoteKind.AMBIGUOUS,
                     f"ambiguous: {match.ambiguity} other container(s) qualified")
            )
        return entry, match.ambiguity

    def _identify(
        self, kind: ResourceKind, size: int, hint: Sequence[str], ctx: CallContext
    ) -> tuple[identity.IdentityMatch | None, Note]:
        """The call's container, or why it is unknown."""
        if ctx.pr is None:
            return None, Note(NoteKind.DEGRADED_PODRESOURCES, "PodResources unreachable")
        if ctx.pods is None:
            return None, Note(NoteKind.DEGRADED_APISERVER, "API server unreachable")
        match = identity.resolve(
            kind, size, hint, ctx.pr, self._views.views, self.ledger, self.resources,
            self._admitted,
        )
        why = Note(
            NoteKind.DEGRADED_NO_CANDIDATE,
            f"no active pod has a container waiting for {size} {kind.value} units",
        )
        return match, why

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
        check_request(c.request, ref, str(ref))
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
                    Note(NoteKind.EXTENDER_IGNORED,
                         f"extender decision for {ref} not followed ({exc.reason}: "
                         f"{exc.message}); placing by the node policy")
                )
        return replace(probe, shares=self._decide(probe, kind, available, must_include))

    def _pinned(self, pod: PodView, container: str, now: float) -> tuple[str, ...] | None:
        """Devices the extender chose for ``container``, if its decision verifies."""
        text = pod.annotations.get(self._decision_annotation)
        if not text or self.decision_key is None:
            return None
        try:
            d = under_any_key(
                (self.decision_key, *self.previous_decision_keys),
                lambda key: verify(text, key, pod, now, node=self.node_name or None))
        except DecisionError as exc:
            self._notes.append(
                Note(NoteKind.EXTENDER_IGNORED,
                     f"extender decision on {pod.namespace}/{pod.name} rejected "
                     f"({exc.reason}: {exc.message}); placing by the node policy")
            )
            return None
        return d.devices_of(container) or None

    def _degraded_entry(self, kind: ResourceKind, size: int, available: Sequence[str],
                        must_include: Sequence[str], now: float, reason: str) -> LedgerEntry:
        if self.degraded_mode == "refuse":
            raise IdentityError(
                f"cannot tell which container asks for {size} {kind.value} units: {reason}"
            )
        partner = self._blind.partner(self.ledger, kind, must_include, now)
        if partner is not None:
            try:
                return self._extend(partner, kind, size, available, now)
            except AllocationError as exc:
                # Its other half is on that device: another device would split the
                # container (a device it is told of without that kind's limit).
                raise AllocationError(
                    f"{exc.message}; the container's {kind.other.value} was placed there "
                    "while its pod was unknown, and one container needs one device",
                    reason=AllocationReason.SPLIT_ACROSS_DEVICES,
                ) from exc
        req = ContainerRequest().with_amount(kind, size)
        ref = self.ledger.next_synthetic_ref(kind)
        check_request(req, None, str(ref))
        self._blind.remember(ref, self.ledger)
        probe = LedgerEntry(ref, req, (), EntrySource.DEGRADED, now, now)
        blind = BlindChoice(self.policy, kind)
        return replace(
            probe, shares=choose.decide(probe, kind, available, must_include,
                                        self._inventory, self.ledger, blind)
        )

    def _decide(
        self,
        e: LedgerEntry,
        kind: ResourceKind,
        available: Sequence[str],
        must_include: Sequence[str],
        pinned: Sequence[str] | None = None,
    ) -> tuple[DeviceShare, ...]:
        return choose.decide(
            e, kind, available, must_include, self._inventory, self.ledger, self.policy, pinned
        )

    def _extend(
        self, e: LedgerEntry, kind: ResourceKind, amount: int, available: Sequence[str],
        now: float,
    ) -> LedgerEntry:
        return choose.extend(e, kind, amount, available, self._inventory, self.ledger, now)
