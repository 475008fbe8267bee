"""Offers (GetPreferredAllocation answers) that no Allocate follows expire after
``offer_ttl_s``, also while PodResources is unreachable."""

from __future__ import annotations

from gpu_share.sharing.model import PodResourcesView, ResourceKind
from gpu_share.sharing.node.engine import DEFAULT_OFFER_TTL_S, AllocationEngine, CallContext
from gpu_share.sharing.node.ledger import EntryState
from gpu_share.sharing.node.notes import NoteKind
from tests.sharing.helpers import engine

MEM, CORE = ResourceKind.MEMORY, ResourceKind.CORE
TTL = DEFAULT_OFFER_TTL_S


def _blind(t: float) -> CallContext:
    return CallContext(pr=None, pods=None, now=t)  # PodResources unreachable


def _ids(kind: ResourceKind) -> list[str]:
    tag = "mem" if kind is MEM else "core"
    n = 8 if kind is MEM else 100
    return [f"GPU-{d}::{tag}::{i}" for d in range(3) for i in range(n)]


def _used(e: AllocationEngine, kind: ResourceKind) -> int:
    return sum(u.used(kind) for u in e.usage().values())


def _three_blind_offers(e: AllocationEngine) -> None:
    e.preferred(MEM, _ids(MEM), [], 4, _blind(0.0))
    e.preferred(MEM, _ids(MEM), [], 3, _blind(1.0))
    e.preferred(MEM, _ids(MEM), [], 3, _blind(2.0))


def test_offers_without_allocate_expire_on_reconcile_while_podresources_is_down() -> None:
    """The issue's repro: 3 calls reserved 10 units for good."""
    e = engine()
    _three_blind_offers(e)
    assert _used(e, MEM) == 10
    r = e.reconcile(None, None, TTL - 1)
    assert not r.released and _used(e, MEM) == 10  # not yet
    r = e.reconcile(None, None, 2.0 + TTL)
    assert len(r.released) == 3 and r.changed
    assert _used(e, MEM) == 0 and e.ledger.entries == []


def test_the_next_call_releases_expired_offers() -> None:
    e = engine()
    _three_blind_offers(e)
    p = e.preferred(MEM, _ids(MEM), [], 2, _blind(2.0 + TTL))
    assert sum(n.kind is NoteKind.OFFER_EXPIRED for n in p.notes) == 3
    assert _used(e, MEM) == 2
    e2 = engine()
    _three_blind_offers(e2)
    a = e2.allocate(MEM, ["GPU-2::mem::7"], _blind(2.0 + TTL))
    assert sum(n.kind is NoteKind.OFFER_EXPIRED for n in a.notes) == 3
    assert _used(e2, MEM) == 1


def test_offer_followed_by_its_allocate_within_ttl_works_and_stays() -> None:
    e = engine()
    p = e.preferred(MEM, _ids(MEM), [], 4, _blind(0.0))
    a = e.allocate(MEM, p.ids, _blind(TTL - 0.5))
    assert a.entry.state is EntryState.COMPLETE and a.notes == ()
    assert sorted(a.entry.memory_ids) == sorted(p.ids)
    # Held units never expire.
    assert not e.reconcile(None, None, 10 * TTL).released
    assert _used(e, MEM) == 4


def test_late_allocate_of_its_own_offer_is_still_honoured() -> None:
    e = engine()
    p = e.preferred(MEM, _ids(MEM), [], 4, _blind(0.0))
    assert e.has_offer(MEM, p.ids)
    a = e.allocate(MEM, p.ids, _blind(TTL + 5))
    assert a.entry.ref == p.entry.ref and a.entry.state is EntryState.COMPLETE


def test_partial_entry_keeps_its_reservation() -> None:
    """A container's memory allocated, its cores still to come: not an abandoned offer."""
    e = engine()
    p = e.preferred(MEM, _ids(MEM), [], 2, _blind(0.0))
    e.allocate(MEM, p.ids, _blind(0.5))
    c = e.preferred(CORE, _ids(CORE), [], 30, _blind(1.0))  # paired with the memory
    assert c.entry.ref == p.entry.ref
    assert not e.reconcile(None, None, 10 * TTL).released
    assert _used(e, CORE) == 30


def test_reconcile_with_podresources_expires_offers_too() -> None:
    e = engine()
    _three_blind_offers(e)
    r = e.reconcile(PodResourcesView(), {}, 2.0 + TTL)
    assert len(r.released) == 3 and _used(e, MEM) == 0
