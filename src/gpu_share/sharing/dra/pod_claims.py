"""Which of our devices a DRA pod's claims were allocated (pure; the extender's bind).

kube-scheduler allocates a pod's claims (PreBind) before the extender binds it, so the
bind reads the truth: for each container, its gpu-share pod claims
(``claim_names``), the ResourceClaim each was made as (``status.resourceClaimStatuses``)
and, in that claim, the results of our driver in the node's pool (``gpu-<index>``).
Pods and claims are tenant-written: anything unexpected reads as "not known", and the
caller falls back to its own prediction; nothing here raises on input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_share.sharing.claim_names import template_shape
from gpu_share.sharing.dra.claims import DEVICE_NAME, MAX_RESULTS

MAX_POD_CLAIMS = 128  # far above what a pod spec may list


def _list(value: Any, limit: int) -> list[Any]:
    return value if isinstance(value, list) and len(value) <= limit else []


def _ours(spec: Mapping[str, Any]) -> set[str]:
    """The pod claims made from a gpu-share template."""
    return {
        str(c.get("name"))
        for c in _list(spec.get("resourceClaims"), MAX_POD_CLAIMS)
        if isinstance(c, Mapping) and template_shape(c.get("resourceClaimTemplateName"))
    }


def claim_names(pod: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Container name -> the ResourceClaim names of its gpu-share pod claims (only the
    containers whose every such claim has been made)."""
    spec = pod.get("spec")
    status = pod.get("status")
    if not isinstance(spec, Mapping) or not isinstance(status, Mapping):
        return {}
    ours = _ours(spec)
    made = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in _list(status.get("resourceClaimStatuses"), MAX_POD_CLAIMS)
        if isinstance(s, Mapping)
    }
    out: dict[str, tuple[str, ...]] = {}
    for field in ("initContainers", "containers"):
        for c in _list(spec.get(field), MAX_POD_CLAIMS):
            res = c.get("resources") if isinstance(c, Mapping) else None
            refs = _list(res.get("claims"), MAX_POD_CLAIMS) if isinstance(res, Mapping) else []
            wanted = [r.get("name") for r in refs if isinstance(r, Mapping)]
            names = [made.get(str(w)) for w in wanted if w in ours]
            if names and all(isinstance(n, str) and n for n in names):
                out[str(c.get("name", ""))] = tuple(str(n) for n in names)
    return out


def allocated_indices(claim: Any, driver: str, pool: str) -> tuple[int, ...] | None:
    """Indices of the devices of ``driver`` in ``pool`` the claim was allocated, in
    result order; None when the claim is not allocated (or not readable)."""
    if not isinstance(claim, Mapping):
        return None
    status = claim.get("status")
    alloc = status.get("allocation") if isinstance(status, Mapping) else None
    devices = alloc.get("devices") if isinstance(alloc, Mapping) else None
    if not isinstance(devices, Mapping):
        return None
    out: list[int] = []
    for r in _list(devices.get("results"), MAX_RESULTS):
        if not isinstance(r, Mapping) or r.get("driver") != driver or r.get("pool") != pool:
            continue
        device = r.get("device")
        m = DEVICE_NAME.match(device) if isinstance(device, str) else None
        if m is None:
            return None
        out.append(int(m.group(1)))
    return tuple(out)
