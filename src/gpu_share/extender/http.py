"""HTTP front of the extender: stdlib ThreadingHTTPServer (see docs/extender.md for why)."""

from __future__ import annotations

import json
import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpu_share.extender.core import Extender

log = logging.getLogger(__name__)
MAX_BODY = 64 * 1024 * 1024  # NodeNames-only args are small; full Nodes lists can be big


def make_server(extender: Extender, host: str, port: int) -> ThreadingHTTPServer:
    routes = {
        "/filter": extender.filter,
        "/prioritize": extender.prioritize,
        "/bind": extender.bind,
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path in ("/healthz", "/readyz"):
                self._send(200, {"status": "ok"})
            else:
                self._send(404, {"Error": "not found"})

        def do_POST(self) -> None:
            fn = routes.get(self.path.rstrip("/"))
            if fn is None:
                self._send(404, {"Error": f"no route {self.path}"})
                return
            n = int(self.headers.get("Content-Length") or 0)
            if n <= 0 or n > MAX_BODY:
                self._send(413 if n > MAX_BODY else 400, {"Error": "bad body length"})
                return
            try:
                args = json.loads(self.rfile.read(n))
                if not isinstance(args, dict):
                    raise ValueError("body is not a JSON object")
            except ValueError as e:
                self._send(400, {"Error": f"bad JSON: {e}"})
                return
            try:
                self._send(200, fn(args))
            except Exception as e:  # a bug must not kill the server; the scheduler retries
                log.exception("extender %s failed", self.path)
                self._send(500, {"Error": f"internal error: {e}"})

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
