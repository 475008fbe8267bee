"""The agent honours a device cordon at once (L2: the whole agent behind real gRPC servers,
a kubelet stub, the node's annotations handed in as the node watch would): the device's
units go unhealthy in ListAndWatch, the next pod lands on the other device, the running
slice stays, the inventory annotation says cordoned, Events say who and why; uncordon
restores. A bad annotation is logged, counted and reported once, never a crash."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable

from gpu_share.agent.ports import AgentMetrics, DeviceRow
from gpu_share.devices.dummy import DummyBackend
from gpu_share.sharing.annotations import inventory_key
from gpu_share.sharing.cordon import Cordon, cordon_key, cordon_key_prefix
from gpu_share.sharing.ids import parse_unit_id
from gpu_share.sharing.model import ResourceKind
from tests.agent.served_agent import (
    CORE,
    MEM,
    FakePods,
    RecordingPublisher,
    Rig,
    agent_config,
    pod_view,
    running_rig,
    scratch_dir,
)

DOMAIN = "vendor.com"


def _until(cond: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _uuids(rig: Rig) -> list[str]:
    assert rig.agent is not None and rig.agent.engine is not None
    return [d.uuid for d in rig.agent.engine.inventory.devices]


def _inventory(rig: Rig, cond: Callable[[dict[str, dict[str, object]]], bool]
               ) -> dict[str, dict[str, object]]:
    """The published inventory, once ``cond`` holds (publishing is coalesced)."""
    def now() -> dict[str, dict[str, object]]:
        text = rig.publisher.node.get(inventory_key(DOMAIN))
        return {d["id"]: d for d in json.loads(text)["devices"]} if text else {}

    _until(lambda: cond(now()))
    return now()


def _devices_of(ids: list[str]) -> set[str]:
    return {parse_unit_id(i).device for i in ids}


def test_cordon_stops_new_slices_running_ones_stay_uncordon_restores() -> None:
    with running_rig() as rig:
        assert rig.agent is not None
        dev0, dev1 = _uuids(rig)
        envs = rig.admit(pod_view("before", ("c", 2, 20)), random.Random(1))
        assert envs
        held = rig.held[("default", "before", "c")]
        first = _devices_of(held[MEM]).pop()
        target = first  # cordon the device the running slice is on
        other = dev1 if target == dev0 else dev0

        cordon = Cordon("alice", "ECC errors", "2026-11-24T06:31:49Z")
        rig.agent.holds.on_node_annotations({cordon_key(DOMAIN, target): cordon.encode()})

        for resource in (MEM, CORE):
            rig.clients[resource].wait_for_list(
                lambda ds: bool(ds) and all(
                    d.healthy == (parse_unit_id(d.id).device != target) for d in ds))
        # The kubelet now offers only the other device's units: the next pod lands there.
        rig.admit(pod_view("after", ("c", 2, 20)), random.Random(2))
        after = rig.held[("default", "after", "c")]
        assert _devices_of(after[MEM]) == _devices_of(after[CORE]) == {other}
        # The running slice stays, in the ledger and in the inventory's usage.
        assert rig.agent.engine is not None
        assert rig.agent.engine.ledger.pod_entries(("default", "before"))
        inv = _inventory(rig, lambda i: "cordoned" in i.get(target, {}))
        assert inv[target]["cordoned"] is True and inv[target]["healthy"] is True
        assert inv[target]["memoryUnits"] == {"total": 8, "used": 2}
        assert "cordoned" not in inv[other]
        assert rig.agent.flush(5.0)
        events = [e for e in rig.publisher.events if e[1] == "DeviceCordoned"]
        assert len(events) == 1 and "by alice: ECC errors" in events[0][2]
        assert target in events[0][2] and events[0][0] == "node-a"
        assert rig.agent.holds.cordons() == {target: cordon}

        rig.agent.holds.on_node_annotations({})
        rig.clients[MEM].wait_for_list(lambda ds: bool(ds) and all(d.healthy for d in ds))
        _inventory(rig, lambda i: bool(i) and "cordoned" not in i[target])
        assert rig.agent.flush(5.0)
        lifted = [e for e in rig.publisher.events if e[1] == "DeviceUncordoned"]
        assert len(lifted) == 1 and "was cordoned by alice: ECC errors" in lifted[0][2]


class _Recorder(AgentMetrics):
    def __init__(self) -> None:
        self.ignored: list[str] = []
        self.rows: list[DeviceRow] = []

    def cordon_ignored(self, reason: str) -> None:
        self.ignored.append(reason)

    def devices(self, rows: object) -> None:
        self.rows = list(rows)  # type: ignore[call-overload]


def test_bad_annotations_are_reported_once_and_an_unreadable_one_cordons() -> None:
    with scratch_dir() as d:
        cfg = agent_config(d, poll_s=None, identity={"useApiServer": False})
        backend = DummyBackend(cfg.dummy, cfg.node_name)
        backend.start()
        metrics, pub = _Recorder(), RecordingPublisher()
        from gpu_share.agent.node_agent import NodeAgent

        agent = NodeAgent(cfg, backend, pod_resources=None, pods=FakePods(), publisher=pub,
                          metrics=metrics)
        good = Cordon("bob", "maintenance").encode()
        devs = [dd.uuid for dd in backend.devices()]
        # Before the engine exists: kept, applied by start().
        agent.holds.on_node_annotations({cordon_key(DOMAIN, devs[1]): good})
        agent.start()
        try:
            assert agent.engine is not None and agent.engine.inventory.is_cordoned(devs[1])
            bad = {
                cordon_key(DOMAIN, devs[0]): '{"by":"x"}',  # no reason
                cordon_key_prefix(DOMAIN) + "GPU-elsewhere": good,
                cordon_key(DOMAIN, devs[1]): good,
            }
            for _ in range(3):  # the same problems again: reported once
                agent.holds.on_node_annotations(bad)
            assert sorted(metrics.ignored) == ["Malformed", "UnknownDevice"]
            assert agent.flush(5.0)
            warned = [e for e in pub.events if e[1] == "CordonIgnored"]
            assert len(warned) == 2
            # Fail closed: the unreadable cordon of device 0 cordons it all the same.
            assert agent.engine.inventory.is_cordoned(devs[0])
            assert agent.engine.inventory.is_cordoned(devs[1])
            assert any("its device is cordoned all the same" in m for _, r, m in pub.events
                       if r == "CordonIgnored")
            _until(lambda: all(r.cordoned for r in metrics.rows[:2]) and len(metrics.rows) > 1)
            assert {r.device: r.cordoned for r in metrics.rows} == {devs[0]: True,
                                                                    devs[1]: True}
            # Garbage of every kind never raises.
            agent.holds.on_node_annotations({cordon_key(DOMAIN, devs[0]): "[" * 10_000})
            agent.holds.on_node_annotations({cordon_key(DOMAIN, devs[0]): "x" * 100_000})
        finally:
            agent.stop()


def test_advertised_units_follow_the_cordon_per_resource() -> None:
    with running_rig() as rig:
        assert rig.agent is not None
        dev0, _ = _uuids(rig)
        rig.agent.holds.on_node_annotations({cordon_key(DOMAIN, dev0): Cordon("a", "b").encode()})
        for kind in ResourceKind:
            units = rig.agent.calls.advertised(kind)
            assert {u.healthy for u in units if parse_unit_id(u.id).device == dev0} == {False}
            assert {u.healthy for u in units if parse_unit_id(u.id).device != dev0} == {True}


def test_a_restarted_agent_offers_no_device_before_it_has_read_the_cordons() -> None:
    """With an API server, every device is held back until the node watch's first read;
    past the bound (API server down) they are offered and a Warning Event says why."""
    for first_read in (True, False):
        with scratch_dir() as d:
            cfg = agent_config(d, poll_s=0.05, identity={"useApiServer": False})
            backend = DummyBackend(cfg.dummy, cfg.node_name, check_interval_s=0.05)
            backend.start()
            pub = RecordingPublisher()
            from gpu_share.agent.node_agent import NodeAgent

            agent = NodeAgent(cfg, backend, pod_resources=None, pods=FakePods(), publisher=pub)
            agent.holds.await_cordons(60.0 if first_read else 0.5)
            agent.start()
            try:
                engine = agent.engine
                assert engine is not None
                devs = [dd.uuid for dd in backend.devices()]
                assert all(engine.inventory.is_cordoned(u) for u in devs)
                if first_read:
                    agent.holds.on_node_annotations(
                        {cordon_key(DOMAIN, devs[0]): Cordon("bob", "x").encode()})
                    assert [engine.inventory.is_cordoned(u) for u in devs] == [
                        True] + [False] * (len(devs) - 1)
                else:
                    _until(lambda e=engine, ds=devs: not any(
                        e.inventory.is_cordoned(u) for u in ds))
                    assert agent.flush(5.0)
                    assert any(r == "CordonsUnread" for _, r, _m in pub.events)
            finally:
                agent.stop()
