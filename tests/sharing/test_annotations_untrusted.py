"""The inventory and assignment annotations are read by the one untrusted-JSON reader: a
tenant (assignment, on its pod) or a forger (inventory) gets AnnotationError for any field
of the wrong type or out of bounds, never another exception and never a coerced value."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_share.sharing.annotations import (
    AnnotationError,
    ContainerAssignment,
    InventoryAnnotation,
    InventoryDevice,
    PodAssignment,
)
from gpu_share.sharing.model import DeviceShare


def _inventory() -> dict[str, Any]:
    dev = InventoryDevice("GPU-0", 0, "A100", 16, 4, 100, 30, True, 0)
    doc: dict[str, Any] = json.loads(InventoryAnnotation("n1", 1024, (dev,)).encode())
    return doc


def _assignment() -> dict[str, Any]:
    a = PodAssignment({"c": ContainerAssignment((DeviceShare("GPU-0", 4, 30),), "node-agent")})
    doc: dict[str, Any] = json.loads(a.encode())
    return doc


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> str:
    target: Any = doc
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return json.dumps(doc)


def test_the_well_formed_documents_read() -> None:
    inv = InventoryAnnotation.decode(json.dumps(_inventory()))
    assert inv.devices[0].memory_used == 4 and inv.devices[0].numa == 0
    got = PodAssignment.decode(json.dumps(_assignment()))
    assert got.containers["c"].devices == (DeviceShare("GPU-0", 4, 30),)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("unitMiB",), "1024"),
        (("unitMiB",), True),
        (("unitMiB",), -1),
        (("devices", 0, "memoryUnits", "used"), 4.0),
        (("devices", 0, "memoryUnits", "total"), 10**30),
        (("devices", 0, "healthy"), "true"),
        (("devices", 0, "numa"), "0"),
        (("devices", 0, "id"), "x" * 100_000),
        (("devices",), {"id": "GPU-0"}),
        (("node",), None),
    ],
)
def test_inventory_fields_of_the_wrong_type_are_refused(path: tuple[Any, ...], value: Any) -> None:
    with pytest.raises(AnnotationError) as err:
        InventoryAnnotation.decode(_set(_inventory(), path, value))
    assert len(str(err.value)) < 400


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("containers", "c", "devices", 0, "memoryUnits"), "4"),
        (("containers", "c", "devices", 0, "cores"), 30.5),
        (("containers", "c", "devices", 0, "exclusive"), "false"),
        (("containers", "c", "devices", 0, "exclusive"), 0),
        (("containers", "c", "source"), 7),
        (("containers", "c", "devices"), "GPU-0"),
        (("containers",), []),
    ],
)
def test_assignment_fields_of_the_wrong_type_are_refused(path: tuple[Any, ...],
                                                         value: Any) -> None:
    with pytest.raises(AnnotationError) as err:
        PodAssignment.decode(_set(_assignment(), path, value))
    assert len(str(err.value)) < 400
