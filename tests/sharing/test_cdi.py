"""The CDI spec of a node's devices (sharing/cdi.py): names match what response.py hands
out, and devices another spec of the same kind defines are never defined twice."""

from __future__ import annotations

from gpu_share.config.model import RuntimeConfig
from gpu_share.devices.base import Device, DeviceNode, RuntimeNaming
from gpu_share.sharing.cdi import (
    ENV_CDI_DEVICE_PREFIX,
    cdi_version,
    foreign_spec,
    plan_spec,
    spec_file_name,
    uses_cdi,
)

KIND = "nvidia.com/gpu"


def _gpu(i: int) -> Device:
    return Device(
        uuid=f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd",
        index=i,
        minor=i,
        memory_mib=16384,
        model="A100",
        nodes=(DeviceNode(host_path=f"/dev/nvidia{i}", container_path=f"/dev/nvidia{i}"),),
    )


NAMING = RuntimeNaming(
    visible_devices_env="NVIDIA_VISIBLE_DEVICES",
    shared_nodes=(DeviceNode("/dev/nvidiactl", "/dev/nvidiactl"),),
)


def _rt(*strategies: str) -> RuntimeConfig:
    return RuntimeConfig.model_validate({"deviceListStrategy": list(strategies)})


def test_uses_cdi_only_for_the_cdi_strategies() -> None:
    assert uses_cdi(_rt("cdi-cri"))
    assert uses_cdi(_rt("envvar", "cdi-annotations"))
    assert not uses_cdi(_rt("envvar", "volume-mounts"))


def test_version_and_file_name() -> None:
    assert cdi_version("nvidia.com/gpu") == "0.5.0"  # hostPath of device nodes
    assert cdi_version("vendor.com/npu.v2") == "0.6.0"  # dot in the name segment
    assert spec_file_name("nvidia.com/gpu") == "gpu-share_nvidia.com-gpu.json"


def test_spec_names_devices_by_uuid_with_their_nodes_and_env() -> None:
    plan = plan_spec(KIND, [_gpu(1), _gpu(0)], NAMING)
    spec = plan.spec
    assert spec is not None
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == KIND
    assert [d["name"] for d in spec["devices"]] == [_gpu(0).uuid, _gpu(1).uuid]
    dev1 = spec["devices"][1]["containerEdits"]
    assert dev1["deviceNodes"] == [
        {"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1", "permissions": "rw"}
    ]
    assert dev1["env"] == [f"{ENV_CDI_DEVICE_PREFIX}1={_gpu(1).uuid}"]
    # Shared nodes once, spec-wide (applied whenever any device of the spec is asked for).
    assert spec["containerEdits"] == {
        "deviceNodes": [
            {"path": "/dev/nvidiactl", "hostPath": "/dev/nvidiactl", "permissions": "rw"}
        ]
    }
    assert plan.referenced == () and plan.shadowed == () and plan.invalid == ()


def test_no_shared_edits_without_naming_and_invalid_names_left_out() -> None:
    bad = Device(uuid="GPU-x/1", index=5, minor=5, memory_mib=1, model="m")
    plan = plan_spec(KIND, [_gpu(0), bad], None)
    assert plan.spec is not None and "containerEdits" not in plan.spec
    assert [d["name"] for d in plan.spec["devices"]] == [_gpu(0).uuid]
    assert plan.invalid == ("GPU-x/1",)


def _nvidia_ctk(names_to_minors: dict[str, list[int]]) -> dict:
    return {
        "cdiVersion": "0.5.0",
        "kind": KIND,
        "devices": [
            {
                "name": name,
                "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{m}"} for m in minors]},
            }
            for name, minors in names_to_minors.items()
        ],
        "containerEdits": {"mounts": [{"hostPath": "/usr/lib/libcuda.so", "containerPath": "/x"}]},
    }


def test_devices_named_by_uuid_elsewhere_are_referenced_not_duplicated() -> None:
    other = foreign_spec("/etc/cdi/nvidia.yaml", _nvidia_ctk({_gpu(0).uuid: [0]}), KIND)
    assert other is not None
    plan = plan_spec(KIND, [_gpu(0), _gpu(1)], NAMING, [other])
    assert plan.spec is not None
    assert [d["name"] for d in plan.spec["devices"]] == [_gpu(1).uuid]
    assert plan.referenced == ((_gpu(0).uuid, "/etc/cdi/nvidia.yaml"),)


def test_every_device_defined_elsewhere_means_no_spec_of_ours() -> None:
    doc = _nvidia_ctk({_gpu(0).uuid: [0], _gpu(1).uuid: [1], "all": [0, 1]})
    other = foreign_spec("/etc/cdi/nvidia.yaml", doc, KIND)
    assert other is not None
    plan = plan_spec(KIND, [_gpu(0), _gpu(1)], NAMING, [other])
    assert plan.spec is None
    assert len(plan.referenced) == 2


def test_devices_named_by_index_elsewhere_are_shadowed_and_reported() -> None:
    doc = _nvidia_ctk({"0": [0], "1": [1], "all": [0, 1]})
    other = foreign_spec("/var/run/cdi/nvidia.yaml", doc, KIND)
    assert other is not None
    plan = plan_spec(KIND, [_gpu(0), _gpu(1), _gpu(2)], NAMING, [other])
    assert plan.spec is not None
    assert [d["name"] for d in plan.spec["devices"]] == [_gpu(2).uuid]
    assert plan.shadowed == (
        (_gpu(0).uuid, "/var/run/cdi/nvidia.yaml", ("0", "all")),
        (_gpu(1).uuid, "/var/run/cdi/nvidia.yaml", ("1", "all")),
    )


def test_other_kinds_and_malformed_documents_are_ignored() -> None:
    assert foreign_spec("a.json", {"kind": "example.com/resource", "devices": []}, KIND) is None
    assert foreign_spec("a.json", ["not", "a", "spec"], KIND) is None
    odd = foreign_spec(
        "a.json",
        {"kind": KIND, "devices": [7, {"name": 3}, {"name": "ok", "containerEdits": "x"}]},
        KIND,
    )
    assert odd is not None and dict(odd.names) == {"ok": frozenset()}
    # A device without nodes of its own never counts as defining one of ours by nodes.
    plan = plan_spec(KIND, [_gpu(0)], NAMING, [odd])
    assert plan.spec is not None and plan.shadowed == ()
