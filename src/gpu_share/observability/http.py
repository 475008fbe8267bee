"""A small HTTP endpoint: ``/metrics``, ``/healthz`` (liveness), ``/readyz`` (readiness).

stdlib ``http.server`` in a daemon thread: three read-only routes do not need more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

Probe = Callable[[], bool]


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

    def __init__(self, server: ThreadingHTTPServer, thread: threading.Thread) -> None:
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
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout_s)


def _run_probe(probe: Probe | None) -> tuple[bool, str]:
    if probe is None:
        return True, "ok"
    try:
        return (True, "ok") if probe() else (False, "not ok")
    except Exception as exc:  # a broken probe means "not ok", not a crashed server
        return False, f"probe failed: {exc}"


def start_http(
    registry: CollectorRegistry,
    *,
    bind_address: str = "0.0.0.0",
    port: int = 9400,
    liveness: Probe | None = None,
    readiness: Probe | None = None,
) -> HttpHandle:
    """Serve in a daemon thread; returns once the socket is bound (port 0: ephemeral)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/livez"):
                self._probe(liveness)
            elif path == "/readyz":
                self._probe(readiness)
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def _probe(self, probe: Probe | None) -> None:
            ok, text = _run_probe(probe)
            self._send(200 if ok else 503, (text + "\n").encode(), "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # Probes hit every few seconds; keep them out of the info log.
            log.debug("http %s", format % args)

    server = ThreadingHTTPServer((bind_address, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True
    )
    thread.start()
    return HttpHandle(server, thread)
