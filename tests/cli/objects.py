"""Node and pod objects as the API server answers them, for the kubectl plugin tests."""

from __future__ import annotations

from typing import Any

from gpu_share.sharing.annotations import (
    ContainerAssignment,
    InventoryAnnotation,
    InventoryDevice,
    PodAssignment,
    assignment_key,
    inventory_key,
)
from gpu_share.sharing.model import DeviceShare

DOMAIN = "vendor.com"
MEM, CORE = f"{DOMAIN}/vcuda-memory", f"{DOMAIN}/vcuda-core"
POOL = f"gpu-share.{DOMAIN}/pool"
KEY = b"kubectl-plugin-test-key-0123456789"

# (memory total, memory used, cores used, healthy) per device
Dev = tuple[int, int, int, bool]


def inventory(node: str, devices: list[Dev], model: str = "Tesla T4") -> str:
    return InventoryAnnotation(
        node,
        1024,
        tuple(
            InventoryDevice(f"GPU-{node}-{i}", i, model, mt, mu, 100, cu, ok, 0)
            for i, (mt, mu, cu, ok) in enumerate(devices)
        ),
    ).encode()


def node_obj(name: str, devices: list[Dev] | None, *, pool: str = "", model: str = "Tesla T4",
             cpu: str = "16", memory: str = "64Gi", labels: dict[str, str] | None = None
             ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if pool:
        meta["labels"][POOL] = pool
    if devices is not None:
        meta["annotations"] = {inventory_key(DOMAIN): inventory(name, devices, model)}
    alloc = {"cpu": cpu, "memory": memory}
    return {"metadata": meta, "status": {"allocatable": alloc, "capacity": alloc}}


def assignment(node: str, shares: dict[str, list[tuple[int, int, int, bool]]],
               source: str = "node-agent", uid: str = "", key: bytes | None = None) -> str:
    """``shares``: container -> [(device index, memory units, cores, exclusive)]."""
    doc = PodAssignment({
        c: ContainerAssignment(
            tuple(DeviceShare(f"GPU-{node}-{i}", m, k, x) for i, m, k, x in s), source)
        for c, s in shares.items()
    })
    return doc.encode(key, pod_uid=uid, node=node) if key else doc.encode()


def pod_obj(name: str, node: str | None, asks: dict[str, tuple[int, int]], *,
            namespace: str = "team-a", annotation: str | None = None,
            created: str = "2026-01-01T00:00:00Z", cpu: str = "1", memory: str = "1Gi",
            phase: str = "Running", uid: str = "") -> dict[str, Any]:
    containers = []
    for c, (m, k) in asks.items():
        limits: dict[str, str] = {}
        if m:
            limits[MEM] = str(m)
        if k:
            limits[CORE] = str(k)
        containers.append({"name": c, "image": "busybox", "resources": {
            "limits": limits, "requests": {"cpu": cpu, "memory": memory, **limits}}})
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
                            "creationTimestamp": created}
    if annotation:
        meta["annotations"] = {assignment_key(DOMAIN): annotation}
    spec: dict[str, Any] = {"containers": containers}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}
