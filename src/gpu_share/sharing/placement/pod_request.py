"""What a pod asks of gpu-share, read from its JSON form: the one parser (pure).

The agent (through ``kube/pods``), the extender's filter/bind (``extender/core``) and the
extender's cluster view (``kube/cluster_view``) all read a pod's requests here:

- per container, in kubelet admission order (init containers, restartable ones being
  sidecars, then app containers), the amounts of our two extended resources. Limits
  are authoritative (the API server makes requests equal them); a request alone counts
  when no limit names the resource. An amount must be a whole, non-negative quantity
  of at most ``MAX_AMOUNT`` ("4", 4, "1k").
- for placement, the host CPU/memory the scheduler reserves (``quantity``) and the GPU
  models the pod accepts (``pod_models``).

Pods are tenant input: counts and sizes are bounded, and anything malformed is a
``PodRequestError`` (a ``ValueError``) naming where, never another exception.
``parse_pod_request`` raises it; ``read_pod_request`` counts the malformed part as
"nothing asked" and lists the errors in ``problems`` (the API server validated the
pod already, so this only guards a watch against a surprise).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar, Unpack

from gpu_share.errors import InputError
from gpu_share.sharing.claim_names import template_shape
from gpu_share.sharing.model import ContainerKind, ContainerRequest, ContainerView
from gpu_share.sharing.placement import ANY_MODEL, Demand, ModelReq, PodDemand
from gpu_share.sharing.placement.pod_models import DEFAULT_MODEL_LABEL, pod_models
from gpu_share.sharing.quantity import QuantityError, parse_quantity, pod_host_request
from gpu_share.sharing.untrusted import section

T = TypeVar("T")

__all__ = [
    "MAX_AMOUNT",
    "MAX_CONTAINERS",
    "PodRequest",
    "PodRequestError",
    "amount",
    "parse_pod_request",
    "read_pod_request",
]

MAX_AMOUNT = 10**12  # units of one resource in one container; real asks are far below
# Init plus app containers of one pod; the API server allows far fewer in practice.
MAX_CONTAINERS = 1024
_MAX_ECHO = 40  # characters of tenant input quoted in an error


class PodRequestError(InputError):
    """A pod's request is malformed; ``str(e)`` is a short reason naming where."""


@dataclass(frozen=True)
class PodRequest:
    """A pod's ask: every container in admission order, and for placement the host
    CPU (millicores) and memory (MiB) and the models it accepts."""

    containers: tuple[ContainerView, ...] = ()  # zero amounts: nothing of ours asked
    cpu: int = 0
    memory: int = 0
    models: ModelReq = ANY_MODEL
    problems: tuple[PodRequestError, ...] = ()
    from_claims: bool = False  # a DRA pod: the asks are its gpu-share claims' templates

    @property
    def asking(self) -> dict[str, ContainerRequest]:
        """Container name -> request, for the containers asking for any of ours (one
        per name: the API server refuses duplicate names, a direct caller may not)."""
        return {c.name: c.request for c in self.containers if not c.request.empty}

    @property
    def uses_ours(self) -> bool:
        return any(not c.request.empty for c in self.containers)

    def demand(self) -> PodDemand:
        """The placement policy's view of this ask."""
        return PodDemand(
            tuple(Demand(n, r.memory_units, r.cores) for n, r in self.asking.items()),
            cpu=self.cpu,
            host_memory=self.memory,
            models=self.models,
        )


def _echo(value: Any) -> str:
    return repr(str(value)[:_MAX_ECHO])


def amount(value: Any, where: str) -> int:
    """One extended-resource quantity as a whole number of units."""
    if value is None:
        return 0
    if isinstance(value, str) and not value.isascii():
        # parse_quantity's \d also matches other scripts' digits ("٣" would be 3).
        raise PodRequestError(f"{where}: not a quantity: {_echo(value)}")
    try:
        q = parse_quantity(value)
    except QuantityError as e:
        raise PodRequestError(f"{where}: {e}") from None
    if q < 0 or q.denominator != 1 or q > MAX_AMOUNT:
        raise PodRequestError(
            f"{where}: must be a whole number from 0 to {MAX_AMOUNT}, got {_echo(value)}"
        )
    return int(q)


def _amounts(resources: Any, where: str, name: str) -> tuple[Any, str]:
    """The raw quantity asked for ``name`` and where it was found."""
    res = section(resources, where, PodRequestError)
    limits = section(res.get("limits"), f"{where}.limits", PodRequestError)
    if name in limits:
        return limits[name], f"{where}.limits[{name!r}]"
    requests = section(res.get("requests"), f"{where}.requests", PodRequestError)
    return requests.get(name), f"{where}.requests[{name!r}]"


def _request(
    c: Mapping[str, Any], where: str, memory: str, core: str, problems: list[PodRequestError] | None
) -> ContainerRequest:
    """The container's request; with ``problems`` a malformed amount counts as 0."""
    got: list[int] = []
    for name in (memory, core):
        try:
            raw, at = _amounts(c.get("resources"), f"{where}.resources", name)
            got.append(amount(raw, at))
        except PodRequestError as e:
            if problems is None:
                raise
            problems.append(e)
            got.append(0)
    return ContainerRequest(got[0], got[1])


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], str, ContainerKind]]:
    """(container, where, kind) in admission order; raises on a malformed list."""
    seen = 0
    for field in ("initContainers", "containers"):
        items = spec.get(field) or []
        if not isinstance(items, list):
            raise PodRequestError(f"spec.{field}: must be a list")
        seen += len(items)
        if seen > MAX_CONTAINERS:
            raise PodRequestError(f"more than {MAX_CONTAINERS} containers")
        for i, c in enumerate(items):
            if not isinstance(c, Mapping):
                raise PodRequestError(f"spec.{field}[{i}]: must be an object")
            kind = ContainerKind.APP
            if field == "initContainers":
                sidecar = c.get("restartPolicy") == "Always"
                kind = ContainerKind.SIDECAR if sidecar else ContainerKind.INIT
            yield c, f"spec.{field}[{i}]", kind


