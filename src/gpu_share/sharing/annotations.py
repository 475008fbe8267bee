"""Versioned JSON annotations the agent publishes (and the scheduler extender reads).

Node ``gpu-share.<domain>/inventory``::

    {"version": "v1", "node": "n1", "unitMiB": 1024,
     "devices": [{"id": "GPU-..", "index": 0, "model": "..", "healthy": true, "numa": 0,
                  "memoryUnits": {"total": 16, "used": 4}, "cores": {"total": 100, "used": 30},
                  "cordoned": true}]}

``cordoned`` (present only when true): an admin stopped new slices on the device
(``sharing.cordon``); ``healthy`` is the device's own health, a separate fact.

Pod ``gpu-share.<domain>/assignment``::

    {"version": "v1", "containers": {"<name>": {"source": "node-agent",
        "devices": [{"id": "GPU-..", "memoryUnits": 4, "cores": 30, "exclusive": false}]}},
     "podUID": "..", "node": "n1", "sig": "<hex HMAC-SHA256>"}

``podUID``, ``node`` and ``sig`` are present when the agent has the extender's key
(``placement.decisionKeyFile``): ``sig`` is the HMAC-SHA256 of ``ASSIGNMENT_MAC_CONTEXT``
followed by the canonical JSON (sorted keys, compact, ASCII) of ``version``, ``podUID``,
``node`` and ``containers``. The extender's view counts an assignment only when
``verify_assignment`` passes for the pod (UID) and node it is on: a tenant can write the
annotation, not a signature, and a genuine one copied onto another pod does not verify.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from gpu_share.errors import GpuShareError
from gpu_share.sharing.decision import mac, sig_matches
from gpu_share.sharing.model import DeviceShare, camel_fields
from gpu_share.sharing.untrusted import MAX_ITEMS, Count, Document, Name, read_value

ANNOTATION_VERSION = "v1"
# Prefixed to the signed bytes so an assignment MAC can never pass as any other MAC.
ASSIGNMENT_MAC_CONTEXT = b"gpu-share/assignment/v1\n"

# AnnotationError reasons of a signed annotation that is not trusted.
MALFORMED = "InvalidAnnotation"
BAD_SIGNATURE = "BadSignature"
UID_MISMATCH = "UidMismatch"
NODE_MISMATCH = "NodeMismatch"


class AnnotationError(GpuShareError):
    reason = "InvalidAnnotation"


def inventory_key(domain: str) -> str:
    return f"gpu-share.{domain}/inventory"


def enforcement_key(domain: str) -> str:
    """The node's enforcement status (agent/enforcement.py), JSON: mode, ready, problems."""
    return f"gpu-share.{domain}/enforcement"


def enforcement_problem(text: str | None) -> str:
    """Why the node cannot enforce its mode, from its enforcement annotation; "" when it
    can, or when the annotation is absent or unreadable (its devices are held back in
    the inventory either way: this only explains)."""
    if not text or len(text) > 16_384:
        return ""
    try:
        doc = json.loads(text)
    except ValueError:
        return ""
    if not isinstance(doc, dict) or doc.get("ready") is not False:
        return ""
    mode = str(doc.get("mode", ""))[:40]
    problems = doc.get("problems")
    said = "; ".join(str(p)[:300] for p in problems[:8]) if isinstance(problems, list) else ""
    return f"enforcement {mode!r} unavailable: {said or 'no reason given'}"


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
    # An admin stopped new slices here (sharing.cordon); written only when true, so an
    # inventory without cordons reads as before.
    cordoned: bool = False


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
                "devices": [_inventory_device(d) for d in self.devices],
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str) -> InventoryAnnotation:
        doc = read_value(_Inventory, _load(text, "inventory"), "inventory", _malformed)
        return cls(doc.node, doc.unit_mib, tuple(d.device() for d in doc.devices))


class _Used(Document):
    total: Count
    used: Count


class _InventoryDevice(Document):
    id: Name
    index: Count
    model: Name
    memory: _Used = Field(alias="memoryUnits")
    cores: _Used
    healthy: bool
    numa: Count | None
    cordoned: bool = False

    def device(self) -> InventoryDevice:
        return InventoryDevice(self.id, self.index, self.model, self.memory.total,
                               self.memory.used, self.cores.total, self.cores.used,
                               self.healthy, self.numa, self.cordoned)


