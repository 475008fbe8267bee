"""L2: the whole node agent (dummy backend) behind real gRPC servers on unix sockets,
driven by a kubelet-side stub, with a fake PodResources server and in-memory pod specs.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import grpc
import pytest

from gpu_share.devices.dummy import write_faults
from gpu_share.sharing.annotations import PodAssignment
from gpu_share.sharing.ids import parse_unit_id
from tests.agent.served_agent import CORE, MEM, Rig, pod_view, running_rig


@pytest.fixture
def rig() -> Iterator[Rig]:
    with running_rig() as r:
        yield r


def _device_of(ids: list[str]) -> set[str]:
    return {parse_unit_id(i).device for i in ids}


def test_registers_both_resources_and_lists_units(rig: Rig) -> None:
    assert rig.kubelet.wait_for_registrations(2, timeout_s=5)
    names = sorted(r.resource_name for r in rig.kubelet.registrations)
    assert names == [CORE, MEM]
    assert all(r.options.get_preferred_allocation_available for r in rig.kubelet.registrations)
    assert len(rig.all_ids(MEM)) == 2 * 8  # 2 devices x 8 GiB at 1 GiB units
    assert len(rig.all_ids(CORE)) == 2 * 100


@pytest.mark.parametrize("seed", range(6))
def test_memory_and_cores_of_each_container_land_on_one_device(rig: Rig, seed: int) -> None:
    rng = random.Random(seed)
    pods = [
        pod_view("a", ("main", 4, 30)),
        pod_view("b", ("main", 3, 50), ("side", 1, 20)),
        pod_view("c", ("main", 4, 0)),
        pod_view("d", ("main", 0, 40)),
        pod_view("e", ("main", 2, 10)),
    ]
    for view in pods:
        envs = rig.admit(view, rng)
        for c in view.containers:
            held = rig.held[(view.namespace, view.name, c.name)]
            devices = set().union(*(_device_of(ids) for ids in held.values()))
            assert len(devices) == 1, (view.name, c.name, held)
            # Both resources' responses describe the same slice.
            answers = list(envs[c.name].values())
            assert all(a == answers[0] for a in answers)
            assert ("DUMMY_VISIBLE_DEVICES", devices.pop()) in answers[0]
    # Nothing over-committed (ids are units; no id handed out twice).
    for resource in (MEM, CORE):
        ids = [i for r in rig.held.values() for i in r.get(resource, [])]
        assert len(ids) == len(set(ids))
    assert rig.agent is not None and rig.agent.flush(5)
    doc = PodAssignment.decode(
        rig.publisher.pods[("default", "b")]["gpu-share.vendor.com/assignment"]
    )
    assert set(doc.containers) == {"main", "side"}


def test_no_single_device_fits_fails_with_a_clear_message(rig: Rig) -> None:
    rng = random.Random(1)
    rig.admit(pod_view("a", ("main", 5, 0)), rng)
    rig.admit(pod_view("b", ("main", 5, 0)), rng)  # 3 + 3 units left on two devices
    view = pod_view("c", ("main", 6, 0))
    rig.pods.pods[("default", "c")] = view
    rig.publish_pr()
    with pytest.raises(grpc.RpcError) as err:
        rig.clients[MEM].preferred_allocation(rig.free_ids(MEM), [], 6)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "no single device has 6 free memory units" in (err.value.details() or "")
    assert rig.agent is not None and rig.agent.flush(5)
    assert any(r == "NoFit" and who == "default/c" for who, r, _ in rig.publisher.events)


def test_fault_file_marks_units_unhealthy_and_recovers(rig: Rig) -> None:
    devices = sorted(_device_of(rig.all_ids(MEM)))
    write_faults(rig.cfg.dummy.fault_file, [devices[0]])
    latest = rig.clients[MEM].wait_for_list(lambda ds: any(not d.healthy for d in ds), timeout_s=5)
    bad = {parse_unit_id(d.id).device for d in latest if not d.healthy}
    assert bad == {devices[0]}
    write_faults(rig.cfg.dummy.fault_file, [])
    rig.clients[MEM].wait_for_list(lambda ds: all(d.healthy for d in ds), timeout_s=5)


def test_agent_restart_keeps_slices_and_never_gives_one_twice(rig: Rig) -> None:
    rng = random.Random(7)
    rig.admit(pod_view("a", ("main", 6, 60)), rng)
    first = _device_of(rig.held[("default", "a", "main")][MEM])
    rig.stop_agent()
    rig.start_agent()  # same state dir: ledger reloaded, reconciled with PodResources
    # A pod that only fits on an empty device must not be put next to "a".
    rig.admit(pod_view("b", ("main", 4, 60)), rng)
    second = _device_of(rig.held[("default", "b", "main")][MEM])
    assert first.isdisjoint(second)
    assert _device_of(rig.held[("default", "b", "main")][CORE]) == second
