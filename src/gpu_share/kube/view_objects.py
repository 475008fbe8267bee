"""What the extender's cluster view reads of a node or pod object (``slim_node``,
``slim_pod``: what a list keeps of each) and a node's allocatable CPU and memory."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_share.sharing.quantity import QuantityError, cpu_milli, memory_mib

log = logging.getLogger(__name__)

# A list holds all its objects until they are applied: 50,000 whole pods (managedFields,
# status, env...) took the extender to ~800 MiB RSS at 5,000 nodes; the watch's objects
# are read one at a time and need no trimming.
_POD_META = ("name", "namespace", "uid", "annotations")
_POD_SPEC = ("nodeName", "nodeSelector", "affinity", "overhead")
_CONTAINER = ("name", "resources", "restartPolicy")


def _pick(obj: Any, keys: Sequence[str]) -> Any:
    """Only ``keys`` of a mapping; anything else as it is (malformed stays malformed)."""
    return {k: obj[k] for k in keys if k in obj} if isinstance(obj, Mapping) else obj


def _containers_of(items: Any) -> Any:
    return [_pick(c, _CONTAINER) for c in items] if isinstance(items, list) else items


def slim_pod(obj: dict[str, Any]) -> dict[str, Any]:
    out = {"metadata": _pick(obj.get("metadata"), _POD_META)}
    spec = obj.get("spec")
    if isinstance(spec, Mapping):
        out["spec"] = _pick(spec, _POD_SPEC)
        for field in ("initContainers", "containers"):
            if field in spec:
                out["spec"][field] = _containers_of(spec[field])
    elif spec is not None:
        out["spec"] = spec
    if "status" in obj:
        out["status"] = _pick(obj["status"], ("phase",))
    return out


def slim_node(obj: dict[str, Any]) -> dict[str, Any]:
    out = {"metadata": _pick(obj.get("metadata"), ("name", "labels", "annotations"))}
    if "status" in obj:
        out["status"] = _pick(obj["status"], ("allocatable",))
    return out


def allocatable(node: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The node's allocatable CPU (millicores) and memory (MiB); None = not reported."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    try:
        cpu = cpu_milli(alloc["cpu"], up=False) if "cpu" in alloc else None
        mem = memory_mib(alloc["memory"], up=False) if "memory" in alloc else None
    except QuantityError as e:
        log.warning("node %s: %s", (node.get("metadata") or {}).get("name"), e)
        return (None, None)
    return (cpu, mem)
