"""The node's ResourceSlice (DRA, resource.k8s.io/v1) built from the inventory (pure).

docs: the DRA contract of docs/dra.md. One slice per node and driver, pool = node name; one
device per healthy device (``gpu-<index>``) that many claims may share
(``allowMultipleAllocations``), with consumable ``memory`` and ``cores`` capacities whose
request policies carry the unit size. ``SliceContent.digest`` covers everything but the
pool generation, so the publisher writes (and bumps the generation) only on a change.

A cordoned device (``sharing.cordon``) stays in the slice, with a ``NoSchedule`` taint
``<driver>/cordoned``: the scheduler allocates no new claim on it, claims already
allocated keep it (the API server keeps the taint only where the DRADeviceTaints
feature is enabled).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_share.sharing.inventory import DeviceCapacity, Inventory

__all__ = [
    "API_VERSION",
    "KIND",
    "SliceContent",
    "device_name",
    "digest_annotation",
    "generate_name",
    "slice_body",
    "slice_content",
    "slice_device",
    "taint_key",
]

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
CORES = "100"  # one device's cores, in percent
# The API server refuses string attributes longer than this.
MAX_STRING_ATTRIBUTE = 64


def device_name(index: int) -> str:
    return f"gpu-{index}"


def generate_name(node_name: str) -> str:
    """The API server appends 5 random characters (and cuts a long prefix itself)."""
    return f"{node_name}-gpu-share-"


def digest_annotation(driver: str) -> str:
    """Annotation holding the content digest of a slice we wrote: the API server rewrites
    quantities to canonical form, so the stored spec cannot be compared to ours."""
    return f"{driver}/content-digest"


def taint_key(driver: str) -> str:
    """The device taint of a cordon: ``<driver>/cordoned`` (a driver name is a DNS
    subdomain, so this is a valid taint key; the default driver makes it
    ``gpu-share.<domain>/cordoned``, the cordon's own name)."""
    return f"{driver}/cordoned"


def _mi(mib: int) -> str:
    return f"{mib}Mi"


def _string(value: str) -> dict[str, str]:
    return {"string": value[:MAX_STRING_ATTRIBUTE]}


def _attributes(d: DeviceCapacity, unit_mib: int, driver_version: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "uuid": _string(d.uuid),
        "model": _string(d.model),
        "index": {"int": d.index},
        "driverVersion": _string(driver_version),
        "memoryUnitMiB": {"int": unit_mib},
    }
    if d.numa_node is not None:
        attrs["numaNode"] = {"int": d.numa_node}
    return attrs


def _capacity(d: DeviceCapacity, unit_mib: int) -> dict[str, Any]:
    memory = _mi(d.memory_units * unit_mib)
    unit = _mi(unit_mib)
    return {
        # No memory in a claim: the whole memory (a container without a memory limit can
        # use all of it).
        "memory": {
            "value": memory,
            "requestPolicy": {"default": memory, "validRange": {"min": unit, "step": unit}},
        },
        "cores": {
            "value": CORES,
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": "1"}},
        },
    }


def slice_device(
    d: DeviceCapacity, unit_mib: int, driver_version: str, *, cordoned_by: str = ""
) -> dict[str, Any]:
    """One device entry of the slice (JSON-ready); ``cordoned_by``: the driver whose
    cordon taint the device carries ("" when not cordoned)."""
    out: dict[str, Any] = {
        "name": device_name(d.index),
        "attributes": _attributes(d, unit_mib, driver_version),
        "capacity": _capacity(d, unit_mib),
        "allowMultipleAllocations": True,
    }
    if cordoned_by:
        out["taints"] = [{"key": taint_key(cordoned_by), "effect": "NoSchedule"}]
    return out


def _offered(d: DeviceCapacity) -> bool:
    # Unhealthy devices are left out; so is one smaller than a memory unit (no slice fits,
    # and a zero capacity would not satisfy its own request policy).
    return d.healthy and d.memory_units >= 1


@dataclass(frozen=True)
class SliceContent:
    """What the slice says, without the pool generation; ``digest`` identifies it."""

    node_name: str
    driver: str
    devices: tuple[Mapping[str, Any], ...]
    digest: str


def _digest(node_name: str, driver: str, devices: list[dict[str, Any]]) -> str:
    canonical = json.dumps(
        {"driver": driver, "nodeName": node_name, "devices": devices},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def slice_content(
    inventory: Inventory, *, node_name: str, driver: str, driver_version: str
) -> SliceContent:
    """The devices the node offers now, in index order."""
    unit = inventory.unit_mib
    devices = [
        slice_device(d, unit, driver_version,
                     cordoned_by=driver if inventory.is_cordoned(d.uuid) else "")
        for d in inventory.devices
        if _offered(d)
    ]
    return SliceContent(
        node_name=node_name,
        driver=driver,
        devices=tuple(devices),
        digest=_digest(node_name, driver, devices),
    )


def slice_body(
    content: SliceContent,
    *,
    generation: int,
    name: str | None = None,
    resource_version: str | None = None,
) -> dict[str, Any]:
    """The ResourceSlice object: with ``name`` (and ``resource_version``) for an update,
    else with ``generateName`` for a create."""
    meta: dict[str, Any] = {"annotations": {digest_annotation(content.driver): content.digest}}
    if name is None:
        meta["generateName"] = generate_name(content.node_name)
    else:
        meta["name"] = name
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": meta,
        "spec": {
            "driver": content.driver,
            "nodeName": content.node_name,
            "pool": {"name": content.node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": [copy.deepcopy(dict(d)) for d in content.devices],
        },
    }
