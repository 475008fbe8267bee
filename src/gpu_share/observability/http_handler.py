"""The limits of the bounded HTTP server, and the base of the handlers it serves.

A handler parses one whole request at a time from the connection's buffer (the I/O thread
has received it, see http_io and http_server): the stdlib parses the request line and the
headers, the frame the I/O thread read from the same bytes (``http_io.read_head``) says
how long the body is or why the request is refused, and ``do_*`` runs with the body.
"""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from io import BufferedIOBase
from typing import Any, cast

from gpu_share.observability.http_io import Reader, Writer

log = logging.getLogger(__name__)

REASON_LIMIT = 100  # characters of any text derived from a request in an answer
JSON_TYPE = "application/json"
NOT_FOUND = "no such route"
PROBE_PATHS = ("/healthz", "/readyz")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def clip(text: str, limit: int = REASON_LIMIT) -> str:
    """``text`` cut to ``limit`` characters (answers never echo unbounded input)."""
    return text if len(text) <= limit else text[:limit] + "..."


def short_repr(value: object, limit: int = REASON_LIMIT) -> str:
    """``repr`` of a request-supplied value, bounded (``limit`` characters of it)."""
    if isinstance(value, str | bytes) and len(value) > limit:
        return repr(value[:limit]) + "..."
    return clip(repr(value), limit)


@dataclass(frozen=True)
class ServerLimits:
    workers: int = 4
    queue: int = 16  # connections with a whole request waiting for a worker
    max_connections: int = 64  # open connections: parked, queued and being served
    read_timeout_s: float = 10.0  # a whole request (head and body) from its first byte
    idle_timeout_s: float = 30.0  # between requests on a kept-alive connection
    max_body_bytes: int = 16 * 1024
    # Bodies being received and served, all connections together (``body_budget``);
    # None: max(workers, 8) bodies of max_body_bytes, at least 1 MiB.
    max_buffered_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.workers < 1 or self.queue < 1 or self.max_connections < 1:
            raise ValueError("workers, queue and max_connections must be at least 1")
        if self.read_timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.max_body_bytes < 0:
            raise ValueError("max_body_bytes must not be negative")
        if self.max_buffered_bytes is not None and self.max_buffered_bytes < self.max_body_bytes:
            raise ValueError("max_buffered_bytes must be at least max_body_bytes")

    @property
    def body_budget(self) -> int:
        if self.max_buffered_bytes is not None:
            return self.max_buffered_bytes
        return max(max(self.workers, 8) * self.max_body_bytes, 2**20)


