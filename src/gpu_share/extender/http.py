"""HTTP front of the extender, on the bounded server of observability/http.py.

See docs/extender.md ("HTTP stack", "Securing the extender"). Every malformed request
answers 400 with a short reason (extender/validate.py checks the body before the core
runs); a bug answers 500 with a fixed message, the details go to the log only.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any, Generic, TypeVar

from gpu_share.extender import validate
from gpu_share.extender.api import ExtenderArgs, ExtenderBindingArgs
from gpu_share.extender.core import Extender
from gpu_share.observability.http import BoundedHandler, BoundedServer, ServerLimits

log = logging.getLogger(__name__)

A = TypeVar("A")

MiB = 2**20
# NodeNames-only args (nodeCacheCapable, what the chart configures) are a few KiB even
# for thousands of nodes; full Nodes lists are bigger, hence a configurable cap.
EXTENDER_LIMITS = ServerLimits(
    workers=16,
    queue=64,
    max_connections=256,
    read_timeout_s=10.0,
    idle_timeout_s=30.0,
    max_body_bytes=4 * MiB,
)
INTERNAL_ERROR = "internal error (see the extender log)"
NOT_FOUND = "no such route"


def _probe(liveness: Callable[[], bool] | None) -> tuple[bool, str]:
    if liveness is None:
        return True, "ok"
    try:
        return (True, "ok") if liveness() else (False, "not ok")
    except Exception as exc:  # a failing probe is "not ok", never a 500
        return False, f"not ok: {exc}"[:300]


@dataclass(frozen=True)
class _Route(Generic[A]):
    check: Callable[[Any], A]  # parsed JSON -> typed args; raises validate.BadRequest
    run: Callable[[A], object]  # typed args -> the JSON-shaped answer

    def parse(self, value: Any) -> Callable[[], object]:
        """The call answering ``value``; raises ``validate.BadRequest``."""
        return partial(self.run, self.check(value))


def make_server(
    extender: Extender,
    host: str,
    port: int,
    *,
    limits: ServerLimits = EXTENDER_LIMITS,
    ssl_context: ssl.SSLContext | None = None,
    liveness: Callable[[], bool] | None = None,
) -> BoundedServer:
    """The extender's server, bound and not yet serving (``serve_forever``/``start``).

    ``liveness`` backs ``/healthz`` and ``/readyz``: False or an exception (e.g. a
    cluster-view watch loop that stopped beating) answers 503 with a bounded reason."""
    routes: dict[str, _Route[ExtenderArgs] | _Route[ExtenderBindingArgs]] = {
        "/filter": _Route(validate.filter_args, extender.filter),
        "/prioritize": _Route(validate.filter_args, extender.prioritize),
        "/bind": _Route(validate.bind_args, extender.bind),
    }

    class Handler(BoundedHandler):
        def error_body(self, code: int, reason: str) -> tuple[bytes, str]:
            return json.dumps({"Error": reason}).encode(), "application/json"

        def _json(self, code: int, body: Any) -> None:
            self.send_body(code, json.dumps(body).encode(), "application/json")

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] in ("/healthz", "/readyz"):
                ok, reason = _probe(liveness)
                self._json(200 if ok else 503, {"status": reason})
            else:
                self._json(404, {"Error": NOT_FOUND})

        def do_POST(self) -> None:
            route = self.path.split("?", 1)[0].rstrip("/")
            entry = routes.get(route)
            if entry is None:
                self._json(404, {"Error": NOT_FOUND})
                return
            try:
                call = entry.parse(validate.parse_json(self.body))
            except validate.BadRequest as e:
                self._json(400, {"Error": str(e)})
                return
            try:
                data = json.dumps(call()).encode()
            except Exception:  # a bug must not kill the server; the scheduler retries
                log.exception("extender %s failed", route)
                self._json(500, {"Error": INTERNAL_ERROR})
                return
            self.send_body(HTTPStatus.OK, data, "application/json")

    return BoundedServer(Handler, (host, port), limits, ssl_context=ssl_context, name="extender")
