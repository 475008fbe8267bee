"""AdmissionReview (admission.k8s.io/v1) in and out, and the mutation it asks for.

``Mutator.handle(body)`` is the whole webhook minus HTTP: it answers ``(400, error)``
when the body is no AdmissionReview with a usable uid (nothing to answer to), and
otherwise ``(200, AdmissionReview)`` carrying that uid, allowed or denied:

- not a Pod CREATE (a misconfigured webhook): allowed, unchanged;
- a pod whose vcuda amounts cannot become claims: denied, code 400, the reason;
- a namespace without the opt-in label (a review the API server's namespaceSelector
  would not have sent: someone else reached the port): denied, 403, nothing created;
- a same-named template that asks something else: denied, 409;
- the API server unreachable, or too slow: denied, 503 (the client retries);
- a bug: denied, 500 with a fixed message (the log has the traceback).

Nothing of the request is echoed but the uid (checked against a strict pattern) and
the bounded reasons of ``claim_translation``.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_share.errors import InputError, KubeAccessError
from gpu_share.kube.claim_templates import TemplateConflict
from gpu_share.observability import jsonbody
from gpu_share.sharing.dra.claim_translation import (
    ClaimRequestError,
    TranslationSettings,
    translate_pod,
)

log = logging.getLogger(__name__)

__all__ = ["API_VERSION", "BadReview", "Mutator", "parse_json"]

API_VERSION = "admission.k8s.io/v1"
MAX_DEPTH = 64  # JSON nesting; a pod is about 12 deep
MAX_MESSAGE = 300
INTERNAL_ERROR = "gpu-share webhook: internal error (see the webhook log)"
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}

EnsureTemplates = Callable[[Iterable[Mapping[str, Any]], float], None]
OptedIn = Callable[[str, float], bool]


class BadReview(InputError):
    """The body is no AdmissionReview we can answer; ``str(e)`` is a fixed reason."""


def parse_json(body: bytes) -> Any:
    """Strict JSON (observability.jsonbody: UTF-8, no NaN/Infinity, at most
    ``MAX_DEPTH`` levels), or ``BadReview``."""
    try:
        return jsonbody.parse_json(body, MAX_DEPTH)
    except jsonbody.BadJson as e:
        raise BadReview(str(e)) from None


def _envelope(value: Any) -> tuple[str, Mapping[str, Any]]:
    """(uid, request) of an AdmissionReview; raises BadReview."""
    if not isinstance(value, dict):
        raise BadReview("body is not a JSON object")
    if value.get("apiVersion") != API_VERSION or value.get("kind") != "AdmissionReview":
        raise BadReview(f"expected kind AdmissionReview of apiVersion {API_VERSION}")
    request = value.get("request")
    if not isinstance(request, dict):
        raise BadReview("AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not _UID.match(uid):
        raise BadReview("request.uid is missing or not a valid uid")
    return uid, request


def _is_pod_create(request: Mapping[str, Any]) -> bool:
    kind = request.get("kind")
    resource = request.get("resource")
    return (
        kind == _POD_KIND
        and isinstance(resource, dict)
        and resource.get("resource") == "pods"
        and resource.get("group", "") == ""
        and not request.get("subResource")
        and request.get("operation") == "CREATE"
    )


@dataclass(frozen=True)
class _Verdict:
    allowed: bool
    patch: tuple[dict[str, Any], ...] = ()
    code: int = 200
    reason: str = ""
    message: str = ""


def _deny(code: int, reason: str, message: str) -> _Verdict:
    return _Verdict(False, code=code, reason=reason, message=message[:MAX_MESSAGE])


def _answer(uid: str, v: _Verdict) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": v.allowed}
    if v.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(v.patch)).encode()).decode()
    if not v.allowed:
        response["status"] = {
            "status": "Failure", "code": v.code, "reason": v.reason, "message": v.message,
        }
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def error_body(reason: str) -> dict[str, Any]:
    """The JSON of a 4xx answer (no AdmissionReview to answer in)."""
    return {"error": reason[:MAX_MESSAGE]}


def _every_namespace(_namespace: str, _deadline: float) -> bool:
    return True


class Mutator:
    """Turns a Pod CREATE's vcuda amounts into ResourceClaims (see the module doc).

    ``ensure_templates(bodies, deadline)`` makes the templates exist (skipped for dry
    runs: sideEffects NoneOnDryRun); ``deadline`` is ``clock() + budget_s``.
    ``opted_in(namespace, deadline)`` is asked first: no templates outside namespaces
    that opted in (None: every namespace, for callers that check elsewhere)."""

    def __init__(
        self,
        settings: TranslationSettings,
        ensure_templates: EnsureTemplates,
        *,
        opted_in: OptedIn | None = None,
        budget_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._ensure = ensure_templates
        self._opted_in = opted_in or _every_namespace
        self._budget = budget_s
        self._clock = clock

    def handle(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON answer) for a request body."""
        try:
            uid, request = _envelope(parse_json(body))
        except BadReview as e:
            return 400, error_body(str(e))
        try:
            verdict = self._decide(request)
        except Exception:  # a bug must not become a 500 without the uid
            log.exception("admission review %s failed", uid)
            verdict = _deny(500, "InternalError", INTERNAL_ERROR)
        return 200, _answer(uid, verdict)

    def _decide(self, request: Mapping[str, Any]) -> _Verdict:
        if not _is_pod_create(request):
            log.warning("not a Pod CREATE (operation %r): allowed unchanged; check the "
                        "MutatingWebhookConfiguration's rules",
                        str(request.get("operation"))[:20])
            return _Verdict(True)
        namespace = request.get("namespace")
        if not isinstance(namespace, str) or not _DNS_LABEL.match(namespace):
            return _deny(400, "BadRequest", "gpu-share: request.namespace is not a namespace")
        try:
            t = translate_pod(request.get("object"), namespace, self.settings)
        except ClaimRequestError as e:
            return _deny(400, "BadRequest", f"gpu-share: {e}")
        if not t.changed:
            return _Verdict(True)
        if request.get("dryRun") is not True:
            failed = self._templates(namespace, t.templates)
            if failed is not None:
                return failed
        return _Verdict(True, t.patch)

    def _templates(self, namespace: str, bodies: tuple[dict[str, Any], ...]
                   ) -> _Verdict | None:
        deadline = self._clock() + self._budget
        try:
            if not self._opted_in(namespace, deadline):
                log.warning("review for namespace %s, which has not opted in: denied (a "
                            "caller other than the API server?)", namespace)
                return _deny(403, "Forbidden", f"gpu-share: namespace {namespace} has not "
                             "opted in to DRA translation (its label is missing)")
            self._ensure(bodies, deadline)
        except TemplateConflict as e:
            return _deny(409, "Conflict", f"gpu-share: {e}")
        except KubeAccessError as e:
            log.warning("ensuring claim templates failed: %s", e)
            return _deny(503, "ServiceUnavailable",
                         f"gpu-share: cannot ensure the ResourceClaimTemplates: {e}")
        return None
