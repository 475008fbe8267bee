"""The generated modules: wire contract with the kubelet, and reproducible generation."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_share.plugin import protogen
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from gpu_share.plugin.proto import podresources_v1_pb2 as pr
from gpu_share.plugin.proto import podresources_v1_pb2_grpc as pr_grpc

SRC_ROOT = Path(protogen.__file__).resolve().parents[2]


def test_both_protos_live_in_one_process_under_distinct_names() -> None:
    assert dp.DESCRIPTOR.name != pr.DESCRIPTOR.name
    assert dp.DESCRIPTOR.package == "v1beta1"
    assert pr.DESCRIPTOR.package == "v1"
    # Same short names in both files, distinct full names.
    assert dp.TopologyInfo.DESCRIPTOR.full_name == "v1beta1.TopologyInfo"
    assert pr.TopologyInfo.DESCRIPTOR.full_name == "v1.TopologyInfo"
    assert dp.CDIDevice.DESCRIPTOR.full_name == "v1beta1.CDIDevice"
    assert pr.CDIDevice.DESCRIPTOR.full_name == "v1.CDIDevice"
    assert hasattr(dp_grpc, "DevicePluginStub") and hasattr(pr_grpc, "PodResourcesListerStub")


@pytest.mark.parametrize(
    ("service", "methods"),
    [
        (dp.DESCRIPTOR.services_by_name["Registration"], ["Register"]),
        (
            dp.DESCRIPTOR.services_by_name["DevicePlugin"],
            [
                "GetDevicePluginOptions",
                "ListAndWatch",
                "GetPreferredAllocation",
                "Allocate",
                "PreStartContainer",
            ],
        ),
        (
            pr.DESCRIPTOR.services_by_name["PodResourcesLister"],
            ["List", "GetAllocatableResources", "Get"],
        ),
    ],
)
def test_service_paths_match_the_kubelet(service: object, methods: list[str]) -> None:
    full = service.full_name  # type: ignore[attr-defined]
    assert full in {"v1beta1.Registration", "v1beta1.DevicePlugin", "v1.PodResourcesLister"}
    assert [m.name for m in service.methods] == methods  # type: ignore[attr-defined]


def _fields(message: object) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_device_plugin_field_numbers() -> None:
    assert _fields(dp.RegisterRequest) == {
        "version": 1,
        "endpoint": 2,
        "resource_name": 3,
        "options": 4,
    }
    assert _fields(dp.DevicePluginOptions) == {
        "pre_start_required": 1,
        "get_preferred_allocation_available": 2,
    }
    assert _fields(dp.Device) == {"ID": 1, "health": 2, "topology": 3}
    assert _fields(dp.ContainerPreferredAllocationRequest) == {
        "available_deviceIDs": 1,
        "must_include_deviceIDs": 2,
        "allocation_size": 3,
    }
    assert _fields(dp.ContainerAllocateResponse) == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert _fields(dp.Mount) == {"container_path": 1, "host_path": 2, "read_only": 3}
    assert _fields(dp.DeviceSpec) == {"container_path": 1, "host_path": 2, "permissions": 3}


def test_pod_resources_field_numbers() -> None:
    assert _fields(pr.PodResources) == {"name": 1, "namespace": 2, "containers": 3}
    assert _fields(pr.ContainerResources) == {
        "name": 1,
        "devices": 2,
        "cpu_ids": 3,
        "memory": 4,
        "dynamic_resources": 5,
    }
    assert _fields(pr.ContainerDevices) == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert _fields(pr.DynamicResource) == {
        "claim_name": 2,
        "claim_namespace": 3,
        "claim_resources": 4,
    }
    assert _fields(pr.GetPodResourcesRequest) == {"pod_name": 1, "pod_namespace": 2}


def test_allocate_response_wire_bytes() -> None:
    # One CDI device alone encodes as field 5, wire type 2 (0x2a), as the kubelet reads it.
    raw = dp.ContainerAllocateResponse(cdi_devices=[dp.CDIDevice(name="a/b=c")]).SerializeToString()
    assert raw == b"\x2a\x07\x0a\x05a/b=c"


def test_regeneration_is_byte_identical(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    written = protogen.generate(tmp_path)
    expected = protogen.generated_paths()
    assert sorted(p.relative_to(tmp_path) for p in written) == sorted(expected)
    # Both front-ends' stubs, device plugin and DRA, are covered.
    assert {rel.parts[1] for rel in expected} == {"plugin", "dra"}
    for path in written:
        committed = SRC_ROOT / path.relative_to(tmp_path)
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed} differs from fresh protoc output: run hack/gen-proto.sh"
        )