class _Inventory(Document):
    node: Name
    unit_mib: Count = Field(alias="unitMiB")
    devices: Annotated[list[_InventoryDevice], Field(max_length=MAX_ITEMS)]


def _inventory_device(d: InventoryDevice) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": d.id,
        "index": d.index,
        "model": d.model,
        "memoryUnits": {"total": d.memory_total, "used": d.memory_used},
        "cores": {"total": d.cores_total, "used": d.cores_used},
        "healthy": d.healthy,
        "numa": d.numa,
    }
    if d.cordoned:
        out["cordoned"] = True
    return out


@dataclass(frozen=True)
class ContainerAssignment:
    devices: tuple[DeviceShare, ...]
    source: str


@dataclass(frozen=True)
class PodAssignment:
    containers: Mapping[str, ContainerAssignment]

    def encode(self, key: bytes | None = None, *, pod_uid: str = "", node: str = "") -> str:
        """The annotation value; signed for ``pod_uid`` on ``node`` when ``key`` is given."""
        doc: dict[str, Any] = {
            "version": ANNOTATION_VERSION,
            "containers": {
                name: {
                    "devices": [_share_dict(s) for s in c.devices],
                    "source": c.source,
                }
                for name, c in sorted(self.containers.items())
            },
        }
        if key:
            if not pod_uid or not node:
                raise ValueError("a signed assignment needs the pod uid and the node")
            doc["podUID"], doc["node"] = pod_uid, node
            doc["sig"] = mac(_signed_bytes(doc), key)
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> PodAssignment:
        return cls._from_raw(_load(text, "assignment"))

    @classmethod
    def _from_raw(cls, raw: Mapping[str, Any]) -> PodAssignment:
        doc = read_value(_Assignment, raw, "assignment", _malformed)
        return cls({
            name: ContainerAssignment(
                tuple(DeviceShare(s.id, s.memory_units, s.cores, s.exclusive)
                      for s in c.devices),
                c.source,
            )
            for name, c in doc.containers.items()
        })


class _Share(Document):
    id: Name
    memory_units: Count = Field(alias="memoryUnits")
    cores: Count
    exclusive: bool


class _Container(Document):
    devices: Annotated[list[_Share], Field(max_length=MAX_ITEMS)]
    source: Name


class _Assignment(Document):
    containers: dict[Name, _Container]


def verify_assignment(text: str, key: bytes, pod_uid: str, node: str) -> PodAssignment:
    """The assignment in ``text`` if the agent signed it with ``key`` for this pod UID on
    this node; AnnotationError (reason BAD_SIGNATURE, UID_MISMATCH, NODE_MISMATCH or
    MALFORMED) otherwise."""
    raw = _load(text, "assignment")
    try:
        ok = bool(key) and sig_matches(mac(_signed_bytes(raw), key), raw.get("sig"))
    except (ValueError, RecursionError):
        ok = False
    if not ok:
        raise AnnotationError("assignment signature does not verify", reason=BAD_SIGNATURE)
    if not pod_uid or raw.get("podUID") != pod_uid:
        raise AnnotationError("assignment is for another pod uid", reason=UID_MISMATCH)
    if raw.get("node") != node:
        raise AnnotationError("assignment is for another node", reason=NODE_MISMATCH)
    return PodAssignment._from_raw(raw)


def _malformed(message: str) -> AnnotationError:
    return AnnotationError(f"malformed annotation: {message}")


def _signed_bytes(doc: Mapping[str, Any]) -> bytes:
    body = {k: doc.get(k) for k in ("version", "podUID", "node", "containers")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return ASSIGNMENT_MAC_CONTEXT + text.encode()


def _share_dict(s: DeviceShare) -> dict[str, Any]:
    return {"id": s.device, **camel_fields(s, "memory_units", "cores", "exclusive")}


def _load(text: str, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:  # tenant-writable: deep nesting included
        raise AnnotationError(f"{what} annotation is not JSON: {str(e)[:100]}") from e
    if not isinstance(raw, dict):
        raise AnnotationError(f"{what} annotation is not a JSON object")
    if raw.get("version") != ANNOTATION_VERSION:
        raise AnnotationError(
            f"{what} annotation version {raw.get('version')!r} is not supported "
            f"(expected {ANNOTATION_VERSION!r})"
        )
    return raw


def encode_inventory(doc: InventoryAnnotation) -> str:
    return doc.encode()


def encode_assignment(doc: PodAssignment) -> str:
    return doc.encode()
