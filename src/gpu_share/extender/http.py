"""HTTP front of the extender, on the bounded server of observability/http.py.

See docs/extender.md ("HTTP stack", "Securing the extender"). Every malformed request
answers 400 with a short reason (extender/validate.py checks the body before the core
runs); a bug answers 500 with a fixed message, the details go to the log only. With
``metrics``, each POST is counted by verb and outcome and timed; the metrics themselves are
served on a separate listener (cli/extender_main.py ``--metrics-port``), never here.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from json.encoder import encode_basestring_ascii
from typing import Any, Generic, TypeVar

from gpu_share.extender import validate
from gpu_share.extender.api import HostPriority
from gpu_share.extender.core import Extender
from gpu_share.observability.http import (
    JSON_TYPE,
    NOT_FOUND,
    BoundedServer,
    JsonHandler,
    ServerLimits,
)
from gpu_share.observability.metrics import OTHER_VERB, ExtenderMetrics

log = logging.getLogger(__name__)

A = TypeVar("A")

MiB = 2**20
# NodeNames-only args (nodeCacheCapable, what the chart configures) are a few KiB even
# for thousands of nodes; full Nodes lists are bigger, hence a configurable cap.
# The timeouts are ServerLimits' defaults (10 s a request, 30 s idle).
EXTENDER_LIMITS = ServerLimits(workers=16, queue=64, max_connections=256, max_body_bytes=4 * MiB)
INTERNAL_ERROR = "internal error (see the extender log)"
_PRIORITY = '{"Host": %s, "Score": %d}'


def _dumps(answer: object) -> bytes:
    return json.dumps(answer).encode()


def encode_priorities(answer: list[HostPriority]) -> bytes:
    """``_dumps`` of prioritize's answer (the core's {"Host": str, "Score": int} items, in
    that key order), byte for byte, a third faster at 5,000 nodes: C's string encoder
    per name instead of json's walk over 5,000 small dicts. A score that is not an int
    (``%d`` would not write it as json does) goes the generic way."""
    if not all(type(h["Score"]) is int for h in answer):
        return _dumps(answer)
    items = [_PRIORITY % (encode_basestring_ascii(h["Host"]), h["Score"]) for h in answer]
    return ("[" + ", ".join(items) + "]").encode()


def _outcome(code: int, answer: object) -> str:
    """The ``outcome`` label of a request answered with ``code`` and ``answer``."""
    if code >= 500:
        return "internal"
    if code >= 400:
        return "refused"
    return "error" if isinstance(answer, dict) and answer.get("Error") else "ok"


def _filter_counts(answer: object) -> tuple[int, int]:
    """(passed, failed) nodes of a filter answer; (0, 0) for one with an Error."""
    if not isinstance(answer, dict) or answer.get("Error"):
        return 0, 0
    names = answer.get("NodeNames")
    passed = len(names) if names is not None else len((answer.get("Nodes") or {}).get("items", []))
    return passed, len(answer.get("FailedNodes") or {})


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
    encode: Callable[[Any], bytes] = _dumps  # the answer -> the body (json.dumps's bytes)

    def parse(self, value: Any) -> Callable[[], object]:
        """The call answering ``value``; raises ``validate.BadRequest``."""
        return partial(self.run, self.check(value))


@dataclass(frozen=True)
class _Served:
    """What one extender server answers with: its routes, probes and metrics."""

    routes: Mapping[str, _Route[Any]]
    liveness: Callable[[], bool] | None
    metrics: ExtenderMetrics | None

    def count(self, path: str, code: int, answer: object, started: float) -> None:
        if self.metrics is None:
            return
        route = path.split("?", 1)[0].rstrip("/")
        verb = route[1:] if route in self.routes else OTHER_VERB
        self.metrics.observe_request(verb, _outcome(code, answer), time.perf_counter() - started)
        if verb == "filter" and code == 200:
            self.metrics.observe_filter(*_filter_counts(answer))


class _ExtenderHandler(JsonHandler):
    """The scheduler's calls; ``served`` is set on the subclass ``make_server`` builds."""

    served: _Served
    _started = 0.0

    def parse_request(self) -> bool:
        self._started = time.perf_counter()
        self.path = ""  # a request line that does not parse names no verb
        return super().parse_request()

    def send_error(
        self, code: int, message: str | None = None, explain: str | None = None
    ) -> None:
        # Refusals before do_POST runs (411, 413, 405, a request line that does not
        # parse: no command, and path/start may be the previous request's).
        if not self.command:
            self.served.count("", code, None, time.perf_counter())
        elif self.command not in ("GET", "HEAD"):
            self.served.count(self.path, code, None, self._started)
        super().send_error(code, message, explain)

    def error_json(self, reason: str) -> object:
        return {"Error": reason}

    def probe(self) -> tuple[bool, str]:
        return _probe(self.served.liveness)

    def do_POST(self) -> None:
        code, answer, data = self._answer()
        self.served.count(self.path, code, answer, self._started)
        self.send_body(code, data, JSON_TYPE)

    def _answer(self) -> tuple[int, object, bytes]:
        code, answer = self._run()
        if code == HTTPStatus.OK:
            entry = self.served.routes.get(self.route())
            try:
                return code, answer, (entry.encode if entry else _dumps)(answer)
            except Exception:  # a bug: an answer JSON cannot carry
                log.exception("extender answer of %s cannot be encoded", self.path)
                code, answer = 500, {"Error": INTERNAL_ERROR}
        return code, answer, json.dumps(answer).encode()

    def _run(self) -> tuple[int, object]:
        route = self.route()
        entry = self.served.routes.get(route)
        if entry is None:
            return 404, {"Error": NOT_FOUND}
        try:
            call = entry.parse(validate.parse_json(self.body))
        except validate.BadRequest as e:
            return 400, {"Error": str(e)}
        try:
            answer = call()
        except Exception:  # a bug must not kill the server; the scheduler retries
            log.exception("extender %s failed", route)
            return 500, {"Error": INTERNAL_ERROR}
        return HTTPStatus.OK, answer


def make_server(
    extender: Extender,
    host: str,
    port: int,
    *,
    limits: ServerLimits = EXTENDER_LIMITS,
    ssl_context: ssl.SSLContext | None = None,
    liveness: Callable[[], bool] | None = None,
    metrics: ExtenderMetrics | None = None,
) -> BoundedServer:
    """The extender's server, bound and not yet serving (``serve_forever``/``start``).

    ``liveness`` backs ``/healthz`` and ``/readyz``: False or an exception (e.g. a
    cluster-view watch loop that stopped beating) answers 503 with a bounded reason.
    ``metrics``: every POST is counted by verb and outcome, and timed (served elsewhere:
    this listener answers the scheduler only)."""
    routes: dict[str, _Route[Any]] = {
        "/filter": _Route(validate.filter_args, extender.filter),
        "/prioritize": _Route(validate.filter_args, extender.prioritize, encode_priorities),
        "/bind": _Route(validate.bind_args, extender.bind),
    }
    served = _Served(routes, liveness, metrics)
    handler = type("ExtenderHandler", (_ExtenderHandler,), {"served": served})
    return BoundedServer(handler, (host, port), limits, ssl_context=ssl_context, name="extender")
