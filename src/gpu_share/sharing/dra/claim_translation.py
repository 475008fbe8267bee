"""vcuda limits -> a ResourceClaim per container, for the DRA admission webhook (pure).

In DRA mode pods keep asking ``vendor.com/vcuda-memory: 4`` (memory units) and
``vendor.com/vcuda-core: 30`` (percent of a device) in their container limits. The
webhook rewrites such a pod: each asking container gets one pod claim
``gpu-share-<container>`` made from the namespace's ResourceClaimTemplate
``gpu-share-m<units>-c<cores>`` (docs: the DRA contract), and the vcuda keys go.

- The amounts are read by the one parser (``pod_request``); the rules are those of
  ``validate.check_request``: whole, non-negative amounts; more than one device only in
  whole devices (cores a multiple of 100). Limits and requests that both name a resource
  must agree (the API server would refuse them after us, with a less clear message).
- A shared slice is one device with ``memory`` and ``cores`` capacity requests (no
  memory: the device's default, all of it); an exclusive one (cores >= 100) is
  ``cores/100`` whole devices, each with all of its cores (and so all of its memory).
- A pod that already lists one of our pod claims (``gpu-share-`` prefix) is left alone:
  the API server calls a webhook again after later ones changed the pod.

Anything wrong is a ``ClaimRequestError`` (a ``PodRequestError``, so a ``ValueError``)
with a bounded message; never another exception.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpu_share.sharing.claim_names import CLAIM_PREFIX, template_name
from gpu_share.sharing.inventory import CORES_PER_DEVICE
from gpu_share.sharing.model import ContainerView, ResourceNames
from gpu_share.sharing.placement.pod_request import PodRequestError, amount, parse_pod_request
from gpu_share.sharing.quantity import QuantityError, parse_quantity
from gpu_share.sharing.untrusted import section

__all__ = [
    "API_VERSION",
    "CLAIM_PREFIX",
    "DEFAULT_DEVICE_CLASS",
    "MANAGED_BY",
    "MAX_DEVICES_PER_CLAIM",
    "REQUEST_NAME",
    "ClaimRequestError",
    "ClaimShape",
    "ContainerClaim",
    "Translation",
    "TranslationSettings",
    "claim_name",
    "escape_pointer",
    "template_body",
    "template_matches",
    "translate_pod",
]

API_VERSION = "resource.k8s.io/v1"
DEFAULT_DEVICE_CLASS = "gpu-share.vendor.com"
REQUEST_NAME = "slice"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpu-share")
# resource.k8s.io AllocationResultsMaxSize: a claim allocates at most this many devices.
MAX_DEVICES_PER_CLAIM = 32
_DNS_LABEL_MAX = 63
_CLAIM_HASHED_PREFIX = 50  # chars of "gpu-share-<C>" kept when it is too long
_MAX_BYTES = 2**63 - 1  # a Quantity's int64 range
_MAX_MESSAGE = 300
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")


class ClaimRequestError(PodRequestError):
    """The pod cannot be translated; ``str(e)`` is a short reason (at most 300 chars)
    naming where, the admission answer's message."""

    def __init__(self, message: str) -> None:
        super().__init__(message[:_MAX_MESSAGE])


@dataclass(frozen=True)
class TranslationSettings:
    names: ResourceNames  # full resource names: vendor.com/vcuda-memory, ...-core
    memory_unit_mib: int  # MiB per memory unit (the agents' memoryUnitMiB)
    device_class: str = DEFAULT_DEVICE_CLASS
    # Keep each vcuda key at "0" instead of removing it: kube-scheduler asks an extender
    # about pods naming one of its managed resources (a zero amount fits any node), so
    # the gpu-share extender ranks the DRA pod's nodes (docs/dra.md).
    mark_for_extender: bool = False


@dataclass(frozen=True)
class ClaimShape:
    """What one container asks: memory units and core percent (both >= 0, not both 0)."""

    memory_units: int
    cores: int

    @property
    def exclusive(self) -> bool:
        return self.cores >= CORES_PER_DEVICE

    @property
    def count(self) -> int:
        return self.cores // CORES_PER_DEVICE if self.exclusive else 1

    @property
    def template_name(self) -> str:
        return template_name(self.memory_units, self.cores)

    def capacity(self, unit_mib: int) -> dict[str, str]:
        """The capacity requests on each allocated device."""
        if self.exclusive:
            return {"cores": str(CORES_PER_DEVICE)}
        caps = {"cores": str(self.cores)}
        if self.memory_units:
            caps["memory"] = f"{self.memory_units * unit_mib}Mi"
        return caps


@dataclass(frozen=True)
class ContainerClaim:
    container: str
    field: str  # "initContainers" or "containers"
    index: int  # in that list
    claim: str  # the pod claim name
    shape: ClaimShape


@dataclass(frozen=True)
class Translation:
    claims: tuple[ContainerClaim, ...] = ()
    templates: tuple[dict[str, Any], ...] = ()  # one body per distinct shape
    patch: tuple[dict[str, Any], ...] = ()  # RFC 6902 operations on the pod
    already_done: bool = False  # the pod carries our claims already: left alone

    @property
    def changed(self) -> bool:
        return bool(self.patch)


