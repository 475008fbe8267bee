"""The opaque config of our DRA driver in a claim (``SliceConfig``; written by the
tenant, or by the admin in a DeviceClass: ``source: FromClass``): the enforcement mode
the claim asks and the memory cap it may burst to above what it claims (``memoryLimit``,
driver-enforced limits only). Per request the last config of ours that names a field
wins (class configs come first, then the claim's); one claim has one value of each.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

from gpu_share.config.model import EnforcementMode
from gpu_share.sharing.dra.reading import (
    ClaimError,
    ClaimReason,
    read_items,
    read_mapping,
    read_text,
    shown,
)
from gpu_share.sharing.node.limits import STRENGTH
from gpu_share.sharing.quantity import MIB, QuantityError, parse_quantity

SLICE_CONFIG_KIND = "SliceConfig"
SLICE_CONFIG_VERSION = "v1alpha1"
SLICE_CONFIG_FIELDS = frozenset({"apiVersion", "kind", "enforcement", "memoryLimit"})
MAX_CONFIG_REQUESTS = 64
MAX_MEMORY_LIMIT = 1 << 50  # bytes: 1 PiB, far above any device
# Modes in force a config may name (a tuple: compared, never hashed); not ``auto``.
MODES = tuple(m.value for m in STRENGTH)
T = TypeVar("T")


@dataclass(frozen=True)
class SliceConfig:
    enforcement: EnforcementMode | None = None
    memory_limit: Fraction | None = None  # bytes


@dataclass(frozen=True)
class ClaimConfig:
    """What a claim's configs of our driver say, merged over its requests."""

    enforcement: EnforcementMode | None = None  # None: the pool's
    # The mode the admin's configs alone name: the floor a tenant's config may not go
    # below (``claims.enforcement_for``).
    class_enforcement: EnforcementMode | None = None
    memory_limit: Fraction | None = None  # bytes; None: what the claim claims


def _memory_limit(value: object) -> Fraction | str:
    """Bytes, or why the value is not a memory limit."""
    try:
        q = parse_quantity(value) if isinstance(value, str) else None
    except QuantityError as e:
        return f"memoryLimit: {e}"
    if q is None or q <= 0 or q > MAX_MEMORY_LIMIT or q % MIB:
        return (f"memoryLimit {shown(value)} is not a quantity of whole MiB up to 1Pi "
                "(e.g. \"8Gi\")")
    return q


def _problem(p: dict[str, Any], driver: str) -> str:
    version = f"{driver}/{SLICE_CONFIG_VERSION}"
    unknown = sorted(str(k) for k in set(p) - SLICE_CONFIG_FIELDS)
    if unknown:
        return f"unknown fields {shown(unknown)}"
    if p.get("apiVersion", version) != version:
        return f"apiVersion {shown(p.get('apiVersion'))} is not {version}"
    if p.get("kind", SLICE_CONFIG_KIND) != SLICE_CONFIG_KIND:
        return f"kind {shown(p.get('kind'))} is not {SLICE_CONFIG_KIND}"
    if "enforcement" in p and p["enforcement"] not in MODES:
        return f"enforcement {shown(p['enforcement'])} is not one of " + ", ".join(MODES)
    limit = _memory_limit(p["memoryLimit"]) if "memoryLimit" in p else None
    return limit if isinstance(limit, str) else ""


def slice_config(params: object, driver: str, where: str) -> SliceConfig:
    p = dict(read_mapping(params, f"{where}.opaque.parameters"))
    problem = _problem(p, driver)
    if problem:
        raise ClaimError(f"{where}: {problem}", ClaimReason.BAD_CONFIG)
    mode = p.get("enforcement")
    limit = _memory_limit(p["memoryLimit"]) if "memoryLimit" in p else None
    return SliceConfig(EnforcementMode(mode) if isinstance(mode, str) else None,
                       limit if isinstance(limit, Fraction) else None)


@dataclass(frozen=True)
class _Entry:
    requests: tuple[str, ...]  # empty: every request
    config: SliceConfig
    by_class: bool


def _entry(raw: object, n: int, driver: str) -> _Entry | None:
    """One config entry of our driver; None: another driver's. Only ``source:
    FromClass`` is the admin's; anything else is the tenant's."""
    where = f"status.allocation.devices.config[{n}]"
    c = read_mapping(raw, where)
    opaque = c.get("opaque")
    if opaque is None:
        return None
    opaque = read_mapping(opaque, f"{where}.opaque")
    if opaque.get("driver") != driver:
        return None
    names = read_items(c.get("requests"), f"{where}.requests", MAX_CONFIG_REQUESTS)
    requests = tuple(read_text(r, f"{where}.requests[]") for r in names)
    return _Entry(requests, slice_config(opaque.get("parameters"), driver, where),
                  c.get("source") == "FromClass")


def _applies(requests: tuple[str, ...], request: str) -> bool:
    # A config naming "r" applies to r's subrequests ("r/<sub>") too; none named: all.
    main = request.partition("/")[0]
    return not requests or request in requests or main in requests


def _one(entries: Sequence[tuple[tuple[str, ...], T | None]], requests: Sequence[str],
         what: str) -> T | None:
    chosen: dict[str, T | None] = {}
    for request in requests:
        chosen[request] = None
        for names, value in entries:
            if value is not None and _applies(names, request):
                chosen[request] = value
    values = set(chosen.values())
    if len(values) > 1:
        raise ClaimError(f"the claim's requests name different {what} "
                         f"({', '.join(sorted(map(_named, values)))}); one claim has one",
                         ClaimReason.BAD_CONFIG)
    return next(iter(values), None)


def _named(value: object) -> str:
    if value is None:
        return "(none named)"
    if isinstance(value, EnforcementMode):
        return value.value
    return f"{value / MIB} MiB" if isinstance(value, Fraction) else str(value)


def claim_config(configs: Sequence[Any], driver: str, requests: Iterable[str]) -> ClaimConfig:
    entries = [e for n, raw in enumerate(configs) if (e := _entry(raw, n, driver))]
    wanted = list(requests)
    return ClaimConfig(
        _one([(e.requests, e.config.enforcement) for e in entries], wanted,
             "enforcement modes"),
        _one([(e.requests, e.config.enforcement) for e in entries if e.by_class], wanted,
             "enforcement modes"),
        _one([(e.requests, e.config.memory_limit) for e in entries], wanted,
             "memory limits"),
    )
