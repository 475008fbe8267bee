"""NodePrepareResources / NodeUnprepareResources of the kubelet DRA API, v1 and v1beta1.

The two versions are the same messages under two packages, so one set of handlers
serves both: requests are read and answers written with the v1 classes whatever the
version called (the bytes are identical; tests/dra check the descriptors match). The
handlers only check the request, convert it to ``agent.dra.ports`` and back; every
decision is the ``ClaimPreparer``'s.

A bad request (a claim without uid, names that are not Kubernetes names, too many
claims, too many bytes, undecodable bytes) is answered INVALID_ARGUMENT as a whole; a
claim the preparer fails, or a preparer that raises, gets an error in its own entry
of the response (the kubelet retries it and reports it on the pod).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from gpu_share.agent.dra.ports import ClaimPreparer, ClaimRef, PrepareResult
from gpu_share.dra import guard
from gpu_share.dra.guard import Malformed
from gpu_share.dra.proto import dra_v1_pb2 as v1
from gpu_share.dra.proto import dra_v1beta1_pb2 as v1beta1

log = logging.getLogger(__name__)

T = TypeVar("T")

# One call names the claims of one pod for this driver: far fewer than this.
MAX_CLAIMS = 256
# Kubernetes UIDs are 36-character UUIDs; names are DNS labels / subdomains.
MAX_UID_CHARS = 128
MAX_NAMESPACE_CHARS = 63
MAX_NAME_CHARS = 253
# An answer above this is replaced by per-claim errors (the kubelet reads 4 MiB).
MAX_RESPONSE_BYTES = 3 << 20

# The uid names files and CDI devices downstream: no separators, alphanumeric ends
# (the same rule as the agent's ``sharing.dra.claims.CLAIM_UID``).
_UID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?", re.ASCII)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", re.ASCII)
_DNS_SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII
)

SERVICE_V1 = v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
SERVICE_V1BETA1 = v1beta1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
PREPARE = "NodePrepareResources"
UNPREPARE = "NodeUnprepareResources"


class _Invalid(Exception):
    """A request the kubelet should not have sent; the text is bounded."""


def _check_field(i: int, field: str, value: str, limit: int, pattern: re.Pattern[str]) -> None:
    if len(value) > limit:
        raise _Invalid(f"claims[{i}].{field} has {len(value)} characters, at most {limit}")
    if not pattern.fullmatch(value):
        raise _Invalid(f"claims[{i}].{field} {guard.quote(value)} is not a valid {field}")


def claims_of(claims: Sequence[v1.Claim], *, need_names: bool) -> list[ClaimRef]:
    """The claims of a request as ``ClaimRef``s, each uid once, in request order.

    Raises ``_Invalid`` for too many claims, an empty or malformed uid, a namespace or
    name that is not a Kubernetes one (empty is allowed for unprepare only:
    ``need_names`` False), or one uid named twice with different names.
    """
    if len(claims) > MAX_CLAIMS:
        raise _Invalid(f"{len(claims)} claims in one call, at most {MAX_CLAIMS}")
    refs: dict[str, ClaimRef] = {}
    for i, claim in enumerate(claims):
        if not claim.uid:
            raise _Invalid(f"claims[{i}] has no uid")
        _check_field(i, "uid", claim.uid, MAX_UID_CHARS, _UID)
        if need_names or claim.namespace:
            if not claim.namespace:
                raise _Invalid(f"claims[{i}] has no namespace")
            _check_field(i, "namespace", claim.namespace, MAX_NAMESPACE_CHARS, _DNS_LABEL)
        if need_names or claim.name:
            if not claim.name:
                raise _Invalid(f"claims[{i}] has no name")
            _check_field(i, "name", claim.name, MAX_NAME_CHARS, _DNS_SUBDOMAIN)
        ref = ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid)
        seen = refs.setdefault(ref.uid, ref)
        if seen != ref:
            raise _Invalid(f"claims[{i}]: uid {guard.quote(ref.uid)} is named twice differently")
    return list(refs.values())


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _device_pb(result: PrepareResult) -> list[v1.Device]:
    return [
        v1.Device(
            request_names=list(d.requests),
            pool_name=d.pool,
            device_name=d.device,
            cdi_device_ids=list(d.cdi_device_ids),
        )
        for d in result.devices
    ]


def _entry_error(error: str | None) -> str:
    """A claim's entry error: none ('') when done, the driver's (bounded), or a retry
    hint when the driver gave no result (None)."""
    if error is None:
        return "the driver returned no result for this claim; retry"
    return guard.bounded(error) if error else ""


def _results(
    call: str, verb: str, claims: Sequence[ClaimRef],
    run: Callable[[Sequence[ClaimRef]], Mapping[str, T]], failed: Callable[[str], T],
) -> Mapping[str, T]:
    """``run(claims)``; when it raises, ``failed(why)`` for every claim."""
    try:
        return run(claims)
    except Exception as exc:
        log.exception("%s of %d claim(s) failed", call, len(claims))
        why = guard.bounded(f"{verb} failed: {_describe(exc)}")
        return {ref.uid: failed(why) for ref in claims}


def prepare_response(
    claims: Sequence[ClaimRef], results: Mapping[str, PrepareResult]
) -> v1.NodePrepareResourcesResponse:
    """One entry per requested claim: its devices, or its error (devices dropped)."""
    response = v1.NodePrepareResourcesResponse()
    for ref in claims:
        result = results.get(ref.uid)
        entry = response.claims[ref.uid]
        entry.error = _entry_error(None if result is None else result.error)
        if result is not None and not entry.error:
            entry.devices.extend(_device_pb(result))
    if response.ByteSize() > MAX_RESPONSE_BYTES:
        size = response.ByteSize()
        log.error("%s answer is %d bytes, above %d", PREPARE, size, MAX_RESPONSE_BYTES)
        response = v1.NodePrepareResourcesResponse()
        for ref in claims:
            response.claims[ref.uid].error = (
                f"the prepared devices do not fit in one answer ({size} bytes for"
                f" {len(claims)} claims, at most {MAX_RESPONSE_BYTES})"
            )
    return response


def unprepare_response(
    claims: Sequence[ClaimRef], results: Mapping[str, str]
) -> v1.NodeUnprepareResourcesResponse:
    """One entry per requested claim, empty when it is done."""
    response = v1.NodeUnprepareResourcesResponse()
    for ref in claims:
        response.claims[ref.uid].error = _entry_error(results.get(ref.uid))
    return response


class DraService:
    """The DRAPlugin handlers over one ``ClaimPreparer``, for both API versions."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._preparer = preparer

    def _claims(
        self, request: v1.NodePrepareResourcesRequest | v1.NodeUnprepareResourcesRequest
        | Malformed, context: grpc.ServicerContext, call: str, *, need_names: bool,
    ) -> list[ClaimRef]:
        if isinstance(request, Malformed):
            guard.invalid(context, call, request.why)
        try:
            return claims_of(request.claims, need_names=need_names)
        except _Invalid as exc:
            guard.invalid(context, call, str(exc))

    def node_prepare(
        self, request: v1.NodePrepareResourcesRequest | Malformed, context: grpc.ServicerContext
    ) -> v1.NodePrepareResourcesResponse:
        claims = self._claims(request, context, PREPARE, need_names=True)
        if not claims:
            return v1.NodePrepareResourcesResponse()
        results = _results(
            PREPARE, "preparing", claims, self._preparer.prepare,
            lambda why: PrepareResult(error=why),
        )
        return prepare_response(claims, results)

    def node_unprepare(
        self, request: v1.NodeUnprepareResourcesRequest | Malformed,
        context: grpc.ServicerContext,
    ) -> v1.NodeUnprepareResourcesResponse:
        claims = self._claims(request, context, UNPREPARE, need_names=False)
        if not claims:
            return v1.NodeUnprepareResourcesResponse()
        results = _results(UNPREPARE, "unpreparing", claims, self._preparer.unprepare, str)
        return unprepare_response(claims, results)

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        """The DRAPlugin service under its v1 and v1beta1 names."""
        methods: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            PREPARE: guard.unary(
                self.node_prepare,
                guard.parser(v1.NodePrepareResourcesRequest, "NodePrepareResourcesRequest"),
            ),
            UNPREPARE: guard.unary(
                self.node_unprepare,
                guard.parser(v1.NodeUnprepareResourcesRequest, "NodeUnprepareResourcesRequest"),
            ),
        }
        return [
            grpc.method_handlers_generic_handler(service, methods)
            for service in (SERVICE_V1, SERVICE_V1BETA1)
        ]

