"""The node's ResourceSlice body (the DRA contract), built from the inventory."""

from __future__ import annotations

from fractions import Fraction

from gpu_share.devices.base import Device
from gpu_share.sharing.dra.slices import (
    API_VERSION,
    digest_annotation,
    slice_body,
    slice_content,
)
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.quantity import parse_quantity

DRIVER = "gpu-share.vendor.com"
NODE = "node-a"


def dev(i: int, *, mib: int = 16384, healthy: bool = True, numa: int | None = 0) -> Device:
    return Device(uuid=f"GPU-{i:04d}", index=i, minor=i, memory_mib=mib, model="Tesla T4",
                  numa_node=numa, healthy=healthy)


def inv(*devices: Device, unit: int = 1024) -> Inventory:
    return Inventory.from_devices(list(devices), unit)


def test_body_is_exactly_the_contract() -> None:
    c = slice_content(inv(dev(0), dev(1, numa=None)), node_name=NODE, driver=DRIVER,
                      driver_version="550.54.15")
    body = slice_body(c, generation=3)
    assert body["apiVersion"] == API_VERSION == "resource.k8s.io/v1"
    assert body["kind"] == "ResourceSlice"
    assert body["metadata"] == {
        "generateName": "node-a-gpu-share-",
        "annotations": {f"{DRIVER}/content-digest": c.digest},
    }
    spec = body["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 1}
    d0, d1 = spec["devices"]
    assert d0 == {
        "name": "gpu-0",
        "allowMultipleAllocations": True,
        "attributes": {
            "uuid": {"string": "GPU-0000"},
            "model": {"string": "Tesla T4"},
            "index": {"int": 0},
            "numaNode": {"int": 0},
            "driverVersion": {"string": "550.54.15"},
            "memoryUnitMiB": {"int": 1024},
        },
        "capacity": {
            "memory": {
                "value": "16384Mi",
                "requestPolicy": {
                    "default": "16384Mi",
                    "validRange": {"min": "1024Mi", "step": "1024Mi"},
                },
            },
            "cores": {
                "value": "100",
                "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}},
            },
        },
    }
    assert d1["name"] == "gpu-1"
    assert "numaNode" not in d1["attributes"]  # unknown: omitted


def test_memory_is_whole_units_of_the_unit_size() -> None:
    c = slice_content(inv(dev(0, mib=15109), unit=1000), node_name=NODE, driver=DRIVER,
                      driver_version="x")
    mem = c.devices[0]["capacity"]["memory"]
    assert mem["value"] == "15000Mi"  # 15 units of 1000 MiB; the rest is not offered
    assert mem["requestPolicy"]["validRange"] == {"min": "1000Mi", "step": "1000Mi"}
    assert parse_quantity(mem["value"]) == Fraction(15000 * 2**20)


def test_unhealthy_and_too_small_devices_are_left_out() -> None:
    i = inv(dev(0), dev(1, healthy=False), dev(2, mib=512), dev(3))
    c = slice_content(i, node_name=NODE, driver=DRIVER, driver_version="x")
    assert [d["name"] for d in c.devices] == ["gpu-0", "gpu-3"]
    everything_down = inv(dev(0, healthy=False))
    assert slice_content(everything_down, node_name=NODE, driver=DRIVER,
                         driver_version="x").devices == ()


def test_digest_is_stable_and_follows_every_change() -> None:
    base = inv(dev(0), dev(1))

    def digest(i: Inventory, **kw: str) -> str:
        args = {"node_name": NODE, "driver": DRIVER, "driver_version": "v1", **kw}
        return slice_content(i, **args).digest  # type: ignore[arg-type]

    d = digest(base)
    assert d == digest(inv(dev(1), dev(0)))  # order of discovery does not matter
    assert d == digest(base.with_health("GPU-0001", True))
    others = {
        digest(base.with_health("GPU-0001", False)),
        digest(inv(dev(0), dev(1), unit=512)),
        digest(base, driver_version="v2"),
        digest(base, node_name="node-b"),
        digest(base, driver="other.example.com"),
        digest(inv(dev(0), dev(1, numa=1))),
    }
    assert d not in others and len(others) == 6
    # The generation is not part of it: a bump does not make the content "new".
    c = slice_content(base, node_name=NODE, driver=DRIVER, driver_version="v1")
    ann = digest_annotation(DRIVER)
    assert (slice_body(c, generation=1)["metadata"]["annotations"][ann]
            == slice_body(c, generation=9)["metadata"]["annotations"][ann])


def test_update_body_names_the_slice_and_its_version() -> None:
    c = slice_content(inv(dev(0)), node_name=NODE, driver=DRIVER, driver_version="x")
    meta = slice_body(c, generation=2, name="node-a-gpu-share-abcde", resource_version="41")[
        "metadata"
    ]
    assert meta["name"] == "node-a-gpu-share-abcde" and meta["resourceVersion"] == "41"
    assert "generateName" not in meta


def test_long_strings_are_cut_to_the_attribute_limit() -> None:
    long = Device(uuid="GPU-1", index=0, minor=0, memory_mib=4096, model="M" * 100)
    c = slice_content(inv(long), node_name=NODE, driver=DRIVER, driver_version="v" * 80)
    attrs = c.devices[0]["attributes"]
    assert len(attrs["model"]["string"]) == 64
    assert len(attrs["driverVersion"]["string"]) == 64


def test_body_does_not_share_state_with_the_content() -> None:
    c = slice_content(inv(dev(0)), node_name=NODE, driver=DRIVER, driver_version="x")
    body = slice_body(c, generation=1)
    body["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1Mi"
    assert c.devices[0]["capacity"]["memory"]["value"] == "16384Mi"
