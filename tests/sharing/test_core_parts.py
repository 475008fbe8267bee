"""The allocation core's parts on their own: PerKind, FreeView, pick_ids, notes, the
reason table, ledger absence bookkeeping, and errors that name their container."""

from __future__ import annotations

import pytest

from gpu_share.errors import (
    REASONS,
    AllocationError,
    AllocationReason,
    GpuShareError,
    IdentityError,
    KubeAccessError,
    event_reason_of,
    grpc_code_of,
    metric_label_of,
)
from gpu_share.sharing.ids import device_of, tally_devices
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRef,
    ContainerRequest,
    DeviceShare,
    PerKind,
    PodResourcesContainer,
    PodResourcesPod,
    PodResourcesView,
    ResourceKind,
)
from gpu_share.sharing.node.engine import CallContext
from gpu_share.sharing.node.freeview import FreeView
from gpu_share.sharing.node.ledger import EntrySource, Ledger, LedgerEntry
from gpu_share.sharing.node.notes import Note, NoteKind, degraded_label
from gpu_share.sharing.node.pick import pick_ids
from tests.sharing.helpers import UNIT_MIB, ctr, devices, engine, pod

MEM, CORE = ResourceKind.MEMORY, ResourceKind.CORE


def _entry(
    name: str,
    shares: tuple[DeviceShare, ...],
    req: ContainerRequest,
    *,
    mem_ids: tuple[str, ...] = (),
    kind: ContainerKind = ContainerKind.APP,
    order: int = -1,
) -> LedgerEntry:
    ref = ContainerRef("ns", "p", name, "uid")
    return LedgerEntry(ref, req, shares, EntrySource.NODE_AGENT, 0.0, 0.0, kind, order,
                       memory_ids=mem_ids)


def test_per_kind_is_the_one_memory_core_switch() -> None:
    pair = PerKind("m", "c")
    assert (pair[MEM], pair[CORE]) == ("m", "c")
    assert pair.set(CORE, "x") == PerKind("m", "x")
    assert PerKind.build(lambda k: k.value) == PerKind("memory", "core")
    assert pair.map(str.upper).values() == ("M", "C")
    assert ContainerRequest(3, 20).with_amount(CORE, 5) == ContainerRequest(3, 5)
    assert DeviceShare("d", 1, 2).with_amount(MEM, 7).amount(MEM) == 7


def test_id_helpers_split_by_device() -> None:
    assert device_of("GPU-1::mem::12") == "GPU-1"
    assert tally_devices(["a::mem::0", "b::mem::1", "a::mem::2"]) == {"a": 2, "b": 1}


def test_free_view_counts_usage_pool_and_the_kubelet_list() -> None:
    inv = Inventory.from_devices(devices(2, units=8), UNIT_MIB)
    led = Ledger()
    # An init container holds 3 units of GPU-0; the app container after it may reuse them.
    init_ids = ("GPU-0::mem::0", "GPU-0::mem::1", "GPU-0::mem::2")
    led.put(_entry("init", (DeviceShare("GPU-0", 3, 0),), ContainerRequest(3, 0),
                   mem_ids=init_ids, kind=ContainerKind.INIT, order=0))
    other = LedgerEntry(ContainerRef("ns", "q", "c", "u2"), ContainerRequest(2, 10),
                        (DeviceShare("GPU-0", 2, 10),), EntrySource.NODE_AGENT, 0.0, 0.0)
    led.put(other)
    app = _entry("app", (), ContainerRequest(4, 0), order=1)
    listed = ["GPU-0::mem::5", "GPU-1::mem::0"]
    view = FreeView.of(inv, led, app, MEM, listed)
    gpu0, gpu1 = inv.devices
    # GPU-0: 8 - (3 held + 2 reserved) + 3 pooled = 6, capped by the 1 listed id.
    assert view.free(gpu0, MEM) == 1
    assert view.free(gpu0, CORE) == 90  # not the call's kind: no cap
    assert view.free(gpu1, MEM) == 1
    assert view.pool_devices() == {"GPU-0"} and view.pool_devices(CORE) == set()
    assert not view.blocked("GPU-0") and not view.wholly_free("GPU-0")
    assert view.wholly_free("GPU-1")
    assert FreeView.of(inv, led, app, MEM, None).free(gpu0, MEM) == 6


def test_pick_ids_takes_lowest_units_of_the_decided_device() -> None:
    e = _entry("c", (DeviceShare("GPU-1", 3, 0),), ContainerRequest(3, 0))
    avail = [f"GPU-{d}::mem::{i}" for d in range(2) for i in (10, 2, 1, 0)]
    assert pick_ids(e, MEM, avail, [], 3) == ["GPU-1::mem::0", "GPU-1::mem::1", "GPU-1::mem::2"]
    assert pick_ids(e, MEM, avail, ["GPU-1::mem::10"], 3) == [
        "GPU-1::mem::10", "GPU-1::mem::0", "GPU-1::mem::1"
    ]
    with pytest.raises(AllocationError) as info:
        pick_ids(e, MEM, avail, ["GPU-0::mem::0"], 3)
    assert info.value.reason == AllocationReason.DECISION_MISMATCH
    assert info.value.ref == e.ref
    with pytest.raises(AllocationError) as info:
        pick_ids(e, MEM, avail[:5], [], 3)
    assert info.value.reason == AllocationReason.NO_FIT


