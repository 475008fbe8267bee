"""DevicePlugin server over a real unix socket, driven by the kubelet stub's client."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpu_share.devices.base import DeviceNode
from gpu_share.errors import (
    AllocationError,
    ConfigError,
    IdentityError,
    KubeAccessError,
    LedgerError,
)
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp
from gpu_share.plugin.server import REASON_METADATA_KEY, PluginServer, status_for
from gpu_share.sharing.model import AdvertisedDevice, AllocateSpec, Mount
from testkit.fake_handler import FakeHandler
from testkit.kubelet_stub import PluginClient, fast_plugin_settings

OPTS = fast_plugin_settings().serve


@pytest.fixture
def server(sock_dir: Path, handler: FakeHandler) -> Iterator[PluginServer]:
    srv = PluginServer(handler, sock_dir / handler.endpoint, OPTS)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def client(server: PluginServer) -> Iterator[PluginClient]:
    with contextlib.closing(PluginClient(server.socket_path)) as c:
        yield c


def test_options_come_from_handler_flags(sock_dir: Path) -> None:
    h = FakeHandler(preferred_allocation_available=False, pre_start_required=True)
    srv = PluginServer(h, sock_dir / "x.sock", OPTS)
    srv.start()
    c = PluginClient(srv.socket_path)
    try:
        opts = c.options()
        assert opts.pre_start_required is True
        assert opts.get_preferred_allocation_available is False
    finally:
        c.close()
        srv.stop()


def test_list_and_watch_sends_initial_list_then_every_change(
    client: PluginClient, handler: FakeHandler
) -> None:
    handler.devices = [
        AdvertisedDevice("a", healthy=True, numa_node=1),
        AdvertisedDevice("b", healthy=False),
    ]
    client.watch()
    first = client.wait_for_list()
    assert first == [
        AdvertisedDevice("a", healthy=True, numa_node=1),
        AdvertisedDevice("b", healthy=False),
    ]
    handler.set_devices([AdvertisedDevice("a", healthy=False, numa_node=1)])
    client.wait_for_list(lambda devs: devs == [AdvertisedDevice("a", False, 1)])
    handler.set_devices([])
    assert client.wait_for_list(lambda devs: devs == []) == []


def test_stop_ends_list_and_watch_and_removes_socket(
    server: PluginServer, client: PluginClient
) -> None:
    client.watch()
    client.wait_for_list()
    assert server.open_streams == 1
    server.stop()
    assert client.watch_ended.wait(5)
    assert server.stopped and server.open_streams == 0
    assert not server.socket_path.exists()
    server.stop()  # idempotent


def test_stale_socket_file_is_replaced(sock_dir: Path, handler: FakeHandler) -> None:
    path = sock_dir / handler.endpoint
    path.write_text("stale")
    srv = PluginServer(handler, path, OPTS)
    srv.start()
    c = PluginClient(path)
    try:
        assert path.is_socket()
        assert c.options().get_preferred_allocation_available
    finally:
        c.close()
        srv.stop()


def test_preferred_allocation_answers_every_container_request(
    client: PluginClient, handler: FakeHandler
) -> None:
    request = dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=["a", "b", "c"], must_include_deviceIDs=["c"], allocation_size=2
            ),
            dp.ContainerPreferredAllocationRequest(
                available_deviceIDs=["x", "y"], allocation_size=1
            ),
        ]
    )
    answer = client.preferred_allocation_raw(request)
    assert [list(r.deviceIDs) for r in answer.container_responses] == [["c", "a"], ["x"]]
    assert handler.calls == [
        ("preferred_allocation", (("a", "b", "c"), ("c",), 2)),
        ("preferred_allocation", (("x", "y"), (), 1)),
    ]


def test_allocate_maps_every_spec_field(client: PluginClient, handler: FakeHandler) -> None:
    handler.spec = AllocateSpec(
        envs={"A": "1", "B": "two"},
        mounts=(Mount("/c/lib", "/h/lib", read_only=True), Mount("/c/rw", "/h/rw", False)),
        devices=(DeviceNode("/dev/null", "/dev/npu0", "rw"),),
        annotations={"vendor.com/x": "y"},
        cdi_devices=("nvidia.com/gpu=GPU-1",),
    )
    resp = client.allocate(["dev-0", "dev-1"])
    assert dict(resp.envs) == {"A": "1", "B": "two"}
    assert [(m.container_path, m.host_path, m.read_only) for m in resp.mounts] == [
        ("/c/lib", "/h/lib", True),
        ("/c/rw", "/h/rw", False),
    ]
    assert [(d.container_path, d.host_path, d.permissions) for d in resp.devices] == [
        ("/dev/npu0", "/dev/null", "rw")
    ]
    assert dict(resp.annotations) == {"vendor.com/x": "y"}
    assert [c.name for c in resp.cdi_devices] == ["nvidia.com/gpu=GPU-1"]
    assert handler.calls == [("allocate", (("dev-0", "dev-1"),))]


def test_allocate_answers_every_container_request(client: PluginClient) -> None:
    answer = client.allocate_raw(
        dp.AllocateRequest(
            container_requests=[
                dp.ContainerAllocateRequest(devices_ids=["a"]),
                dp.ContainerAllocateRequest(devices_ids=["b", "c"]),
            ]
        )
    )
    assert [dict(r.envs) for r in answer.container_responses] == [
        {"FAKE_DEVICES": "a"},
        {"FAKE_DEVICES": "b,c"},
    ]


def test_pre_start_reaches_handler(client: PluginClient, handler: FakeHandler) -> None:
    client.pre_start(["dev-2"])
    assert handler.calls == [("pre_start", (("dev-2",),))]


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (
            AllocationError("bad ids", reason="UnknownDevice"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "UnknownDevice",
        ),
        (
            AllocationError("no room left", reason="NoFit"),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "NoFit",
        ),
        (IdentityError("which pod?"), grpc.StatusCode.UNAVAILABLE, "IdentityUnknown"),
        (KubeAccessError("api down"), grpc.StatusCode.UNAVAILABLE, "KubeUnreachable"),
        (LedgerError("ledger broken"), grpc.StatusCode.FAILED_PRECONDITION, "LedgerError"),
        (ConfigError("cfg"), grpc.StatusCode.FAILED_PRECONDITION, "InvalidConfig"),
        (ValueError("boom"), grpc.StatusCode.INTERNAL, "Internal"),
    ],
)
@pytest.mark.parametrize("call", ["gpa", "allocate", "pre_start"])
def test_errors_map_to_status_codes_with_message(
    client: PluginClient,
    handler: FakeHandler,
    error: Exception,
    code: grpc.StatusCode,
    reason: str,
    call: str,
) -> None:
    handler.error = error
    with pytest.raises(grpc.RpcError) as info:
        if call == "gpa":
            client.preferred_allocation(["a"], [], 1)
        elif call == "allocate":
            client.allocate(["a"])
        else:
            client.pre_start(["a"])
    exc = info.value
    assert exc.code() is code
    assert str(error) in exc.details()
    metadata = dict(exc.trailing_metadata())
    assert metadata[REASON_METADATA_KEY] == reason


def test_server_keeps_serving_after_an_error(client: PluginClient, handler: FakeHandler) -> None:
    handler.error = AllocationError("nope", reason="NoFit")
    with pytest.raises(grpc.RpcError):
        client.allocate(["a"])
    handler.error = None
    assert dict(client.allocate(["a"]).envs) == {"FAKE_DEVICES": "a"}


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (AllocationError("x", reason="NoFit"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (AllocationError("x", reason="SplitAcrossDevices"), grpc.StatusCode.INVALID_ARGUMENT),
        (AllocationError("x", reason="MemoryRequired"), grpc.StatusCode.INVALID_ARGUMENT),
        (IdentityError("x"), grpc.StatusCode.UNAVAILABLE),
        (KubeAccessError("x"), grpc.StatusCode.UNAVAILABLE),
        (ConfigError("x"), grpc.StatusCode.FAILED_PRECONDITION),
        (ValueError("x"), grpc.StatusCode.INTERNAL),
    ],
)
def test_status_codes_follow_the_reason_table(exc: Exception, code: grpc.StatusCode) -> None:
    assert status_for(exc) is code
