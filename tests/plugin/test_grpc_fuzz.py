"""L2 fuzz of the device-plugin gRPC surface (v1beta1) of a whole agent on real unix
sockets (dummy backend, PodResources up and empty, so every call is a degraded one):
arbitrary ids (unicode, huge, empty, duplicates, the other resource's), sizes and
must_include lists to GetPreferredAllocation and Allocate. Never INTERNAL/UNKNOWN, the
status message stays small, the ledger never holds a unit twice nor a device over its
capacity."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp
from gpu_share.plugin.server import MAX_STATUS_MESSAGE
from gpu_share.sharing.model import ResourceKind
from tests.agent.served_agent import CORE, MEM, Served, served_agent

ALLOWED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION,
}
# What protobuf strings can carry: any code point but the surrogates.
_CHARS = st.characters(exclude_categories=("Cs",))
_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_agent() as s:
        yield s


def _id(valid: list[str]) -> st.SearchStrategy[str]:
    heads = sorted({v.rsplit("::", 1)[0] for v in valid})
    return st.one_of(
        st.sampled_from(valid),
        st.sampled_from(valid),
        st.builds(lambda h, t: f"{h}::{t}", st.sampled_from(heads), st.text(_CHARS, max_size=12)),
        st.builds(lambda h, d: f"{h}::{d}", st.sampled_from(heads),
                  st.characters(categories=("Nd", "No"))),
        st.text(_CHARS, max_size=40),
        st.just(""),
        st.builds(lambda c, n: c * n, st.sampled_from(["7", "x", "\u0663", "::"]),
                  st.integers(1_000, 300_000)),
    )


def _ids(valid: list[str]) -> st.SearchStrategy[list[str]]:
    def dup(xs: list[str], i: int) -> list[str]:
        return [*xs, xs[i % len(xs)]] if xs else xs

    base = st.lists(_id(valid), max_size=24)
    return st.one_of(base, st.builds(dup, base, st.integers(0, 30)),
                     st.lists(st.sampled_from(valid), max_size=len(valid) + 2))


_SIZES = st.one_of(st.integers(0, 20), st.integers(-(2**31), 2**31 - 1))


def _check_status(err: grpc.RpcError) -> None:
    event(f"status {err.code().name}")
    assert err.code() in ALLOWED, (err.code(), (err.details() or "")[:300])
    assert len(err.details() or "") <= MAX_STATUS_MESSAGE


def _check_ledger(served: Served) -> None:
    engine = served.agent.engine
    assert engine is not None
    with served.agent._lock:  # consistent view while the background loops run
        anomalies = engine.ledger.anomalies(engine.inventory)
        usage = engine.usage()
        devices = engine.inventory.devices
    assert anomalies == [], anomalies[:3]  # no unit held twice, none unknown
    for d in devices:
        for kind in ResourceKind:
            assert 0 <= usage[d.uuid].used(kind) <= d.total(kind), (d.uuid, kind)


def _container_request(
    data: st.DataObject, valid: list[str], own: list[str]
) -> dp.ContainerPreferredAllocationRequest:
    if data.draw(st.booleans(), label="hostile"):
        return dp.ContainerPreferredAllocationRequest(
            available_deviceIDs=data.draw(_ids(valid), label="available"),
            must_include_deviceIDs=data.draw(_ids(valid), label="must_include"),
            allocation_size=data.draw(_SIZES, label="size"),
        )
    # What a kubelet sends: distinct ids of this resource, must_include among them.
    avail = data.draw(st.lists(st.sampled_from(own), unique=True, min_size=1,
                               max_size=len(own)), label="kubelet available")
    size = data.draw(st.integers(1, min(len(avail), 12)), label="kubelet size")
    must = data.draw(st.lists(st.sampled_from(avail), unique=True, max_size=min(size, 3)),
                     label="kubelet must_include")
    return dp.ContainerPreferredAllocationRequest(
        available_deviceIDs=avail, must_include_deviceIDs=must, allocation_size=size
    )


@given(data=st.data())
@_SETTINGS
def test_fuzz_preferred_then_allocate(served: Served, data: st.DataObject) -> None:
    resource = data.draw(st.sampled_from([MEM, CORE]), label="resource")
    own = served.ids[resource]
    valid = own + data.draw(st.sampled_from([[], served.ids[MEM]]))
    n = data.draw(st.integers(1, 3), label="containers")
    request = dp.PreferredAllocationRequest(
        container_requests=[_container_request(data, valid, own) for _ in range(n)]
    )
    served.clock.t += data.draw(st.sampled_from([0.0, 1.0, 45.0]), label="time passes")
    # Drawn before any call: what is drawn must not depend on the agent's answers.
    use_offer = data.draw(st.booleans(), label="allocate the offer")
    other = data.draw(_ids(valid), label="allocate ids otherwise")
    client = served.clients[resource]
    offered: list[str] = []
    try:
        answer = client.preferred_allocation_raw(request)
        offered = list(answer.container_responses[0].deviceIDs)
        event("preferred OK")
    except grpc.RpcError as err:
        _check_status(err)
    ids = offered if offered and use_offer else other
    try:
        client.allocate_raw(
            dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)])
        )
        event("allocate OK")
    except grpc.RpcError as err:
        _check_status(err)
    _check_ledger(served)


@given(data=st.data())
@_SETTINGS
def test_fuzz_allocate_many_containers(served: Served, data: st.DataObject) -> None:
    resource = data.draw(st.sampled_from([MEM, CORE]), label="resource")
    valid = served.ids[resource]
    request = dp.AllocateRequest(
        container_requests=[
            dp.ContainerAllocateRequest(devices_ids=data.draw(st.one_of(
                _ids(valid),
                st.lists(st.sampled_from(valid), unique=True, min_size=1, max_size=8),
            )))
            for _ in range(data.draw(st.integers(0, 4), label="containers"))
        ]
    )
    served.clock.t += data.draw(st.sampled_from([0.0, 45.0]), label="time passes")
    try:
        served.clients[resource].allocate_raw(request)
        event("allocate OK")
    except grpc.RpcError as err:
        _check_status(err)
    _check_ledger(served)