def test_pick_ids_exclusive_fills_from_any_owned_device() -> None:
    shares = (DeviceShare("GPU-0", 1, 100, True), DeviceShare("GPU-1", 1, 100, True))
    e = _entry("c", shares, ContainerRequest(2, 200))
    avail = ["GPU-0::mem::0", "GPU-0::mem::1", "GPU-0::mem::2", "GPU-1::mem::4"]
    assert pick_ids(e, MEM, avail, ["GPU-0::mem::1", "GPU-0::mem::2"], 2) == [
        "GPU-0::mem::1", "GPU-0::mem::2"
    ]
    assert sorted(pick_ids(e, MEM, avail[:3], [], 2)) == ["GPU-0::mem::0", "GPU-0::mem::1"]


def test_degraded_label_comes_from_the_note_kind() -> None:
    assert degraded_label([Note(NoteKind.OFFER_EXPIRED, "API server PodResources"),
                           Note(NoteKind.DEGRADED_APISERVER, "x")]) == "apiserver-unreachable"
    assert degraded_label([]) == "no-candidate"
    assert str(Note(NoteKind.AMBIGUOUS, "text")) == "text"


def test_one_reason_table_gives_labels_codes_and_event_reasons() -> None:
    assert set(REASONS) == set(AllocationReason)
    no_fit = AllocationError("x", reason=AllocationReason.NO_FIT)
    assert grpc_code_of(no_fit) == "RESOURCE_EXHAUSTED"
    assert metric_label_of(no_fit) == event_reason_of(no_fit) == "NoFit"
    assert grpc_code_of(AllocationError("x", reason=AllocationReason.MEMORY_REQUIRED)) == (
        "INVALID_ARGUMENT"
    )
    assert grpc_code_of(AllocationError("x", reason="Other")) == "INVALID_ARGUMENT"
    assert grpc_code_of(IdentityError("x")) == grpc_code_of(KubeAccessError("x")) == "UNAVAILABLE"
    assert grpc_code_of(GpuShareError("x")) == "FAILED_PRECONDITION"
    assert metric_label_of(IdentityError("x")) == "IdentityUnknown"


def test_ledger_owns_absence_bookkeeping() -> None:
    led = Ledger()
    key = ("ns", "p")
    assert led.absent_for(key, 10.0) == 0.0
    assert led.absent_for(key, 25.0) == 15.0
    led.mark_present(key)
    assert led.absent_for(key, 30.0) == 0.0
    assert Ledger.from_json(led.to_json()).absent_since == {key: 30.0}


def _ctx(*pods):  # type: ignore[no-untyped-def]
    pr = PodResourcesView(tuple(
        PodResourcesPod(p.namespace, p.name, tuple(PodResourcesContainer(c.name)
                                                   for c in p.containers))
        for p in pods
    ))
    return CallContext(pr, {(p.namespace, p.name): p for p in pods}, 10.0)


def test_errors_name_their_container_when_known() -> None:
    e = engine(devices(1, units=4))
    p = pod("p", ctr("c", mem=3))
    ids = [f"GPU-0::mem::{i}" for i in range(4)]
    e.preferred(MEM, ids, [], 3, _ctx(p))
    q = pod("q", ctr("c", mem=3))
    with pytest.raises(AllocationError) as info:
        e.preferred(MEM, ids, [], 3, CallContext(None, None, 10.0))
    assert info.value.reason == AllocationReason.NO_FIT
    assert info.value.ref is None  # a blind decision names no container
    with pytest.raises(AllocationError) as info:
        e.preferred(MEM, ids, [], 3, _ctx(q))
    assert info.value.reason == AllocationReason.NO_FIT
    assert info.value.ref == ContainerRef("default", "q", "c", "uid-default-q")


def test_allocate_after_has_offer_uses_that_offer() -> None:
    e = engine()
    p = pod("p", ctr("c", mem=2, cores=10))
    ids = [f"GPU-{d}::mem::{i}" for d in range(3) for i in range(8)]
    got = e.preferred(MEM, ids, [], 2, _ctx(p))
    assert e.has_offer(MEM, got.ids) and not e.has_offer(MEM, got.ids[:1])
    assert e.has_offer(MEM, list(reversed(got.ids)))
    a = e.allocate(MEM, got.ids, CallContext(None, None, 11.0))
    assert a.entry.ref.pod_name == "p" and a.entry.memory_ids == tuple(sorted(got.ids))
    assert not e.has_offer(MEM, got.ids)  # allocated: no longer an open offer
