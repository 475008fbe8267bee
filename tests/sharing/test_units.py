from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_share.config.model import PlacementPolicyName
from gpu_share.errors import AllocationError, LedgerError
from gpu_share.sharing.annotations import (
    AnnotationError,
    ContainerAssignment,
    InventoryAnnotation,
    InventoryDevice,
    PodAssignment,
)
from gpu_share.sharing.ids import (
    UnitId,
    count_by_device,
    group_by_device,
    parse_unit_id,
    parse_unit_ids,
    unit_id,
)
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRef,
    ContainerRequest,
    DeviceShare,
    ResourceKind,
)
from gpu_share.sharing.node.device_policy import DeviceState, choose_whole_devices, get_policy
from gpu_share.sharing.node.ledger import EntrySource, EntryState, Ledger, LedgerEntry
from tests.sharing.helpers import UNIT_MIB, devices

MEM, CORE = ResourceKind.MEMORY, ResourceKind.CORE


# ---------------------------------------------------------------- ids
@given(
    st.text(alphabet="abcdefGPU-0123456789", min_size=1, max_size=12),
    st.sampled_from(list(ResourceKind)),
    st.integers(min_value=0, max_value=10_000),
)
@settings(max_examples=50)
def test_unit_id_round_trip(uuid: str, kind: ResourceKind, i: int) -> None:
    assert parse_unit_id(unit_id(uuid, kind, i)) == UnitId(uuid, kind, i)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "GPU-0",
        "GPU-0::mem",
        "GPU-0::gpu::1",
        "::mem::1",
        "GPU-0::mem::x",
        "GPU-0::mem::-1",
        "GPU-0::mem::01",
        "a::b::mem::1",
    ],
)
def test_parse_unit_id_rejects_naming_the_id(bad: str) -> None:
    with pytest.raises(AllocationError) as e:
        parse_unit_id(bad)
    assert e.value.reason == "UnknownDevice"
    assert repr(bad) in str(e.value)


def test_parse_unit_ids_checks_kind() -> None:
    with pytest.raises(AllocationError, match="core unit, expected memory"):
        parse_unit_ids(["GPU-0::core::1"], MEM)


def test_grouping() -> None:
    ids = ["B::mem::2", "A::mem::1", "B::mem::0"]
    g = group_by_device(ids)
    assert list(g) == ["B", "A"]
    assert [u.index for u in g["B"]] == [0, 2]
    assert count_by_device(ids) == {"B": 2, "A": 1}


def test_unit_id_refuses_separator_in_uuid() -> None:
    with pytest.raises(AllocationError):
        unit_id("a::b", MEM, 0)


# ---------------------------------------------------------------- inventory
def test_inventory_units_and_advertised_health() -> None:
    devs = devices(2, units=4)
    inv = Inventory.from_devices(devs, UNIT_MIB)
    assert [d.memory_units for d in inv.devices] == [4, 4]
    assert len(inv.advertised(MEM)) == 8
    assert len(inv.advertised(CORE)) == 200
    sick = inv.with_health("GPU-1", False)
    adv = sick.advertised(CORE)
    assert all(not a.healthy for a in adv if a.id.startswith("GPU-1::"))
    assert all(a.healthy for a in adv if a.id.startswith("GPU-0::"))
    assert inv.get("GPU-1") is not None and inv.get("GPU-1").healthy  # type: ignore[union-attr]


def test_inventory_partial_units_round_down_and_unknown() -> None:
    d = devices(1)[0]
    from dataclasses import replace

    inv = Inventory.from_devices([replace(d, memory_mib=2500)], 1024)
    assert inv.devices[0].memory_units == 2
    with pytest.raises(AllocationError) as e:
        inv.require("GPU-9")
    assert e.value.reason == "UnknownDevice"