def _echo(value: object) -> str:
    return repr(str(value)[:40])


def claim_name(container: str) -> str:
    """The pod claim of ``container``: ``gpu-share-<C>``, or when that is over 63
    characters its first 50, "-" and 8 hex digits of sha256(C)."""
    name = CLAIM_PREFIX + container
    if len(name) <= _DNS_LABEL_MAX:
        return name
    digest = hashlib.sha256(container.encode()).hexdigest()[:8]
    return f"{name[:_CLAIM_HASHED_PREFIX]}-{digest}"


def escape_pointer(token: str) -> str:
    """One JSON-pointer reference token (RFC 6901): ``~`` -> ``~0``, ``/`` -> ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def _pointer(*tokens: str | int) -> str:
    return "".join("/" + escape_pointer(str(t)) for t in tokens)


def template_body(shape: ClaimShape, namespace: str, s: TranslationSettings) -> dict[str, Any]:
    """The ResourceClaimTemplate for ``shape`` in ``namespace``."""
    exactly: dict[str, Any] = {
        "deviceClassName": s.device_class,
        "allocationMode": "ExactCount",
        "count": shape.count,
        "capacity": {"requests": shape.capacity(s.memory_unit_mib)},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": shape.template_name,
            "namespace": namespace,
            "labels": {MANAGED_BY[0]: MANAGED_BY[1]},
        },
        "spec": {"spec": {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}}},
    }


# ---------------------------------------------------------------- checks


def _check_shape(shape: ClaimShape, where: str, unit_mib: int) -> None:
    """``validate.check_request``'s rules, plus what one claim can express."""
    if shape.cores > CORES_PER_DEVICE and shape.cores % CORES_PER_DEVICE:
        raise ClaimRequestError(
            f"{where}: {shape.cores} cores is more than one device but not a multiple of "
            f"{CORES_PER_DEVICE}"
        )
    if shape.count > MAX_DEVICES_PER_CLAIM:
        raise ClaimRequestError(
            f"{where}: {shape.cores} cores asks {shape.count} whole devices; a claim "
            f"allocates at most {MAX_DEVICES_PER_CLAIM}"
        )
    if shape.memory_units * unit_mib * 2**20 > _MAX_BYTES:
        raise ClaimRequestError(f"{where}: {shape.memory_units} memory units is too large")


def _check_limits_match(resources: Mapping[str, Any], where: str, names: ResourceNames) -> None:
    limits = section(resources.get("limits"), f"{where}.limits", ClaimRequestError)
    requests = section(resources.get("requests"), f"{where}.requests", ClaimRequestError)
    for name in (names.memory, names.core):
        if name not in limits or name not in requests:
            continue
        at = f"{where}.requests[{name!r}]"
        if amount(requests[name], at) != amount(limits[name], f"{where}.limits[{name!r}]"):
            raise ClaimRequestError(
                f"{at}: {_echo(requests[name])} differs from the limit "
                f"{_echo(limits[name])}; they must be equal"
            )


def _check_name(name: str, where: str) -> None:
    if len(name) > _DNS_LABEL_MAX or not _DNS_LABEL.match(name):
        raise ClaimRequestError(f"{where}.name: {_echo(name)} is not a DNS label")


# ---------------------------------------------------------------- the pod


def _slots(spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    """(field, index, container) in admission order (the parser checked the lists)."""
    for field in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(field) or ()):
            yield field, i, c


def _carries_ours(spec: Mapping[str, Any]) -> bool:
    claims = spec.get("resourceClaims")
    if claims is None:
        return False
    if not isinstance(claims, list):
        raise ClaimRequestError("spec.resourceClaims: must be a list")
    return any(
        isinstance(c, Mapping) and str(c.get("name", "")).startswith(CLAIM_PREFIX) for c in claims
    )


def _removals(
    resources: Mapping[str, Any], base: tuple[str | int, ...], s: TranslationSettings
) -> list[dict[str, Any]]:
    """The vcuda keys go, or stay at "0" (``mark_for_extender``)."""
    ops = []
    for part in ("limits", "requests"):
        given = resources.get(part)
        if not isinstance(given, Mapping):
            continue
        for name in (s.names.memory, s.names.core):
            if name not in given:
                continue
            path = _pointer(*base, "resources", part, name)
            ops.append({"op": "replace", "path": path, "value": "0"} if s.mark_for_extender
                       else {"op": "remove", "path": path})
    return ops


def _add_claim(resources: Mapping[str, Any], base: tuple[str | int, ...], claim: str,
               where: str) -> dict[str, Any]:
    have = resources.get("claims")
    if have is None:
        return {"op": "add", "path": _pointer(*base, "resources", "claims"),
                "value": [{"name": claim}]}
    if not isinstance(have, list):
        raise ClaimRequestError(f"{where}.resources.claims: must be a list")
    return {"op": "add", "path": _pointer(*base, "resources", "claims") + "/-",
            "value": {"name": claim}}


