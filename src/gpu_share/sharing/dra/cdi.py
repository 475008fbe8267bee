"""The CDI spec of a prepared DRA claim (``agent/dra/claims.py`` writes it): its file and
device names, and the runtime response as the spec's containerEdits. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_share.devices.base import Device
from gpu_share.sharing.cdi import (
    ENV_CDI_DEVICE_PREFIX,
    cdi_version,
    claim_spec_prefix,
    hook_doc,
)
from gpu_share.sharing.dra.claims import ParsedClaim
from gpu_share.sharing.model import AllocateSpec


def claim_cdi_kind(driver: str) -> str:
    return f"{driver}/claim"


def claim_spec_file_name(driver: str, uid: str) -> str:
    return f"{claim_spec_prefix(driver)}{uid}.json"


def claim_cdi_device_name(uid: str, device: str) -> str:
    return f"{uid}-{device}"


def claim_cdi_device_id(driver: str, uid: str, device: str) -> str:
    """What the kubelet hands the runtime: ``<vendor>/claim=<uid>-<device>``."""
    return f"{claim_cdi_kind(driver)}={claim_cdi_device_name(uid, device)}"


def container_edits(spec: AllocateSpec) -> dict[str, Any]:
    """The runtime response as CDI containerEdits (annotations and CDI names of the
    device-plugin strategies have no place there and are left out)."""
    edits: dict[str, Any] = {}
    if spec.envs:
        edits["env"] = [f"{k}={v}" for k, v in spec.envs.items()]
    if spec.devices:
        edits["deviceNodes"] = [
            {"path": d.container_path, "hostPath": d.host_path, "permissions": d.permissions}
            for d in spec.devices
        ]
    if spec.hooks:
        edits["hooks"] = [hook_doc(h) for h in spec.hooks]
    if spec.mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "type": "bind",
                "options": ["rbind", "ro" if m.read_only else "rw"],
            }
            for m in spec.mounts
        ]
    return edits


def claim_cdi_spec(
    driver: str, claim: ParsedClaim, devices: Mapping[str, Device], spec: AllocateSpec
) -> dict[str, Any]:
    """One spec per claim. The response (visible devices, limits, enforcement) is the
    spec's own containerEdits, applied once whichever of its devices a container gets;
    each device entry names its device (CDI wants edits per device)."""
    kind = claim_cdi_kind(driver)
    entries = [
        {
            "name": claim_cdi_device_name(claim.uid, d.name),
            "containerEdits": {
                "env": [f"{ENV_CDI_DEVICE_PREFIX}{d.index}={devices[d.share.device].uuid}"]
            },
        }
        for d in claim.devices
    ]
    doc: dict[str, Any] = {"cdiVersion": cdi_version(kind), "kind": kind, "devices": entries}
    edits = container_edits(spec)
    if edits:
        doc["containerEdits"] = edits
    return doc
