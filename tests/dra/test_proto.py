"""The DRA and plugin-registration stubs speak the kubelet's wire: packages, service
paths, field numbers; v1 and v1beta1 are the same messages (the service reads both
with one set of classes)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_share.dra.proto import dra_v1_pb2 as v1
from gpu_share.dra.proto import dra_v1beta1_pb2 as v1beta1
from gpu_share.dra.proto import pluginregistration_v1_pb2 as reg
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp


def _fields(message: Any) -> dict[str, tuple[int, int, bool]]:
    return {f.name: (f.number, f.type, f.is_repeated) for f in message.DESCRIPTOR.fields}


def test_packages_and_service_paths() -> None:
    assert v1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert v1beta1.DESCRIPTOR.package == "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    assert reg.DESCRIPTOR.package == "pluginregistration"
    for pb, version in ((v1, "v1"), (v1beta1, "v1beta1")):
        service = pb.DESCRIPTOR.services_by_name["DRAPlugin"]
        assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
        assert [m.name for m in service.methods] == [
            "NodePrepareResources",
            "NodeUnprepareResources",
        ]
    service = reg.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]


def test_no_clash_with_the_device_plugin_protos_in_one_process() -> None:
    # Both declare a "Device" message; distinct packages keep them apart.
    assert dp.Device.DESCRIPTOR.full_name == "v1beta1.Device"
    assert v1beta1.Device.DESCRIPTOR.full_name == "k8s.io.kubelet.pkg.apis.dra.v1beta1.Device"


@pytest.mark.parametrize("pb", [v1, v1beta1], ids=["v1", "v1beta1"])
def test_dra_field_numbers(pb: Any) -> None:
    assert {k: v[0] for k, v in _fields(pb.Claim).items()} == {
        "namespace": 1,
        "uid": 2,
        "name": 3,
    }
    assert {k: v[0] for k, v in _fields(pb.Device).items()} == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
    }
    assert {k: v[0] for k, v in _fields(pb.NodePrepareResourceResponse).items()} == {
        "devices": 1,
        "error": 2,
    }
    assert {k: v[0] for k, v in _fields(pb.NodeUnprepareResourceResponse).items()} == {
        "error": 1
    }
    for name in (
        "NodePrepareResourcesRequest",
        "NodePrepareResourcesResponse",
        "NodeUnprepareResourcesRequest",
        "NodeUnprepareResourcesResponse",
    ):
        assert [f.number for f in getattr(pb, name).DESCRIPTOR.fields] == [1]
    # claims of the responses: map<string, entry>, keyed by claim uid.
    claims = pb.NodePrepareResourcesResponse.DESCRIPTOR.fields_by_name["claims"]
    assert claims.message_type.GetOptions().map_entry


def test_registration_field_numbers() -> None:
    assert {k: v[0] for k, v in _fields(reg.PluginInfo).items()} == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert {k: v[0] for k, v in _fields(reg.RegistrationStatus).items()} == {
        "plugin_registered": 1,
        "error": 2,
    }
    assert _fields(reg.InfoRequest) == {}
    assert _fields(reg.RegistrationStatusResponse) == {}


def _shape(descriptor: Any) -> list[tuple[str, int, int, bool, str]]:
    return [
        (
            f.name,
            f.number,
            f.type,
            f.is_repeated,
            f.message_type.name if f.message_type is not None else "",
        )
        for f in descriptor.fields
    ]


def test_v1_and_v1beta1_are_wire_identical() -> None:
    # The service reads v1beta1 requests with the v1 classes; this is what allows it.
    names = sorted(v1.DESCRIPTOR.message_types_by_name)
    assert names == sorted(v1beta1.DESCRIPTOR.message_types_by_name)
    for name in names:
        a = v1.DESCRIPTOR.message_types_by_name[name]
        b = v1beta1.DESCRIPTOR.message_types_by_name[name]
        assert _shape(a) == _shape(b), name
        for nested_a, nested_b in zip(a.nested_types, b.nested_types, strict=True):
            assert _shape(nested_a) == _shape(nested_b), name


def test_prepare_response_bytes() -> None:
    # claims["u"] = {devices: [{pool_name: "p"}]} as the kubelet decodes it.
    response = v1.NodePrepareResourcesResponse()
    response.claims["u"].devices.add(pool_name="p")
    assert response.SerializeToString() == b"\x0a\x0a\x0a\x01u\x12\x05\x0a\x03\x12\x01p"
    again = v1beta1.NodePrepareResourcesResponse.FromString(response.SerializeToString())
    assert again.claims["u"].devices[0].pool_name == "p"
