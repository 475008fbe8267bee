"""The engine follows a verified extender decision and ignores a forged or stale one."""

from __future__ import annotations

from dataclasses import replace

from gpu_share.devices.base import Device
from gpu_share.sharing.decision import ContainerDecision, Decision, decision_key, sign
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import (
    ContainerRequest,
    PodResourcesContainer,
    PodResourcesPod,
    PodResourcesView,
    PodView,
    ResourceKind,
)
from gpu_share.sharing.node.engine import AllocationEngine, CallContext
from gpu_share.sharing.node.ledger import EntrySource, Ledger
from gpu_share.sharing.node.notes import NoteKind
from tests.sharing.helpers import NAMES, UNIT_MIB, ctr, devices, pod

KEY = b"sekret-key"
NOW = 1_000_000.0
ANN = decision_key("vendor.com")


def _engine(devs: list[Device] | None = None, key: bytes | None = KEY) -> AllocationEngine:
    inv = Inventory.from_devices(devs or devices(3, 8), UNIT_MIB)
    return AllocationEngine(inv, Ledger(), NAMES, decision_key=key, node_name="node-1")


def _ctx(p: PodView) -> CallContext:
    pr = PodResourcesView(
        (
            PodResourcesPod(
                p.namespace, p.name, tuple(PodResourcesContainer(c.name) for c in p.containers)
            ),
        )
    )
    return CallContext(pr, {(p.namespace, p.name): p}, NOW)


def _decided(
    p: PodView,
    device: str,
    *,
    key: bytes = KEY,
    uid: str | None = None,
    req: ContainerRequest | None = None,
    issued: float = NOW,
) -> PodView:
    c = p.containers[0]
    d = Decision(
        uid or p.uid,
        "node-1",
        {c.name: ContainerDecision((device,), req or c.request)},
        int(issued),
    )
    return replace(p, annotations={ANN: sign(d, key)})


def _all(kind: ResourceKind) -> list[str]:
    tag = "mem" if kind is ResourceKind.MEMORY else "core"
    n = 8 if kind is ResourceKind.MEMORY else 100
    return [f"GPU-{d}::{tag}::{i}" for d in range(3) for i in range(n)]


def test_verified_decision_pins_the_device_for_both_resources() -> None:
    e = _engine()
    p = _decided(pod("p", ctr("c", mem=2, cores=20)), "GPU-2")  # best-fit would take GPU-0
    got = e.preferred(ResourceKind.CORE, _all(ResourceKind.CORE), [], 20, _ctx(p))
    assert {i.split("::")[0] for i in got.ids} == {"GPU-2"}
    assert got.entry.source is EntrySource.EXTENDER
    e.allocate(ResourceKind.CORE, got.ids, _ctx(p))
    mem = e.preferred(ResourceKind.MEMORY, _all(ResourceKind.MEMORY), [], 2, _ctx(p))
    assert {i.split("::")[0] for i in mem.ids} == {"GPU-2"}


def test_forged_decision_is_ignored_with_a_note() -> None:
    e = _engine()
    p = _decided(pod("p", ctr("c", mem=2, cores=20)), "GPU-2", key=b"tenant-guess")
    got = e.preferred(ResourceKind.MEMORY, _all(ResourceKind.MEMORY), [], 2, _ctx(p))
    assert got.entry.source is EntrySource.NODE_AGENT
    assert any(n.kind is NoteKind.EXTENDER_IGNORED and "BadSignature" in n.text for n in got.notes)


def test_decision_for_another_request_or_pod_or_too_old_is_ignored() -> None:
    base = pod("p", ctr("c", mem=2, cores=20))
    for p, reason in [
        (_decided(base, "GPU-2", req=ContainerRequest(1, 20)), "RequestMismatch"),
        (_decided(base, "GPU-2", uid="other-uid"), "UidMismatch"),
        (_decided(base, "GPU-2", issued=NOW - 3600), "DecisionExpired"),
    ]:
        got = _engine().preferred(ResourceKind.MEMORY, _all(ResourceKind.MEMORY), [], 2, _ctx(p))
        assert got.entry.source is EntrySource.NODE_AGENT
        assert any(n.kind is NoteKind.EXTENDER_IGNORED and reason in n.text for n in got.notes)


def test_decision_that_no_longer_fits_falls_back_to_the_node_policy() -> None:
    e = _engine()
    first = pod("a", ctr("c", mem=7, cores=10))
    r = e.preferred(ResourceKind.MEMORY, _all(ResourceKind.MEMORY), [], 7, _ctx(first))
    dev = r.ids[0].split("::")[0]
    e.allocate(ResourceKind.MEMORY, r.ids, _ctx(first))
    p = _decided(pod("b", ctr("c", mem=4, cores=10)), dev)  # only 1 unit left there
    free = [i for i in _all(ResourceKind.MEMORY) if i not in r.ids]
    got = e.preferred(ResourceKind.MEMORY, free, [], 4, _ctx(p))
    assert {i.split("::")[0] for i in got.ids} != {dev}
    assert any(n.kind is NoteKind.EXTENDER_IGNORED and "not followed" in n.text for n in got.notes)


def test_without_a_key_decisions_are_not_read() -> None:
    e = _engine(key=None)
    p = _decided(pod("p", ctr("c", mem=2, cores=20)), "GPU-2")
    got = e.preferred(ResourceKind.MEMORY, _all(ResourceKind.MEMORY), [], 2, _ctx(p))
    assert got.entry.source is EntrySource.NODE_AGENT and not got.notes


def test_during_a_key_rotation_decisions_under_the_previous_key_are_followed() -> None:
    """An agent already on the new key still follows an extender that signs with the
    previous one (its pods roll at their own pace); a third key is still refused, and
    a refusal other than the signature's is not retried under the previous key."""
    inv = Inventory.from_devices(devices(3, 8), UNIT_MIB)
    e = AllocationEngine(inv, Ledger(), NAMES, decision_key=b"new-key-after-rotation",
                         previous_decision_keys=(KEY,), node_name="node-1")
    p = _decided(pod("p", ctr("c", mem=2, cores=20)), "GPU-2")  # signed with KEY
    got = e.preferred(ResourceKind.MEMORY, _all(ResourceKind.MEMORY), [], 2, _ctx(p))
    assert got.entry.source is EntrySource.EXTENDER
    assert {i.split("::")[0] for i in got.ids} == {"GPU-2"}
    for forged, reason in ((_decided(pod("q", ctr("c", mem=2)), "GPU-2", key=b"x" * 20),
                            "BadSignature"),
                           (_decided(pod("r", ctr("c", mem=2)), "GPU-2", uid="other"),
                            "UidMismatch")):
        got = e.preferred(ResourceKind.MEMORY, _all(ResourceKind.MEMORY), [], 2, _ctx(forged))
        assert got.entry.source is EntrySource.NODE_AGENT
        assert any(reason in n.text for n in got.notes), got.notes
