"""``kubectl gpu-share cordon NODE DEVICE`` / ``uncordon``: stop (or allow again) new slices
on one GPU; running slices stay (sharing/cordon.py has the design).

DEVICE is the index the inventory shows (``0``), the DRA device name (``gpu-0``) or the
device uuid. ``cordon`` writes the annotation ``gpu-share.<domain>/cordon.<uuid>`` with
the caller's own user name (a SelfSubjectReview asks the API server who that is: the
chart's admission policy compares it with the requester) and ``--reason``; ``uncordon``
removes it. ``--wait`` waits until the node's agent says it honours the change (its
inventory's ``cordoned``). Calls: one GET and one PATCH of the node, one
SelfSubjectReview; ``--wait`` adds a GET per half second.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpu_share.errors import GpuShareError
from gpu_share.kube.rest import ApiError, RestClient, quote_name
from gpu_share.sharing.annotations import (
    AnnotationError,
    InventoryAnnotation,
    InventoryDevice,
    inventory_key,
)
from gpu_share.sharing.cordon import (
    MAX_BY,
    MAX_REASON,
    Cordon,
    CordonError,
    cordon_key,
    parse_cordon,
)
from gpu_share.sharing.dra.slices import device_name

MERGE_PATCH = "application/merge-patch+json"
WAIT_POLL_S = 0.5


class CordonCommandError(GpuShareError):
    reason = "CordonFailed"


@dataclass(frozen=True)
class Target:
    node: str
    device: InventoryDevice
    key: str
    current: Cordon | None  # the cordon on it now (None: none, or unreadable)
    current_raw: str | None


def whoami(api: RestClient) -> str:
    """The caller's user name, as the API server authenticates it."""
    review = api.create(
        "self subject review", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    name = ((review.get("status") or {}).get("userInfo") or {}).get("username")
    if not isinstance(name, str) or not name:
        raise CordonCommandError("the API server did not say who you are (SelfSubjectReview)")
    return name


def find_device(inventory: InventoryAnnotation, spec: str) -> InventoryDevice:
    """The device ``spec`` names: an index, ``gpu-<index>`` or a uuid."""
    for d in inventory.devices:
        if spec in (d.id, str(d.index), device_name(d.index)):
            return d
    known = ", ".join(f"{d.index} ({d.id})" for d in inventory.devices) or "none"
    raise CordonCommandError(f"node {inventory.node} has no device {spec!r}; devices: {known}")


def _node(api: RestClient, node: str) -> dict[str, Any]:
    try:
        obj: dict[str, Any] = api.get(f"get node {node}", f"/api/v1/nodes/{quote_name(node)}")
    except ApiError as e:
        if e.status == 404:
            raise CordonCommandError(f'node "{node}" not found') from e
        raise
    return obj


def _inventory(obj: Mapping[str, Any], domain: str) -> InventoryAnnotation:
    meta = obj.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(inventory_key(domain))
    if not text:
        raise CordonCommandError(
            f"node {meta.get('name')} has no gpu-share inventory (annotation"
            f" {inventory_key(domain)}): is the gpu-share agent running there?"
        )
    try:
        return InventoryAnnotation.decode(text)
    except AnnotationError as e:
        raise CordonCommandError(f"node {meta.get('name')}: {e}") from e


def target(api: RestClient, node: str, spec: str, domain: str) -> Target:
    obj = _node(api, node)
    device = find_device(_inventory(obj, domain), spec)
    try:
        key = cordon_key(domain, device.id)
    except ValueError as e:
        raise CordonCommandError(str(e)) from e
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    current = None
    if isinstance(raw, str):
        try:
            current = parse_cordon(raw)
        except CordonError:
            current = None
    return Target(node, device, key, current, raw if isinstance(raw, str) else None)


def _patch(api: RestClient, node: str, annotations: Mapping[str, str | None]) -> None:
    api.patch(f"annotate node {node}", f"/api/v1/nodes/{quote_name(node)}",
              {"metadata": {"annotations": dict(annotations)}}, content_type=MERGE_PATCH)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _name(t: Target) -> str:
    return f"node/{t.node} gpu {t.device.index} ({t.device.id})"


def cordon(api: RestClient, node: str, spec: str, domain: str, reason: str,
           *, user: str | None = None, now: Callable[[], str] = _now) -> str:
    """Write the cordon; the line to print."""
    if len(reason) > MAX_REASON or any(ord(c) < 0x20 or ord(c) == 0x7F for c in reason):
        raise CordonCommandError(
            f"--reason: at most {MAX_REASON} characters, one line")
    t = target(api, node, spec, domain)
    by = user or whoami(api)
    if len(by) > MAX_BY or any(c in by for c in '"\\') or any(ord(c) < 0x20 for c in by):
        raise CordonCommandError(f"user name {by[:80]!r} cannot be written into a cordon")
    if t.current is not None and t.current.by == by and t.current.reason == reason:
        return f"{_name(t)} already cordoned"
    _patch(api, node, {t.key: Cordon(by, reason, now()).encode()})
    return f"{_name(t)} cordoned"


def uncordon(api: RestClient, node: str, spec: str, domain: str) -> str:
    t = target(api, node, spec, domain)
    if t.current_raw is None:
        return f"{_name(t)} already uncordoned"
    _patch(api, node, {t.key: None})
    return f"{_name(t)} uncordoned"


def wait_honoured(api: RestClient, node: str, spec: str, domain: str, cordoned: bool,
                  timeout_s: float, *, sleep: Callable[[float], None] = time.sleep) -> None:
    """Until the node's inventory says the device is (not) cordoned."""
    deadline = time.monotonic() + timeout_s
    while True:
        device = find_device(_inventory(_node(api, node), domain), spec)
        if device.cordoned == cordoned:
            return
        if time.monotonic() >= deadline:
            state = "cordoned" if cordoned else "uncordoned"
            raise CordonCommandError(
                f"the gpu-share agent on {node} did not report gpu {device.index} {state}"
                f" within {timeout_s:g}s (is it running, and able to watch its node?)")
        sleep(WAIT_POLL_S)