def _asks(
    pod: Mapping[str, Any], memory: str, core: str, problems: list[PodRequestError] | None
) -> tuple[ContainerView, ...]:
    spec = section(pod.get("spec"), "spec", PodRequestError)
    return tuple(
        ContainerView(str(c.get("name", "")), kind, _request(c, where, memory, core, problems))
        for c, where, kind in _containers(spec)
    )


def _templates(spec: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Pod claim name -> (memory units, cores) of its gpu-share template, for the pod
    claims made from one (``claim_names``); anything else is no ask of ours."""
    items = spec.get("resourceClaims") or []
    if not isinstance(items, list) or len(items) > MAX_CONTAINERS:
        return {}
    out: dict[str, tuple[int, int]] = {}
    for item in items:
        if isinstance(item, Mapping) and isinstance(item.get("name"), str):
            shape = template_shape(item.get("resourceClaimTemplateName"))
            if shape is not None:
                out[item["name"]] = shape
    return out


def _claimed(c: Mapping[str, Any], templates: Mapping[str, tuple[int, int]]) -> ContainerRequest:
    """What the container's gpu-share claims ask (several add up)."""
    res = c.get("resources")
    claims = res.get("claims") if isinstance(res, Mapping) else None
    m = cores = 0
    for ref in claims if isinstance(claims, list) else ():
        shape = templates.get(str(ref.get("name"))) if isinstance(ref, Mapping) else None
        if shape is not None:
            m, cores = m + shape[0], cores + shape[1]
    return ContainerRequest(min(m, MAX_AMOUNT), min(cores, MAX_AMOUNT))


def _with_claims(
    pod: Mapping[str, Any], views: tuple[ContainerView, ...]
) -> tuple[tuple[ContainerView, ...], bool]:
    """A DRA pod's containers (no vcuda amount asked) with their claims' asks, and
    whether any claim asked; a pod asking vcuda amounts is read as it is."""
    spec = pod.get("spec")
    if any(not v.request.empty for v in views) or not isinstance(spec, Mapping):
        return views, False
    templates = _templates(spec)
    if not templates:
        return views, False
    out = tuple(
        ContainerView(v.name, v.kind, _claimed(c, templates))
        for v, (c, _, _) in zip(views, _containers(spec), strict=True)
    )
    return out, any(not v.request.empty for v in out)


def _host(pod: Mapping[str, Any]) -> tuple[int, int]:
    try:
        return pod_host_request(pod)
    except (QuantityError, TypeError, AttributeError) as e:  # a malformed spec or amount
        raise PodRequestError(f"host request: {str(e)[:200]}") from None


def _models(pod: Mapping[str, Any], domain: str, model_label: str) -> ModelReq:
    try:
        return pod_models(pod, model_label, domain)
    except (ValueError, TypeError, AttributeError) as e:
        raise PodRequestError(f"models: {str(e)[:200]}") from None


class RequestOptions(TypedDict, total=False):
    """What to read besides the containers' amounts: ``placement=False`` skips the host
    request and models (what the node agent does not need)."""

    domain: str
    model_label: str
    placement: bool
    claims: bool  # a pod asking no vcuda amount: read its gpu-share claims (DRA pools)


def parse_pod_request(
    pod: Mapping[str, Any], memory: str, core: str, **options: Unpack[RequestOptions]
) -> PodRequest:
    """The pod's ask; raises ``PodRequestError`` on anything malformed. ``memory`` and
    ``core`` are the full resource names."""
    return _pod_request(pod, memory, core, None, **options)


def read_pod_request(
    pod: Mapping[str, Any], memory: str, core: str, **options: Unpack[RequestOptions]
) -> PodRequest:
    """``parse_pod_request`` that never raises: a malformed amount counts as 0, a
    malformed host request as (0, 0), malformed models as any model, a malformed
    container list as none; each is listed in ``problems``."""
    return _pod_request(pod, memory, core, [], **options)


def _part(problems: list[PodRequestError] | None, read: Callable[[], T], fallback: T) -> T:
    # Strict (problems None): the error propagates; lenient: recorded, fallback used.
    if problems is None:
        return read()
    try:
        return read()
    except PodRequestError as e:
        problems.append(e)
        return fallback


def _pod_request(
    pod: Mapping[str, Any],
    memory: str,
    core: str,
    problems: list[PodRequestError] | None,
    *,
    domain: str = "",
    model_label: str = DEFAULT_MODEL_LABEL,
    placement: bool = True,
    claims: bool = False,
) -> PodRequest:
    none: tuple[ContainerView, ...] = ()
    containers = _part(problems, lambda: _asks(pod, memory, core, problems), none)
    from_claims = False
    if claims and containers:
        containers, from_claims = _with_claims(pod, containers)
    if not placement:
        return PodRequest(containers, problems=tuple(problems or ()), from_claims=from_claims)
    cpu, host_memory = _part(problems, lambda: _host(pod), (0, 0))
    models = _part(problems, lambda: _models(pod, domain, model_label), ANY_MODEL)
    return PodRequest(containers, cpu, host_memory, models, tuple(problems or ()), from_claims)

