"""Device cordons: an admin stops new slices on one device (pure).

A cordon is one Node annotation per device, in the project's annotation domain::

    gpu-share.<domain>/cordon.<device uuid>:
        {"by":"alice","reason":"ECC errors","at":"2026-11-24T06:31:49Z"}

``kubectl gpu-share cordon`` writes it (``by`` is the writer's own user name, which the
chart's admission policy checks against the request), ``uncordon`` removes it. The agent
reads it from its Node: the device's units are reported unhealthy to the kubelet (no new
Allocate), the device is left out of every device choice, the inventory annotation says
``"cordoned": true`` and, in DRA mode, the slice's device carries a NoSchedule taint.
Running slices stay. Health (what the device says) and cordon (what an admin says) are
separate facts; a device is offered only when it is healthy and not cordoned.

The value is written by people and read by the agent: ``parse_cordon`` accepts only the
strict form (bounded, the three keys, no duplicates, no control characters) and never
raises anything but ``CordonError``; ``scan_cordons`` sorts a node's annotations into
cordons of known devices, invalid values and unknown devices (reported, not fatal).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_share.errors import GpuShareError

__all__ = [
    "CORDON_PREFIX",
    "MAX_BY",
    "MAX_CORDONS",
    "MAX_REASON",
    "MAX_VALUE",
    "Cordon",
    "CordonChange",
    "CordonError",
    "CordonScan",
    "cordon_key",
    "cordon_key_prefix",
    "diff_cordons",
    "parse_cordon",
    "scan_cordons",
]

# The name part of the key: "cordon." + the device uuid.
CORDON_PREFIX = "cordon."
MAX_VALUE = 1024  # bytes of the whole value
MAX_BY = 256  # the API server's user names are short; this bounds Events and logs
MAX_REASON = 256
MAX_CORDONS = 64  # cordon keys read from one node (more is not a real node's)
# Who a cordon whose annotation cannot be read is by (it cordons all the same).
UNREADABLE_BY = "(unreadable)"
# An annotation key's name part (after "/"): at most 63 characters of this form.
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_AT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_KEYS = ("by", "reason", "at")

# scan_cordons reasons (the agent's log and metric label: a closed set).
MALFORMED = "Malformed"
UNKNOWN_DEVICE = "UnknownDevice"
TOO_MANY = "TooMany"


class CordonError(GpuShareError):
    reason = MALFORMED


def cordon_key_prefix(domain: str) -> str:
    return f"gpu-share.{domain}/{CORDON_PREFIX}"


def cordon_key(domain: str, device: str) -> str:
    """The annotation key cordoning ``device`` (its uuid); ValueError when the uuid
    cannot be part of an annotation key."""
    name = CORDON_PREFIX + device
    if len(name) > 63 or not _NAME.fullmatch(name):
        raise ValueError(f"device id {device!r} cannot be named in an annotation key")
    return cordon_key_prefix(domain) + device


@dataclass(frozen=True)
class Cordon:
    by: str
    reason: str
    at: str = ""  # RFC 3339 UTC, when written; "" when the writer gave none

    def encode(self) -> str:
        """The annotation value; ``by`` first, as the admission policy checks it."""
        doc: dict[str, str] = {"by": self.by, "reason": self.reason}
        if self.at:
            doc["at"] = self.at
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))

    def describe(self) -> str:
        """For Events and logs: who, why (bounded by the parser)."""
        why = self.reason or "no reason given"
        return f"by {self.by}: {why}"


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise CordonError(f"cordon value repeats the key {k!r}")
        out[k] = v
    return out


def _text(doc: Mapping[str, Any], key: str, limit: int, *, required: bool) -> str:
    v = doc.get(key, None if required else "")
    if not isinstance(v, str):
        raise CordonError(f"cordon {key!r} must be a string")
    if len(v) > limit:
        raise CordonError(f"cordon {key!r} is longer than {limit} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in v):
        raise CordonError(f"cordon {key!r} has control characters")
    return v


def parse_cordon(text: str) -> Cordon:
    """The cordon in an annotation value; CordonError for anything but the strict form."""
    if not isinstance(text, str) or len(text.encode("utf-8", "replace")) > MAX_VALUE:
        raise CordonError(f"cordon value is not text of at most {MAX_VALUE} bytes")
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except CordonError:
        raise
    except (ValueError, RecursionError) as e:
        raise CordonError(f"cordon value is not JSON: {str(e)[:80]}") from e
    if not isinstance(doc, dict):
        raise CordonError("cordon value is not a JSON object")
    extra = sorted(set(doc) - set(_KEYS))
    if extra:
        raise CordonError(f"cordon value has unknown keys {extra[:3]}")
    by = _text(doc, "by", MAX_BY, required=True)
    if not by.strip():
        raise CordonError("cordon 'by' is empty")
    reason = _text(doc, "reason", MAX_REASON, required=True)
    at = _text(doc, "at", 32, required=False)
    if at and not _AT.fullmatch(at):
        raise CordonError("cordon 'at' is not an RFC 3339 UTC time (YYYY-MM-DDTHH:MM:SSZ)")
    return Cordon(by, reason, at)


@dataclass(frozen=True)
class CordonScan:
    """A node's cordon annotations, sorted out: ``cordons`` of devices this node has,
    ``problems`` as (key, reason, message) for the rest (``MALFORMED``,
    ``UNKNOWN_DEVICE``, ``TOO_MANY``)."""

    cordons: Mapping[str, Cordon] = field(default_factory=dict)
    problems: tuple[tuple[str, str, str], ...] = ()


def scan_cordons(
    annotations: Mapping[str, str], domain: str, devices: Collection[str]
) -> CordonScan:
    """The cordons among a node's annotations, for the devices (uuids) it has."""
    prefix = cordon_key_prefix(domain)
    keys = sorted(k for k in annotations if k.startswith(prefix))
    cordons: dict[str, Cordon] = {}
    problems: list[tuple[str, str, str]] = []
    for i, key in enumerate(keys):
        device = key[len(prefix):]
        if device not in devices:
            problems.append((key, UNKNOWN_DEVICE, f"no device {device[:64]!r} on this node"))
            continue
        try:
            if i >= MAX_CORDONS:
                raise CordonError(f"more than {MAX_CORDONS} cordon annotations", reason=TOO_MANY)
            cordons[device] = parse_cordon(annotations[key])
        except CordonError as e:
            # Fail closed: someone meant to cordon this device; what they wrote is not
            # readable, so it is cordoned all the same (and the problem reported).
            problems.append((key, e.reason, e.message))
            cordons[device] = Cordon(UNREADABLE_BY, f"unreadable cordon annotation: "
                                                    f"{e.message[:120]}")
    return CordonScan(cordons, tuple(problems))


@dataclass(frozen=True)
class CordonChange:
    device: str
    cordon: Cordon | None  # None: uncordoned (``before`` says what was lifted)
    before: Cordon | None


def diff_cordons(
    old: Mapping[str, Cordon], new: Mapping[str, Cordon]
) -> list[CordonChange]:
    """What changed, by device uuid (a new ``by`` or ``reason`` counts as a change)."""
    devices: Iterable[str] = sorted(set(old) | set(new))
    return [
        CordonChange(d, new.get(d), old.get(d))
        for d in devices
        if old.get(d) != new.get(d)
    ]