def _pod_claims(spec: Mapping[str, Any], claims: list[ContainerClaim]) -> list[dict[str, Any]]:
    entries = [{"name": c.claim, "resourceClaimTemplateName": c.shape.template_name}
               for c in claims]
    if spec.get("resourceClaims") is None:
        return [{"op": "add", "path": "/spec/resourceClaims", "value": entries}]
    return [{"op": "add", "path": "/spec/resourceClaims/-", "value": e} for e in entries]


def _container_claim(
    field: str, i: int, view: ContainerView, resources: Mapping[str, Any], s: TranslationSettings
) -> ContainerClaim | None:
    where = f"spec.{field}[{i}]"
    _check_limits_match(resources, f"{where}.resources", s.names)
    if view.request.empty:
        return None
    _check_name(view.name, where)
    shape = ClaimShape(view.request.memory_units, view.request.cores)
    _check_shape(shape, where, s.memory_unit_mib)
    return ContainerClaim(view.name, field, i, claim_name(view.name), shape)


def _parse(pod: Any, s: TranslationSettings) -> tuple[Mapping[str, Any], tuple[ContainerView, ...]]:
    if not isinstance(pod, Mapping):
        raise ClaimRequestError("the pod must be an object")
    views = parse_pod_request(pod, s.names.memory, s.names.core, placement=False).containers
    return section(pod.get("spec"), "spec", ClaimRequestError), views


def translate_pod(pod: Any, namespace: str, s: TranslationSettings) -> Translation:
    """The claims, templates and JSONPatch that turn ``pod``'s vcuda amounts into
    ResourceClaims; raises ``ClaimRequestError``."""
    try:
        return _translate(pod, namespace, s)
    except ClaimRequestError:
        raise
    except PodRequestError as e:  # an amount read by the parser's rules
        raise ClaimRequestError(str(e)) from None


def _translate(pod: Any, namespace: str, s: TranslationSettings) -> Translation:
    spec, views = _parse(pod, s)
    if _carries_ours(spec):
        return Translation(already_done=True)
    ops: list[dict[str, Any]] = []
    adds: list[dict[str, Any]] = []
    claims: list[ContainerClaim] = []
    for (field, i, c), view in zip(_slots(spec), views, strict=True):
        at = f"spec.{field}[{i}].resources"
        resources = section(c.get("resources"), at, ClaimRequestError)
        ops += _removals(resources, ("spec", field, i), s)
        got = _container_claim(field, i, view, resources, s)
        if got is not None:
            claims.append(got)
            adds.append(_add_claim(resources, ("spec", field, i), got.claim, f"spec.{field}[{i}]"))
    _check_unique(claims, views)
    if claims:
        ops += adds + _pod_claims(spec, claims)
    shapes = dict.fromkeys(c.shape for c in claims)
    templates = tuple(template_body(sh, namespace, s) for sh in shapes)
    return Translation(tuple(claims), templates, tuple(ops))


def _check_unique(claims: list[ContainerClaim], views: tuple[ContainerView, ...]) -> None:
    """Claim names are unique, and so are container names (the API server refuses a
    name twice anyway; a claim must not go to the wrong one of two)."""
    if not claims:
        return
    seen: set[str] = set()
    for v in views:
        if v.name in seen:
            raise ClaimRequestError(f"container name {_echo(v.name)} is used twice")
        seen.add(v.name)
    names: set[str] = set()
    for c in claims:
        if c.claim in names:
            raise ClaimRequestError(
                f"spec.{c.field}[{c.index}].name: {_echo(c.container)} has the claim name of "
                "another container"
            )
        names.add(c.claim)


# ---------------------------------------------------------------- an existing template


def _capacity_of(request: Any) -> Mapping[str, Fraction] | None:
    try:
        caps = request["exactly"]["capacity"]["requests"]
        return {str(k): parse_quantity(v) for k, v in caps.items()}
    except (KeyError, TypeError, AttributeError, QuantityError):
        return None


def _without_capacity(request: Any) -> Any:
    if not isinstance(request, Mapping) or not isinstance(request.get("exactly"), Mapping):
        return request
    exactly = {k: v for k, v in request["exactly"].items() if k != "capacity"}
    return {**request, "exactly": exactly}


def template_matches(expected: Mapping[str, Any], actual: Any) -> bool:
    """Whether the stored template ``actual`` asks exactly what ``expected`` (a
    ``template_body``) does: same claim spec, quantities compared by value, no claim
    metadata. Anything more (a selector, admin access, config) is not ours."""
    try:
        want, got = expected["spec"], actual["spec"]
        if got.get("metadata") or set(got) - {"metadata", "spec"}:
            return False
        want_reqs = want["spec"]["devices"]["requests"]
        got_reqs = got["spec"]["devices"]["requests"]
        if set(got["spec"]) != {"devices"} or set(got["spec"]["devices"]) != {"requests"}:
            return False
    except (KeyError, TypeError, AttributeError):
        return False
    if not isinstance(got_reqs, list) or len(got_reqs) != len(want_reqs):
        return False
    return all(
        _capacity_of(w) == _capacity_of(g) and _without_capacity(w) == _without_capacity(g)
        for w, g in zip(want_reqs, got_reqs, strict=True)
    )
