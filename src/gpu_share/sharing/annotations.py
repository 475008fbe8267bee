"""Versioned JSON annotations the agent publishes (and the scheduler extender reads).

Node ``gpu-share.<domain>/inventory``::

    {"version": "v1", "node": "n1", "unitMiB": 1024,
     "devices": [{"id": "GPU-..", "index": 0, "model": "..", "healthy": true, "numa": 0,
                  "memoryUnits": {"total": 16, "used": 4}, "cores": {"total": 100, "used": 30}}]}

Pod ``gpu-share.<domain>/assignment``::

    {"version": "v1", "containers": {"<name>": {"source": "node-agent",
        "devices": [{"id": "GPU-..", "memoryUnits": 4, "cores": 30, "exclusive": false}]}}}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_share.errors import GpuShareError
from gpu_share.sharing.model import DeviceShare

ANNOTATION_VERSION = "v1"


class AnnotationError(GpuShareError):
    reason = "InvalidAnnotation"


def inventory_key(domain: str) -> str:
    return f"gpu-share.{domain}/inventory"


def assignment_key(domain: str) -> str:
    return f"gpu-share.{domain}/assignment"


def slice_key(domain: str) -> str:
    return f"gpu-share.{domain}/slice"


@dataclass(frozen=True)
class InventoryDevice:
    id: str
    index: int
    model: str
    memory_total: int
    memory_used: int
    cores_total: int
    cores_used: int
    healthy: bool
    numa: int | None


@dataclass(frozen=True)
class InventoryAnnotation:
    node: str
    unit_mib: int
    devices: tuple[InventoryDevice, ...]

    def encode(self) -> str:
        return json.dumps(
            {
                "version": ANNOTATION_VERSION,
                "node": self.node,
                "unitMiB": self.unit_mib,
                "devices": [
                    {
                        "id": d.id,
                        "index": d.index,
                        "model": d.model,
                        "memoryUnits": {"total": d.memory_total, "used": d.memory_used},
                        "cores": {"total": d.cores_total, "used": d.cores_used},
                        "healthy": d.healthy,
                        "numa": d.numa,
                    }
                    for d in self.devices
                ],
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str) -> InventoryAnnotation:
        raw = _load(text, "inventory")
        try:
            devices = tuple(
                InventoryDevice(
                    id=_str(d["id"]),
                    index=_int(d["index"]),
                    model=_str(d["model"]),
                    memory_total=_int(d["memoryUnits"]["total"]),
                    memory_used=_int(d["memoryUnits"]["used"]),
                    cores_total=_int(d["cores"]["total"]),
                    cores_used=_int(d["cores"]["used"]),
                    healthy=_bool(d["healthy"]),
                    numa=None if d["numa"] is None else _int(d["numa"]),
                )
                for d in raw["devices"]
            )
            return cls(_str(raw["node"]), _int(raw["unitMiB"]), devices)
        except (KeyError, TypeError, ValueError) as e:
            raise AnnotationError(f"inventory annotation is malformed: {e!r}") from e


@dataclass(frozen=True)
class ContainerAssignment:
    devices: tuple[DeviceShare, ...]
    source: str


@dataclass(frozen=True)
class PodAssignment:
    containers: Mapping[str, ContainerAssignment]

    def encode(self) -> str:
        return json.dumps(
            {
                "version": ANNOTATION_VERSION,
                "containers": {
                    name: {
                        "devices": [_share_dict(s) for s in c.devices],
                        "source": c.source,
                    }
                    for name, c in sorted(self.containers.items())
                },
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str) -> PodAssignment:
        raw = _load(text, "assignment")
        try:
            containers = {
                _str(name): ContainerAssignment(
                    tuple(
                        DeviceShare(
                            _str(s["id"]),
                            _int(s["memoryUnits"]),
                            _int(s["cores"]),
                            _bool(s["exclusive"]),
                        )
                        for s in c["devices"]
                    ),
                    _str(c["source"]),
                )
                for name, c in raw["containers"].items()
            }
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise AnnotationError(f"assignment annotation is malformed: {e!r}") from e
        return cls(containers)


def _share_dict(s: DeviceShare) -> dict[str, Any]:
    return {
        "id": s.device,
        "memoryUnits": s.memory_units,
        "cores": s.cores,
        "exclusive": s.exclusive,
    }


def _load(text: str, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise AnnotationError(f"{what} annotation is not JSON: {e}") from e
    if not isinstance(raw, dict):
        raise AnnotationError(f"{what} annotation is not a JSON object")
    if raw.get("version") != ANNOTATION_VERSION:
        raise AnnotationError(
            f"{what} annotation version {raw.get('version')!r} is not supported "
            f"(expected {ANNOTATION_VERSION!r})"
        )
    return raw


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {v!r}")
    return v


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TypeError(f"expected a non-negative integer, got {v!r}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"expected a boolean, got {v!r}")
    return v


def encode_inventory(doc: InventoryAnnotation) -> str:
    return doc.encode()


def encode_assignment(doc: PodAssignment) -> str:
    return doc.encode()