class BoundedHandler(BaseHTTPRequestHandler):
    """Base of the handlers served by ``BoundedServer``: define ``do_GET``/``do_POST``.

    The request body (at most ``limits.max_body_bytes``, received before ``do_*`` runs) is
    in ``self.body``. Answer with ``send_body``; ``send_error`` answers with a short reason
    (``error_body`` shapes it) and closes the connection. One handler object serves every
    request of its connection, one request at a time.
    """

    protocol_version = "HTTP/1.1"
    server_version = "gpu-share"
    limits: ServerLimits
    body: bytes = b""
    _length = 0
    _checked = False
    _reader: Reader

    def _attach(
        self, sock: socket.socket, addr: Any, reader: Reader, writer: Writer,
        limits: ServerLimits,
    ) -> None:
        # BaseHTTPRequestHandler.__init__ would serve the socket right away; the server
        # drives handle_one_request itself, one request per turn.
        self.request = self.connection = sock
        self.client_address = addr
        # Duck-typed files: the stdlib handler only calls readline/read and write/flush.
        self._reader = reader
        self.rfile = cast(BufferedIOBase, reader)
        self.wfile = cast(BufferedIOBase, writer)
        self.limits = limits
        self.close_connection = True

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s: %s", self.client_address[0], clip(format % args, 300))

    def error_body(self, code: int, reason: str) -> tuple[bytes, str]:
        """The body and content type of an error answer (``reason`` is already short)."""
        return (reason + "\n").encode(), "text/plain; charset=utf-8"

    def send_body(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self._end_with(body)

    def _end_with(self, body: bytes) -> None:
        """Ends the headers and sends them with ``body`` in ONE write: two small writes on
        a kept-alive connection meet Nagle's algorithm and the client's delayed ACK, and
        every answer waited ~40 ms for it (the scheduler's extender calls: 2 per pod)."""
        buf: list[bytes] = self._headers_buffer  # type: ignore[attr-defined]
        buf.append(b"\r\n")
        if self.command != "HEAD":
            buf.append(body)
        self.flush_headers()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # The stdlib's version echoes the request line in its page and puts ``message``
        # in the status line; here the status line has the standard phrase, and the body
        # a bounded reason. A 5xx for an HTTP version is the client's fault: 400.
        if code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED:
            code, message = HTTPStatus.BAD_REQUEST, "unsupported HTTP version"
        # The stdlib leaves the version at HTTP/0.9 (no status line) until it has parsed
        # one; every answer here has a status line.
        if self.request_version == "HTTP/0.9":
            self.request_version = self.protocol_version
        self.close_connection = True
        reason = clip(message) if message else HTTPStatus(code).phrase
        body, ctype = self.error_body(code, reason)
        self.log_error("code %d, %s", code, reason)
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self._end_with(body)

    def parse_request(self) -> bool:
        self._checked = False
        self.body = b""
        if not super().parse_request():
            return False
        if self.request_version == "HTTP/0.9":
            self.send_error(HTTPStatus.BAD_REQUEST, "HTTP/0.9 is not supported")
            return False
        if not self._checked and not self._check_framing():
            return False
        return self._read_body()

    def handle_expect_100(self) -> bool:
        # The I/O thread has answered "100 Continue" when the body was still to come, and
        # received it; a refused request is refused before the client sends a body.
        return self._check_framing()

    def _check_framing(self) -> bool:
        self._checked = True
        command = self.command or ""
        frame = self._reader.current
        if not hasattr(self, "do_" + command):
            self.send_error(HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed")
            return False
        if frame is None:  # no end of head in what was received: not served
            self.send_error(HTTPStatus.BAD_REQUEST, "incomplete request")
            return False
        if frame.refusal is not None:
            self.send_error(*frame.refusal)
            return False
        if frame.length is None and command in _BODY_METHODS:
            self.send_error(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
            return False
        self._length = frame.length or 0
        return True

    def _read_body(self) -> bool:
        if self._length == 0:
            return True
        data = self.rfile.read(self._length)  # received whole by the I/O thread
        if len(data) < self._length:
            self.close_connection = True
            log.debug("http %s: body ended early", self.client_address[0])
            return False
        self.body = data
        return True


class JsonHandler(BoundedHandler):
    """Base of the JSON front-ends (extender, webhook): every answer is JSON, an error one
    shaped by ``error_json``; ``GET`` answers the probes (``probe``) and 404 otherwise."""

    def error_json(self, reason: str) -> object:
        """The JSON value of an error answer."""
        raise NotImplementedError

    def probe(self) -> tuple[bool, str]:
        """(healthy, status text) for ``/healthz`` and ``/readyz``."""
        return True, "ok"

    def error_body(self, code: int, reason: str) -> tuple[bytes, str]:
        return json.dumps(self.error_json(reason)).encode(), JSON_TYPE

    def send_json(self, code: int, body: Any) -> None:
        self.send_body(code, json.dumps(body).encode(), JSON_TYPE)

    def route(self) -> str:
        """The request's path without its query and trailing slash."""
        return self.path.split("?", 1)[0].rstrip("/")

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] in PROBE_PATHS:
            ok, status = self.probe()
            self.send_json(200 if ok else 503, {"status": status})
        else:
            self.send_json(404, self.error_json(NOT_FOUND))
