"""HTTPS front of the admission webhook, on the bounded server of observability/http.py.

``POST /mutate`` (the API server appends ``?timeout=5s``; the query is ignored) takes an
AdmissionReview; ``GET /healthz`` and ``/readyz`` answer 200. The server bounds the
body (``max_body_bytes``, 413 before reading it), the time to receive a request and
to keep an idle connection, the connections and the worker pool (observability/http).
With ``require_client_cert`` (the CLI's ``--client-ca-file``), a review on a connection
whose client sent no certificate is refused with 403 (the TLS layer has already refused
certificates of other CAs); the probes need none.
A malformed request answers 4xx with a fixed reason; once a review has a uid every
answer is 200 with an AdmissionReview carrying it (review.py); never 500.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable

from gpu_share.observability.http import NOT_FOUND, BoundedServer, JsonHandler, ServerLimits
from gpu_share.webhook.review import Mutator, error_body

log = logging.getLogger(__name__)

__all__ = ["WEBHOOK_LIMITS", "make_server"]

MiB = 2**20
# The API server keeps a few connections alive per webhook and sends one review at a
# time on each; a review is the pod plus a little (pods are well under 1 MiB).
WEBHOOK_LIMITS = ServerLimits(
    workers=8,
    queue=32,
    max_connections=128,
    read_timeout_s=5.0,
    idle_timeout_s=60.0,
    max_body_bytes=1 * MiB,
)
NO_CLIENT_CERT = "a client certificate is required"


def make_server(
    mutator: Mutator,
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None,
    limits: ServerLimits = WEBHOOK_LIMITS,
    liveness: Callable[[], bool] | None = None,
    require_client_cert: bool = False,
) -> BoundedServer:
    """The webhook's server, bound and not yet serving (``start``/``serve_forever``).
    ``ssl_context`` None serves plain HTTP (tests only: the API server calls HTTPS)."""

    class Handler(JsonHandler):
        def error_json(self, reason: str) -> object:
            return error_body(reason)

        def probe(self) -> tuple[bool, str]:
            ok = _alive(liveness)
            return ok, "ok" if ok else "not ok"

        def do_POST(self) -> None:
            if self.route() != "/mutate":
                self.send_json(404, error_body(NOT_FOUND))
                return
            if require_client_cert and not _has_client_cert(self.connection):
                self.send_json(403, error_body(NO_CLIENT_CERT))
                return
            code, answer = mutator.handle(self.body)
            self.send_json(code, answer)

    return BoundedServer(Handler, (host, port), limits, ssl_context=ssl_context, name="webhook")


def _has_client_cert(sock: object) -> bool:
    """Did the client present a certificate (verified by the TLS layer against the CA)?"""
    getpeercert = getattr(sock, "getpeercert", None)
    if getpeercert is None:
        return False
    try:
        return bool(getpeercert())
    except (ValueError, OSError):
        return False


def _alive(liveness: Callable[[], bool] | None) -> bool:
    if liveness is None:
        return True
    try:
        return bool(liveness())
    except Exception:  # a failing probe is "not ok", never a 500
        log.exception("liveness probe failed")
        return False