# ---------------------------------------------------------------- ledger
def _entry(name: str = "p", **kw: object) -> LedgerEntry:
    base: dict[str, object] = dict(
        ref=ContainerRef("ns", name, "c", "u1"),
        request=ContainerRequest(2, 30),
        shares=(DeviceShare("GPU-0", 2, 30),),
        source=EntrySource.NODE_AGENT,
        created_at=1.0,
        updated_at=1.0,
    )
    base.update(kw)
    return LedgerEntry(**base)  # type: ignore[arg-type]


def test_entry_states() -> None:
    e = _entry()
    assert e.state is EntryState.DECIDED
    e = e.with_ids(MEM, ["GPU-0::mem::0", "GPU-0::mem::1"], 2.0)
    assert e.state is EntryState.PARTIAL
    e = e.with_ids(CORE, [f"GPU-0::core::{i}" for i in range(30)], 3.0)
    assert e.state is EntryState.COMPLETE and e.updated_at == 3.0


def test_usage_counts_reservations_and_reuse_once() -> None:
    inv = Inventory.from_devices(devices(1, units=8), UNIT_MIB)
    led = Ledger()
    init = _entry(
        ref=ContainerRef("ns", "p", "init", "u1"),
        container_kind=ContainerKind.INIT,
        order=0,
        request=ContainerRequest(4, 0),
        shares=(DeviceShare("GPU-0", 4, 0),),
        memory_ids=tuple(f"GPU-0::mem::{i}" for i in range(4)),
    )
    app = _entry(
        ref=ContainerRef("ns", "p", "app", "u1"),
        order=1,
        request=ContainerRequest(6, 20),
        shares=(DeviceShare("GPU-0", 6, 20),),
    )
    led.put(init)
    led.put(app)
    u = led.usage(inv)["GPU-0"]
    # 4 held by init + (6 - 4 reusable) reserved by app.
    assert u.memory_used == 6
    assert u.cores_used == 20
    led.put(app.with_ids(MEM, [f"GPU-0::mem::{i}" for i in range(6)], 2.0))
    assert led.usage(inv)["GPU-0"].memory_used == 6  # union: init's ids counted once


def test_usage_exclusive_is_whole_device() -> None:
    inv = Inventory.from_devices(devices(1, units=8), UNIT_MIB)
    led = Ledger()
    led.put(_entry(request=ContainerRequest(1, 100), shares=(DeviceShare("GPU-0", 1, 100, True),)))
    u = led.usage(inv)["GPU-0"]
    assert (u.memory_used, u.cores_used) == (8, 100)
    assert u.exclusive_pods == {("ns", "p")}


def test_ledger_json_round_trip_and_release() -> None:
    led = Ledger()
    led.put(_entry("a", memory_ids=("GPU-0::mem::0", "GPU-0::mem::1")))
    led.put(_entry("b", order=3, container_kind=ContainerKind.SIDECAR))
    led.absent_since[("ns", "a")] = 5.0
    led.seq = 7
    back = Ledger.from_json(led.to_json())
    assert back.entries == led.entries
    assert back.absent_since == led.absent_since and back.seq == 7
    assert back.to_json() == led.to_json()
    assert back.release_pod(("ns", "a")) == [ContainerRef("ns", "a", "c", "u1")]
    assert [e.ref.pod_name for e in back.entries] == ["b"]
    assert ("ns", "a") not in back.absent_since


@pytest.mark.parametrize(
    "text,match",
    [
        ('{"version": "v2", "entries": []}', "version 'v2' is not supported"),
        ("{}", "version None"),
        ("[1]", "must be an object"),
        ("nope", "Invalid JSON"),
        ('{"version": "v1", "entries": [{"namespace": "x"}]}', "malformed"),
    ],
)
def test_ledger_bad_json(text: str, match: str) -> None:
    with pytest.raises(LedgerError, match=match):
        Ledger.from_json(text)


def test_ledger_bad_ids_in_json() -> None:
    led = Ledger()
    led.put(_entry(memory_ids=("GPU-0::mem::0",)))
    raw = json.loads(led.to_json())
    raw["entries"][0]["memoryIds"] = ["GPU-0::core::0"]
    with pytest.raises(LedgerError):
        Ledger.from_json(json.dumps(raw))


