"""Degraded ("blind") decisions: a call whose container cannot be named.

A blind decision of one kind may be paired with the next call of the other kind (the
kubelet admits one container's resources back to back), within a time window and only
while no newer pod appeared in PodResources. The first half goes where the other kind,
whose amount the call cannot know, has the most room, so that the second half fits the
same device; when it does not, the engine refuses it rather than split the container.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpu_share.sharing.ids import parse_unit_ids
from gpu_share.sharing.model import ContainerRef, PodResourcesView, ResourceKind
from gpu_share.sharing.node.device_policy import DeviceState, PlacementPolicy
from gpu_share.sharing.node.ledger import Ledger, LedgerEntry, PodKey


class BlindChoice:
    """The node policy for the first half of a blind decision of ``kind``: only among
    the fitting devices with the most free units of the other kind."""

    def __init__(self, inner: PlacementPolicy, kind: ResourceKind) -> None:
        self.name = inner.name
        self._inner = inner
        self._other = kind.other

    def choose(
        self, candidates: Sequence[DeviceState], memory_units: int, cores: int
    ) -> DeviceState | None:
        if not candidates:
            return None
        room = [self._room(d) for d in candidates]
        most = max(room)
        return self._inner.choose(
            [d for d, r in zip(candidates, room, strict=True) if r == most], memory_units, cores
        )

    def _room(self, d: DeviceState) -> int:
        return d.cores_free if self._other is ResourceKind.CORE else d.memory_free


class BlindPairing:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        # The pods PodResources listed at this call (None: unreachable), and at each
        # open blind decision (pairing never crosses into a newer pod).
        self._call_pods: frozenset[PodKey] | None = None
        self._blind_pods: dict[ContainerRef, frozenset[PodKey] | None] = {}
        # Blind decisions in the order they were taken, under their current ref: the
        # reconcile loop may name one from PodResources between a container's two calls.
        self._order: dict[ContainerRef, int] = {}
        self._seq = 0

    def begin_call(self, pr: PodResourcesView | None) -> None:
        self._call_pods = None if pr is None else frozenset((p.namespace, p.name) for p in pr.pods)

    def partner(
        self, ledger: Ledger, kind: ResourceKind, must_include: Sequence[str], now: float
    ) -> LedgerEntry | None:
        """The immediately preceding blind decision of the other kind (degraded still, or
        named since by the reconcile loop), if this call may complete it."""
        latest = max(
            (e for e in ledger.entries if e.degraded or e.ref in self._order),
            key=lambda e: (self._order.get(e.ref, -1), e.updated_at),
            default=None,
        )
        if latest is None:
            return None
        forced = {u.device for u in parse_unit_ids(must_include)}
        ok = (
            self._recent(latest, now)
            and latest.request.amount(kind) == 0
            and not latest.exclusive
            and len(latest.shares) == 1
            and (not forced or forced == {latest.shares[0].device})
            and self._same_pod_admission(latest.ref)
        )
        return latest if ok else None

    def _recent(self, latest: LedgerEntry, now: float) -> bool:
        """The window bounds pairing only while PodResources cannot tell a later pod's
        call: when it answers, ``_same_pod_admission`` does, and a second half that came
        late (a loaded node) must still join its first rather than split the container."""
        listed = self._call_pods is not None and self._blind_pods.get(latest.ref) is not None
        return listed or now - latest.updated_at < self.window_s

    def remember(self, ref: ContainerRef, ledger: Ledger) -> None:
        """A new blind decision ``ref``: note the pods listed now."""
        self._order = {r: n for r, n in self._order.items() if ledger.get(r) is not None}
        self._blind_pods = {r: ps for r, ps in self._blind_pods.items() if r in self._order}
        self._seq += 1
        self._order[ref] = self._seq
        self._blind_pods[ref] = self._call_pods

    def renamed(self, names: Mapping[ContainerRef, ContainerRef]) -> None:
        """Blind decisions PodResources has shown to be these containers' entries."""
        for blind, named in names.items():
            if blind in self._order:
                self._order[named] = self._order.pop(blind)
                self._blind_pods[named] = self._blind_pods.pop(blind, None)

    def _same_pod_admission(self, ref: ContainerRef) -> bool:
        """No pod appeared in PodResources since the blind decision ``ref``: the kubelet
        admits one pod at a time and lists it before admitting it, so a new pod means
        this call is for a later pod, whose container must not take over (and be told)
        ``ref``'s other resource. Unknown (PodResources unreachable): pair as before."""
        then = self._blind_pods.get(ref)
        now = self._call_pods
        return then is None or now is None or now <= then
