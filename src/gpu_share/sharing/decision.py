"""The scheduler extender's signed placement decision (pod annotation, pure, stdlib hmac).

Pod ``gpu-share.<domain>/decision``::

    {"version": "v1", "sig": "<hex HMAC-SHA256 of the canonical payload>",
     "payload": {"podUID": "..", "node": "n1", "issuedAt": 1700000000,
                 "containers": {"<name>": {"devices": ["GPU-.."],
                                           "request": {"memoryUnits": 4, "cores": 30}}}}}

The canonical payload is the payload as compact JSON with sorted keys (UTF-8). The key is
shared by the extender and the node agents (a Secret mounted as a file in both). The agent
accepts a decision only when ``verify`` passes for the pod it is admitting; a decision that
fails is ignored and the agent places by its own policy (and should emit an Event).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gpu_share.errors import GpuShareError
from gpu_share.sharing.model import ContainerRequest, PodView

DECISION_VERSION = "v1"
DEFAULT_MAX_AGE_S = 900.0  # bind -> kubelet admission is normally seconds
CLOCK_SKEW_S = 60.0


def decision_key(domain: str) -> str:
    return f"gpu-share.{domain}/decision"


class DecisionError(GpuShareError):
    """A decision annotation cannot be trusted. Reasons: MalformedDecision, BadSignature,
    UidMismatch, NodeMismatch, RequestMismatch, DecisionExpired."""

    reason = "InvalidDecision"


_T = TypeVar("_T")
# The file beside the decision key file holding the key before the last rotation.
PREVIOUS_KEY_FILE = "previous"


def under_any_key(keys: Sequence[bytes], check: Callable[[bytes], _T]) -> _T:
    """``check(key)`` with the current key (first), else with the previous one(s): during
    a key rotation's rollout some pods sign with the old key and some with the new. Only
    a signature that does not verify is tried again; any other refusal stands."""
    if not keys:
        raise DecisionError("no decision key", reason="BadSignature")
    for key in keys[:-1]:
        try:
            return check(key)
        except GpuShareError as e:
            if e.reason != "BadSignature":
                raise
    return check(keys[-1])


@dataclass(frozen=True)
class ContainerDecision:
    devices: tuple[str, ...]  # device uuids, in the order the extender chose them
    request: ContainerRequest  # what the container asked when the decision was made


@dataclass(frozen=True)
class Decision:
    pod_uid: str
    node: str
    containers: Mapping[str, ContainerDecision]
    issued_at: int  # epoch seconds

    def devices_of(self, container: str) -> tuple[str, ...] | None:
        c = self.containers.get(container)
        return None if c is None else c.devices

    def payload(self) -> dict[str, Any]:
        return {
            "podUID": self.pod_uid,
            "node": self.node,
            "issuedAt": self.issued_at,
            "containers": {
                name: {
                    "devices": list(c.devices),
                    "request": {"memoryUnits": c.request.memory_units, "cores": c.request.cores},
                }
                for name, c in sorted(self.containers.items())
            },
        }


def canonical(decision: Decision) -> bytes:
    return _canonical(decision.payload())


def _canonical(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _mac(payload: bytes, key: bytes) -> str:
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


def mac(data: bytes, key: bytes) -> str:
    """Hex HMAC-SHA256 of ``data`` (shared by every signed gpu-share annotation)."""
    return _mac(data, key)


def sig_matches(expected: str, sig: object) -> bool:
    """Constant-time comparison of a hex MAC with a tenant-supplied value of any type
    (``hmac.compare_digest`` raises TypeError on non-ASCII str)."""
    return isinstance(sig, str) and sig.isascii() and hmac.compare_digest(expected, sig)


def sign(decision: Decision, key: bytes) -> str:
    """The annotation value: payload plus its HMAC-SHA256 under ``key``."""
    if not key:
        raise ValueError("empty decision key")
    payload = decision.payload()
    return json.dumps(
        {"version": DECISION_VERSION, "payload": payload, "sig": _mac(_canonical(payload), key)},
        sort_keys=True,
        separators=(",", ":"),
    )


def decode_unverified(text: str) -> Decision:
    """Parse without checking anything but the shape (for display only)."""
    return _decode(_load(text)[0])


def verify(
    text: str,
    key: bytes,
    pod: PodView,
    now: float,
    *,
    node: str | None = None,
    max_age_s: float = DEFAULT_MAX_AGE_S,
) -> Decision:
    """The decision in ``text`` if it is authentic and still matches ``pod``.

    Checks, in order: shape, signature (constant-time), pod UID, node (when given), that
    every container of ``pod`` requesting our resources has an entry with exactly its
    current request and no entry names another container, and age (``issuedAt`` within
    ``max_age_s`` before ``now`` and not more than the clock skew after it).
    """
    payload, sig = _load(text)
    try:
        ok = bool(key) and sig_matches(_mac(_canonical(payload), key), sig)
    except (ValueError, RecursionError):  # a payload that cannot be re-encoded
        ok = False
    if not ok:
        raise DecisionError("decision signature does not verify", reason="BadSignature")
    d = _decode(payload)
    if d.pod_uid != pod.uid:
        raise DecisionError(
            f"decision is for pod uid {d.pod_uid!r}, not {pod.uid!r}", reason="UidMismatch"
        )
    if node is not None and d.node != node:
        raise DecisionError(f"decision is for node {d.node!r}, not {node!r}", reason="NodeMismatch")
    wanted = {c.name: c.request for c in pod.containers if not c.request.empty}
    for name, req in wanted.items():
        got = d.containers.get(name)
        if got is None or got.request != req:
            raise DecisionError(
                f"decision for container {name!r} was made for "
                f"{None if got is None else got.request}, the pod asks {req}",
                reason="RequestMismatch",
            )
    extra = sorted(set(d.containers) - set(wanted))
    if extra:
        raise DecisionError(
            f"decision names containers the pod does not request for: {extra}",
            reason="RequestMismatch",
        )
    if now - d.issued_at > max_age_s or d.issued_at - now > CLOCK_SKEW_S:
        raise DecisionError(
            f"decision issued at {d.issued_at} is outside [{now - max_age_s:.0f}, "
            f"{now + CLOCK_SKEW_S:.0f}]",
            reason="DecisionExpired",
        )
    return d


def verify_binding(text: str, key: bytes, pod_uid: str, node: str) -> Decision:
    """The decision in ``text`` if it is authentic and was made for this pod (UID) on this
    node. For the extender's view of bound pods: no age or request check (a running pod's
    decision is old; requests of extended resources cannot change)."""
    payload, sig = _load(text)
    try:
        ok = bool(key) and sig_matches(_mac(_canonical(payload), key), sig)
    except (ValueError, RecursionError):
        ok = False
    if not ok:
        raise DecisionError("decision signature does not verify", reason="BadSignature")
    d = _decode(payload)
    if not pod_uid or d.pod_uid != pod_uid:
        raise DecisionError("decision is for another pod uid", reason="UidMismatch")
    if d.node != node:
        raise DecisionError("decision is for another node", reason="NodeMismatch")
    return d


def _load(text: str) -> tuple[dict[str, Any], str]:
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:  # tenant-writable: deep nesting included
        raise DecisionError(
            f"decision is not JSON: {str(e)[:100]}", reason="MalformedDecision"
        ) from e
    if not isinstance(raw, dict) or raw.get("version") != DECISION_VERSION:
        raise DecisionError(
            f"decision version is not {DECISION_VERSION!r}", reason="MalformedDecision"
        )
    payload, sig = raw.get("payload"), raw.get("sig")
    if not isinstance(payload, dict) or not isinstance(sig, str):
        raise DecisionError("decision lacks payload or sig", reason="MalformedDecision")
    return payload, sig


def _small_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**63


def _decode(p: Mapping[str, Any]) -> Decision:
    try:
        containers = {}
        for name, c in p["containers"].items():
            devices = tuple(c["devices"])
            req = c["request"]
            m, k = req["memoryUnits"], req["cores"]
            if not all(isinstance(x, str) for x in devices) or not isinstance(name, str):
                raise TypeError("device ids and names must be strings")
            if not all(_small_int(x) for x in (m, k)):
                raise TypeError("request amounts must be integers in [0, 2**63)")
            containers[name] = ContainerDecision(devices, ContainerRequest(m, k))
        uid, node, at = p["podUID"], p["node"], p["issuedAt"]
        if not isinstance(uid, str) or not isinstance(node, str):
            raise TypeError("podUID and node must be strings")
        if not _small_int(at):  # 10**400 would overflow the age check
            raise TypeError("issuedAt must be an integer in [0, 2**63)")
        return Decision(uid, node, containers, at)
    except (KeyError, TypeError, AttributeError) as e:
        raise DecisionError(f"decision is malformed: {e!r}", reason="MalformedDecision") from e