# ---------------------------------------------------------------- policy
def _st(i: int, mfree: int, cfree: int, total: int = 8) -> DeviceState:
    return DeviceState(f"G{i}", i, 0, total, mfree, 100, cfree)


def test_best_fit_prefers_tightest_then_lowest_index() -> None:
    p = get_policy(PlacementPolicyName.BEST_FIT)
    cands = [_st(0, 8, 100), _st(1, 3, 40), _st(2, 3, 40)]
    assert p.choose(cands, 2, 20).index == 1  # type: ignore[union-attr]
    assert p.choose([], 1, 1) is None


def test_spread_and_binpack() -> None:
    cands = [_st(0, 8, 100), _st(1, 3, 40), _st(2, 5, 50)]
    assert get_policy("spread").choose(cands, 1, 10).index == 0  # type: ignore[union-attr]
    assert get_policy("binpack").choose(cands, 1, 10).index == 1  # type: ignore[union-attr]


def test_best_fit_considers_both_dimensions() -> None:
    # Device 0 is tight in memory but loose in cores; device 1 the opposite but tighter
    # overall after placement.
    cands = [_st(0, 2, 100), _st(1, 4, 30)]
    # leftover: d0 = 0/8 + 90/100 = 0.9 ; d1 = 2/8 + 20/100 = 0.45
    assert get_policy("best-fit").choose(cands, 2, 10).index == 1  # type: ignore[union-attr]


def test_whole_devices_prefer_one_numa_node() -> None:
    free = [
        DeviceState("a", 0, 0, 8, 8, 100, 100),
        DeviceState("b", 1, 1, 8, 8, 100, 100),
        DeviceState("c", 2, 1, 8, 8, 100, 100),
        DeviceState("d", 3, 0, 8, 8, 100, 100),
        DeviceState("e", 4, 0, 8, 8, 100, 100),
    ]
    got = choose_whole_devices(free, 2)
    assert [d.uuid for d in got or []] == ["b", "c"]  # numa 1 fits exactly (best fit)
    got3 = choose_whole_devices(free, 3)
    assert [d.uuid for d in got3 or []] == ["a", "d", "e"]
    assert choose_whole_devices(free, 6) is None
    assert [d.uuid for d in choose_whole_devices(free, 4) or []] == ["a", "b", "c", "d"]


# ---------------------------------------------------------------- annotations
def test_inventory_annotation_round_trip_and_validation() -> None:
    a = InventoryAnnotation(
        "n1", 1024, (InventoryDevice("GPU-0", 0, "T4", 16, 4, 100, 30, True, None),)
    )
    text = a.encode()
    raw = json.loads(text)
    assert raw["version"] == "v1" and raw["unitMiB"] == 1024
    assert raw["devices"][0]["memoryUnits"] == {"total": 16, "used": 4}
    assert InventoryAnnotation.decode(text) == a
    raw["devices"][0]["cores"]["used"] = "x"
    with pytest.raises(AnnotationError):
        InventoryAnnotation.decode(json.dumps(raw))
    with pytest.raises(AnnotationError, match="version"):
        InventoryAnnotation.decode('{"version": "v0"}')


def test_assignment_annotation_round_trip() -> None:
    a = PodAssignment(
        {"app": ContainerAssignment((DeviceShare("GPU-1", 2, 50, False),), "node-agent")}
    )
    text = a.encode()
    assert json.loads(text)["containers"]["app"]["devices"][0] == {
        "id": "GPU-1",
        "memoryUnits": 2,
        "cores": 50,
        "exclusive": False,
    }
    assert PodAssignment.decode(text) == a
    with pytest.raises(AnnotationError):
        PodAssignment.decode('{"version": "v1", "containers": {"a": {"devices": [{}]}}}')
