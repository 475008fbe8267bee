"""Device cordons (sharing/cordon.py): the annotation value is admin-written input (strict,
bounded, never a crash), and a cordoned device takes no new slice while running ones
stay: its units are unhealthy in ListAndWatch, no device choice picks it, the inventory
says cordoned, the extender's view gives it no room and the DRA slice taints it."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_share.errors import AllocationError
from gpu_share.sharing.annotations import (
    InventoryAnnotation,
    InventoryDevice,
)
from gpu_share.sharing.cordon import (
    MALFORMED,
    MAX_CORDONS,
    TOO_MANY,
    UNKNOWN_DEVICE,
    UNREADABLE_BY,
    Cordon,
    CordonError,
    cordon_key,
    cordon_key_prefix,
    diff_cordons,
    parse_cordon,
    scan_cordons,
)
from gpu_share.sharing.dra.slices import slice_content, taint_key
from gpu_share.sharing.ids import parse_unit_id
from gpu_share.sharing.model import (
    PodResourcesContainer,
    PodResourcesPod,
    PodResourcesView,
    PodView,
    ResourceKind,
)
from gpu_share.sharing.node.ledger_annotations import inventory_annotation
from gpu_share.sharing.node.results import CallContext
from gpu_share.sharing.placement.view import node_slots
from tests.sharing.helpers import ctr, devices, engine, pod

MEM, CORE = ResourceKind.MEMORY, ResourceKind.CORE
DOMAIN = "vendor.com"
GOOD = '{"by":"alice","reason":"ECC errors","at":"2026-11-24T06:31:49Z"}'


def ctx(*pods: PodView) -> CallContext:
    pr = PodResourcesView(tuple(
        PodResourcesPod(p.namespace, p.name, tuple(PodResourcesContainer(c.name)
                                                   for c in p.containers))
        for p in pods))
    return CallContext(pr, {(p.namespace, p.name): p for p in pods}, 10.0)


def ids(kind: ResourceKind, devs: range = range(3), units: int = 8) -> list[str]:
    per = units if kind is MEM else 100
    word = "mem" if kind is MEM else "core"
    return [f"GPU-{d}::{word}::{i}" for d in devs for i in range(per)]


# ---------------------------------------------------------------- the value


def test_round_trip_and_form_the_policy_checks() -> None:
    c = Cordon("alice@example.com", "ECC errors, RMA 123", "2026-11-24T06:31:49Z")
    text = c.encode()
    # The admission policy checks this prefix against the requester's user name.
    assert text.startswith('{"by":"alice@example.com",')
    assert parse_cordon(text) == c
    assert parse_cordon('{"by":"bob","reason":""}') == Cordon("bob", "")
    assert Cordon("josé", "wartung").encode().startswith('{"by":"josé",')
    assert "no reason given" in Cordon("bob", "").describe()


@pytest.mark.parametrize("text", [
    "", "x", "null", "[]", '"by"', "{}", '{"by":"a"}', '{"reason":"r"}',
    '{"by":"","reason":"r"}', '{"by":"  ","reason":"r"}', '{"by":1,"reason":"r"}',
    '{"by":"a","reason":null}', '{"by":"a","reason":"r","extra":1}',
    '{"by":"a","reason":"r","at":"yesterday"}', '{"by":"a","reason":"r","at":5}',
    '{"by":"a","reason":"line\\nbreak"}', '{"by":"a\\u0000","reason":"r"}',
    '{"by":"mallory","reason":"r","by":"alice"}',  # a duplicate key hides the writer
    '{"by":"a","reason":"' + "r" * 257 + '"}', '{"by":"' + "a" * 257 + '","reason":""}',
    '{"by":"a","reason":"r"' + " " * 1024 + "}", "[" * 5000, '{"by":"a","reason":"r"',
])
def test_anything_but_the_strict_form_is_refused(text: str) -> None:
    with pytest.raises(CordonError):
        parse_cordon(text)


@given(st.text(max_size=400))
def test_parse_never_raises_anything_else(text: str) -> None:
    with contextlib.suppress(CordonError):
        parse_cordon(text)


def test_keys_name_the_device_uuid() -> None:
    uuid = "GPU-8f3c1a2b-1111-2222-3333-444455556666"
    assert cordon_key(DOMAIN, uuid) == f"gpu-share.{DOMAIN}/cordon.{uuid}"
    assert cordon_key(DOMAIN, uuid).startswith(cordon_key_prefix(DOMAIN))
    for bad in ("MIG-GPU-1/2/0", "a" * 60, "x-", "x y"):
        with pytest.raises(ValueError):
            cordon_key(DOMAIN, bad)


def test_scan_sorts_out_cordons_unknown_devices_and_malformed_values() -> None:
    p = cordon_key_prefix(DOMAIN)
    ann = {
        p + "GPU-0": GOOD,
        p + "GPU-1": "not json",
        p + "GPU-9": GOOD,
        "gpu-share.other.com/cordon.GPU-2": GOOD,  # another domain: not ours
        f"gpu-share.{DOMAIN}/inventory": "{}",
    }
    scan = scan_cordons(ann, DOMAIN, {"GPU-0", "GPU-1", "GPU-2"})
    assert scan.cordons["GPU-0"].by == "alice"
    # Fail closed: an unreadable cordon of a device of the node cordons it all the same.
    assert set(scan.cordons) == {"GPU-0", "GPU-1"}
    assert scan.cordons["GPU-1"].by == UNREADABLE_BY
    assert scan.cordons["GPU-1"].reason.startswith("unreadable cordon annotation")
    reasons = {key: reason for key, reason, _ in scan.problems}
    assert reasons == {p + "GPU-1": MALFORMED, p + "GPU-9": UNKNOWN_DEVICE}


def test_scan_is_bounded() -> None:
    p = cordon_key_prefix(DOMAIN)
    ann = {f"{p}GPU-{i:03d}": GOOD for i in range(MAX_CORDONS + 5)}
    scan = scan_cordons(ann, DOMAIN, {f"GPU-{i:03d}" for i in range(MAX_CORDONS + 5)})
    # Past the bound the values are not read, and their devices cordoned all the same.
    assert sum(1 for c in scan.cordons.values() if c.by == "alice") == MAX_CORDONS
    assert len(scan.cordons) == MAX_CORDONS + 5
    assert sum(1 for _, r, _ in scan.problems if r == TOO_MANY) == 5


def test_diff_names_cordons_lifted_added_and_changed() -> None:
    a, b = Cordon("alice", "x"), Cordon("bob", "y")
    changes = diff_cordons({"GPU-0": a, "GPU-1": a}, {"GPU-1": b, "GPU-2": a})
    assert [(c.device, c.cordon, c.before) for c in changes] == [
        ("GPU-0", None, a), ("GPU-1", b, a), ("GPU-2", a, None)]
    assert diff_cordons({"GPU-0": a}, {"GPU-0": a}) == []


# ---------------------------------------------------------------- the engine


def test_cordoned_units_are_unhealthy_in_list_and_watch_health_apart() -> None:
    e = engine()
    assert e.set_cordons(["GPU-1", "GPU-nope"]) and not e.set_cordons(["GPU-1"])
    for kind in (MEM, CORE):
        health = {parse_unit_id(a.id).device: a.healthy for a in e.advertised(kind)}
        assert health == {"GPU-0": True, "GPU-1": False, "GPU-2": True}
    # Health is a separate fact: the device itself is still healthy.
    assert e.inventory.require("GPU-1").healthy and e.inventory.is_cordoned("GPU-1")
    e.set_health("GPU-1", False)
    assert e.inventory.is_cordoned("GPU-1")  # a health change keeps the cordon
    e.set_health("GPU-1", True)
    assert e.set_cordons([])
    assert all(a.healthy for a in e.advertised(MEM))


def test_no_device_choice_lands_on_a_cordoned_device() -> None:
    e = engine()
    e.set_cordons(["GPU-0", "GPU-2"])
    for i in range(3):
        p = pod(f"p{i}", ctr("c", mem=2, cores=20))
        # A kubelet that still lists the cordoned units (before ListAndWatch caught up).
        pref = e.preferred(MEM, ids(MEM), [], 2, ctx(p))
        assert {parse_unit_id(u).device for u in pref.ids} == {"GPU-1"}
    fresh = engine()  # the offers above still hold GPU-1's units
    fresh.set_cordons(["GPU-0", "GPU-2"])
    pref = fresh.preferred(CORE, ids(CORE), [], 100, ctx(pod("whole", ctr("c", cores=100))))
    assert {parse_unit_id(u).device for u in pref.ids} == {"GPU-1"}
    e.set_cordons(["GPU-0", "GPU-1", "GPU-2"])
    for kind, size, p in ((MEM, 2, pod("m", ctr("c", mem=2))),
                          (CORE, 100, pod("w", ctr("c", cores=100)))):
        with pytest.raises(AllocationError) as ex:
            e.preferred(kind, ids(kind), [], size, ctx(p))
        assert ex.value.reason == "NoFit"


def test_running_slices_stay_and_the_inventory_says_cordoned() -> None:
    e = engine()
    p = pod("p", ctr("c", mem=2, cores=20))
    pref = e.preferred(MEM, ids(MEM), [], 2, ctx(p))
    dev = parse_unit_id(pref.ids[0]).device
    e.allocate(MEM, pref.ids, ctx(p))
    e.set_cordons([dev])
    assert e.ledger.pod_entries(("default", "p"))  # still held
    view = {d.id: d for d in inventory_annotation("n1", e.inventory, e.usage()).devices}
    assert view[dev].cordoned and view[dev].healthy and view[dev].memory_used == 2
    assert not any(d.cordoned for i, d in view.items() if i != dev)
    # Encoded only where true, and read back.
    text = inventory_annotation("n1", e.inventory, e.usage()).encode()
    assert json.loads(text)["devices"][0].get("cordoned") is (True if dev == "GPU-0" else None)
    assert InventoryAnnotation.decode(text) == inventory_annotation("n1", e.inventory, e.usage())


def test_unit_size_change_keeps_the_cordon() -> None:
    e = engine()
    e.set_cordons(["GPU-1"])
    assert e.set_unit_mib(512)
    assert e.inventory.is_cordoned("GPU-1")


# ---------------------------------------------------------------- extender view, DRA


def _inv(cordoned: bool) -> InventoryAnnotation:
    return InventoryAnnotation("n1", 1024, (
        InventoryDevice("GPU-0", 0, "T4", 16, 0, 100, 0, True, 0, cordoned=cordoned),
        InventoryDevice("GPU-1", 1, "T4", 16, 8, 100, 50, True, 0),
    ))


def test_extender_view_gives_a_cordoned_device_no_room() -> None:
    slots = node_slots(_inv(True), [])
    assert [d.healthy for d in slots.devices] == [False, True]
    assert [d.healthy for d in node_slots(_inv(False), []).devices] == [True, True]


def test_inventory_without_the_field_reads_as_not_cordoned() -> None:
    doc = json.loads(_inv(False).encode())
    assert "cordoned" not in doc["devices"][0]
    assert not InventoryAnnotation.decode(json.dumps(doc)).devices[0].cordoned
    doc["devices"][0]["cordoned"] = "yes"
    with pytest.raises(Exception, match="malformed"):
        InventoryAnnotation.decode(json.dumps(doc))


def test_dra_slice_taints_the_cordoned_device_and_changes_its_digest() -> None:
    driver = "gpu-share.vendor.com"
    inv = engine(devices(2)).inventory
    plain = slice_content(inv, node_name="n1", driver=driver, driver_version="1")
    cordoned = slice_content(inv.with_cordons(["GPU-1"]), node_name="n1", driver=driver,
                             driver_version="1")
    assert cordoned.digest != plain.digest
    assert "taints" not in cordoned.devices[0]
    assert cordoned.devices[1]["taints"] == [
        {"key": "gpu-share.vendor.com/cordoned", "effect": "NoSchedule"}]
    assert taint_key(driver) == "gpu-share.vendor.com/cordoned"
    assert len(cordoned.devices) == 2  # still offered to claims already allocated
