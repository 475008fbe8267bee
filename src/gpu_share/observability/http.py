"""A bounded HTTP/1.1 server, and the agent's ``/metrics``, ``/healthz``, ``/readyz`` on it.

``BoundedServer`` (http_server.py, re-exported here) serves the agent endpoint, the
scheduler extender and the DRA webhook. The stdlib ``ThreadingHTTPServer`` it replaces
spent one thread per connection with no socket timeout and read bodies of any size, so
idle or half-sent clients held threads and memory without bound.
Here:

* one I/O thread accepts connections, does TLS handshakes (non-blocking) and receives
  whole requests, head and body, without blocking: an idle, half-sent or trickling client,
  in its head or in its body, costs a file descriptor and a bounded buffer, never a
  thread. At most ``max_connections`` are open; a new one evicts the longest-parked one,
  or is refused when none is parked;
* a connection with a whole request goes to a bounded queue (full: ``503`` and close)
  served by ``workers`` threads, which parse it from the buffer and answer it, then hand
  the connection back to the I/O thread: a worker never waits for a client's bytes, so no
  number of slow clients can hold the workers;
* a connection buffers its head (at most 128 KiB) and then its body (at most
  ``max_body_bytes``); bodies being received or served hold room in a budget shared by
  all connections (``max_buffered_bytes``): a body that does not fit makes the oldest one
  still being received give way (``503``), or is refused (``503``) when requests being
  served hold the rest;
* deadlines, not per-read timeouts: a request, head and body, must arrive within
  ``read_timeout_s`` of its first byte (of the connection, for the first one): a late
  head is closed, a late body answered ``408``; a kept-alive connection may stay silent
  ``idle_timeout_s``; an answer must be written within ``read_timeout_s``;
* the head is read strictly (http_io.read_head, RFC 9112): a field name that is not a
  token (whitespace before the colon), obsolete line folding, control characters in a
  value, more than one ``Content-Length`` or one that is not digits get ``400``;
  ``Transfer-Encoding`` (chunked) and a body-carrying method without ``Content-Length``
  get ``411``; a request announcing more than ``max_body_bytes`` gets ``413``; all before
  any body byte is read, and every such refusal closes the connection, so unread bytes
  are never parsed as a next request. The body is dropped after its request;
* a client that disconnects or times out is a debug log line, never a traceback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http import HTTPStatus

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from gpu_share.observability.http_handler import (
    JSON_TYPE,
    NOT_FOUND,
    REASON_LIMIT,
    BoundedHandler,
    JsonHandler,
    ServerLimits,
    clip,
    short_repr,
)
from gpu_share.observability.http_server import BoundedServer, server_tls_context

__all__ = [
    "AGENT_LIMITS",
    "JSON_TYPE",
    "NOT_FOUND",
    "READY_METRIC",
    "REASON_LIMIT",
    "BoundedHandler",
    "BoundedServer",
    "Heartbeat",
    "HttpHandle",
    "JsonHandler",
    "Probe",
    "ServerLimits",
    "clip",
    "server_tls_context",
    "short_repr",
    "start_http",
]

log = logging.getLogger(__name__)

Probe = Callable[[], bool]

# -- the agent's endpoint --------------------------------------------------------------

READY_METRIC = "gpu_share_ready"
READY_HELP = (
    "1 while /readyz answers ok (the agent is registered with the kubelet), 0 otherwise."
)

AGENT_LIMITS = ServerLimits(
    workers=4, queue=16, max_connections=64, read_timeout_s=10.0, idle_timeout_s=30.0
)


class Heartbeat:
    """Liveness of a loop: the loop calls ``beat()``, ``/healthz`` asks ``alive()``."""

    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_age_s = max_age_s
        self._clock = clock
        self._last = clock()
        self._lock = threading.Lock()

    def beat(self) -> None:
        with self._lock:
            self._last = self._clock()

    def alive(self) -> bool:
        with self._lock:
            return self._clock() - self._last <= self._max_age_s


class HttpHandle:
    """A running endpoint; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, server: BoundedServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.host = str(server.server_address[0])
        self.port = int(server.server_address[1])
        self._stopped = False

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and close the socket. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown(timeout_s)
        self._server.server_close()
        self._thread.join(timeout_s)


def _run_probe(probe: Probe | None) -> tuple[bool, str]:
    if probe is None:
        return True, "ok"
    try:
        return (True, "ok") if probe() else (False, "not ok")
    except Exception as exc:  # a broken probe means "not ok", not a crashed server
        return False, clip(f"probe failed: {exc}", 300)


def start_http(
    registry: CollectorRegistry,
    *,
    bind_address: str = "0.0.0.0",
    port: int = 9400,
    liveness: Probe | None = None,
    readiness: Probe | None = None,
    limits: ServerLimits = AGENT_LIMITS,
) -> HttpHandle:
    """Serve in a daemon thread; returns once the socket is bound (port 0: ephemeral).

    With ``readiness``, /metrics also carries ``READY_METRIC`` (what /readyz answers, as
    1 or 0, asked at each scrape): the agent's readiness is its registration with the
    kubelet, which an alert needs and no other metric shows (a DRA agent never counts
    registrations)."""
    ready_registry = CollectorRegistry()
    ready_gauge = Gauge(READY_METRIC, READY_HELP, registry=ready_registry)

    def exposition() -> bytes:
        if readiness is None:
            return generate_latest(registry)
        ready_gauge.set(1 if _run_probe(readiness)[0] else 0)
        return generate_latest(registry) + generate_latest(ready_registry)

    class Handler(BoundedHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    data = exposition()
                except Exception:  # a broken collector: a fixed answer, the log has why
                    log.exception("collecting metrics failed")
                    self.send_error(HTTPStatus.INTERNAL_SERVER_ERROR, "collecting metrics failed")
                    return
                self.send_body(200, data, CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/livez"):
                self._probe(liveness)
            elif path == "/readyz":
                self._probe(readiness)
            else:
                self.send_body(404, b"not found\n", "text/plain; charset=utf-8")

        def _probe(self, probe: Probe | None) -> None:
            ok, text = _run_probe(probe)
            self.send_body(
                200 if ok else 503, (text + "\n").encode(), "text/plain; charset=utf-8"
            )

    server = BoundedServer(Handler, (bind_address, port), limits, name="http")
    return HttpHandle(server, server.start())
