"""A bounded HTTP/1.1 server, and the agent's ``/metrics``, ``/healthz``, ``/readyz`` on it.

``BoundedServer`` serves both the agent endpoint and the scheduler extender. The stdlib
``ThreadingHTTPServer`` it replaces spent one thread per connection with no socket
timeout and read bodies of any size, so idle or half-sent clients held threads and memory
without bound (issue 11, items 1 and 7). Here:

* one I/O thread accepts connections, does TLS handshakes (non-blocking) and reads
  requests without blocking until a whole request head (and a body up to
  ``_GATHER_BODY`` bytes) is in: an idle, half-sent or trickling client costs a file
  descriptor and a bounded buffer, never a thread. At most ``max_connections`` are open;
  a new one evicts the longest-parked one, or is refused when none is parked;
* a connection with a whole request goes to a bounded queue (full: ``503`` and close)
  served by ``workers`` threads, which parse and answer it (a larger body is read by the
  worker under the same deadline), then hand the connection back to the I/O thread;
* deadlines, not per-read timeouts: a request must arrive within ``read_timeout_s`` of
  its first byte (of the connection, for the first one), a kept-alive connection may stay
  silent ``idle_timeout_s``, an answer must be written within ``read_timeout_s``;
* a request announcing more than ``max_body_bytes`` gets ``413`` before any body byte is
  read; ``Transfer-Encoding`` (chunked) gets ``411``; a body-carrying method without
  ``Content-Length`` gets ``411``; every such refusal closes the connection, so unread
  bytes are never parsed as a next request. The body is dropped after its request;
* a client that disconnects or times out is a debug log line, never a traceback.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import logging
import queue
import re
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from io import BufferedIOBase
from typing import Any, cast

from gpu_share.observability.prom import CONTENT_TYPE, Gauge, Registry

log = logging.getLogger(__name__)

Probe = Callable[[], bool]

REASON_LIMIT = 100  # characters of any text derived from a request in an answer
_RECV = 65536
_MAX_HEADER_BYTES = 128 * 1024  # request line (at most 64 KiB) + headers, per request
_GATHER_BODY = 64 * 1024  # bodies up to this are gathered by the I/O thread too
_MAX_TURN = 32  # pipelined requests served in one go before the connection queues again
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_CONTENT_LENGTH = re.compile(rb"^content-length:[ \t]*(\d{1,18})[ \t]*\r?$", re.I | re.M)
_EXPECT = re.compile(rb"^expect:", re.I | re.M)
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
# A client going away mid-request: expected, logged without a traceback.
_CLIENT_GONE = (OSError, http.client.HTTPException, ssl.SSLError)


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
    read_timeout_s: float = 10.0  # a whole request from its first byte; each answer
    idle_timeout_s: float = 30.0  # between requests on a kept-alive connection
    max_body_bytes: int = 16 * 1024

    def __post_init__(self) -> None:
        if self.workers < 1 or self.queue < 1 or self.max_connections < 1:
            raise ValueError("workers, queue and max_connections must be at least 1")
        if self.read_timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.max_body_bytes < 0:
            raise ValueError("max_body_bytes must not be negative")


class _HeadersTooLarge(http.client.LineTooLong):
    """Request line and headers over ``_MAX_HEADER_BYTES`` in total (answered 431)."""


class _Reader:
    """A connection's receive buffer.

    The I/O thread fills it without blocking (``pull``) until ``ready()``: a whole request
    head, plus its body when that is small. The worker then parses from it through
    ``readline``/``read`` (the stdlib handler's ``rfile``); only a body larger than
    ``_GATHER_BODY`` makes it wait on the socket, until ``deadline``.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline = 0.0
        self._buf = bytearray()
        self._scanned = 0  # no end of head before this offset
        self._line_budget = _MAX_HEADER_BYTES

    def __len__(self) -> int:
        return len(self._buf)

    def start_request(self) -> None:
        self._line_budget = _MAX_HEADER_BYTES

    def pull(self) -> bool:
        """Read what the socket has without blocking; False at end of stream."""
        self.sock.setblocking(False)
        while len(self._buf) < _MAX_HEADER_BYTES + _GATHER_BODY:
            try:
                data = self.sock.recv(_RECV)
            except _WOULD_BLOCK:
                return True
            if not data:
                return False
            self._buf += data
        return True

    def ready(self) -> bool:
        """Whether a worker can take the next request without waiting for its head (or
        a body up to ``_GATHER_BODY``); also True when the head is over its limit, so
        the worker answers that."""
        buf = self._buf
        ends = [i for i in (buf.find(b"\n\r\n", self._scanned), buf.find(b"\n\n", self._scanned))
                if i >= 0]
        if not ends:
            self._scanned = max(0, len(buf) - 2)
            return len(buf) >= _MAX_HEADER_BYTES
        head_end = min(ends) + (3 if buf[min(ends) + 1] == 0x0D else 2)
        m = _CONTENT_LENGTH.search(buf, 0, head_end)
        if m is None or _EXPECT.search(buf, 0, head_end):
            return True  # no body, or the client waits for "100 Continue" to send it
        length = int(m.group(1))
        return length > _GATHER_BODY or len(buf) >= head_end + length

    def _fill(self, want: int) -> bool:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("request not received within the read timeout")
        self.sock.settimeout(remaining)
        data = self.sock.recv(max(1, min(_RECV, want)))
        if not data:
            return False
        self._buf += data
        return True

    def _take(self, n: int) -> bytes:
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self._scanned = 0
        return out

    def readline(self, limit: int = -1) -> bytes:
        cap = limit if limit >= 0 else _MAX_HEADER_BYTES + 1
        while True:
            i = self._buf.find(b"\n", 0, cap)
            if i >= 0:
                return self._spend(self._take(i + 1))
            if len(self._buf) >= cap:
                return self._spend(self._take(cap))
            if not self._fill(_RECV):
                return self._spend(self._take(len(self._buf)))

    def _spend(self, line: bytes) -> bytes:
        self._line_budget -= len(line)
        if self._line_budget < 0:
            raise _HeadersTooLarge(f"request headers over {_MAX_HEADER_BYTES} bytes")
        return line

    def read(self, n: int) -> bytes:
        while len(self._buf) < n:
            if not self._fill(n - len(self._buf)):
                break
        return self._take(min(n, len(self._buf)))


class _Writer:
    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self.sock = sock
        self._timeout_s = timeout_s

    def write(self, data: bytes) -> int:
        self.sock.settimeout(self._timeout_s)  # sendall: total time for the whole answer
        self.sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass


class BoundedHandler(BaseHTTPRequestHandler):
    """Base of the handlers served by ``BoundedServer``: define ``do_GET``/``do_POST``.

    The request body (at most ``limits.max_body_bytes``, read before ``do_*`` runs) is in
    ``self.body``. Answer with ``send_body``; ``send_error`` answers with a short reason
    (``error_body`` shapes it) and closes the connection. One handler object serves every
    request of its connection, one request at a time.
    """

    protocol_version = "HTTP/1.1"
    server_version = "gpu-share"
    limits: ServerLimits
    body: bytes = b""
    _length = 0
    _checked = False

    def _attach(self, conn: _Conn, limits: ServerLimits) -> None:
        # BaseHTTPRequestHandler.__init__ would serve the socket right away; the server
        # drives handle_one_request itself, one request per turn.
        self.request = self.connection = conn.sock
        self.client_address = conn.addr
        # Duck-typed files: the stdlib handler only calls readline/read and write/flush.
        self.rfile = cast(BufferedIOBase, conn.reader)
        self.wfile = cast(BufferedIOBase, conn.writer)
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
        # Refuse before the client sends a body we would not read.
        return self._check_framing() and super().handle_expect_100()

    def _check_framing(self) -> bool:
        self._checked = True
        command = self.command or ""
        if not hasattr(self, "do_" + command):
            self.send_error(HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed")
            return False
        if "Transfer-Encoding" in self.headers:
            self.send_error(
                HTTPStatus.LENGTH_REQUIRED,
                "Transfer-Encoding is not accepted; send the body with Content-Length",
            )
            return False
        lengths = self.headers.get_all("Content-Length") or []
        if len(lengths) > 1:
            self.send_error(HTTPStatus.BAD_REQUEST, "more than one Content-Length")
            return False
        if not lengths:
            if command in _BODY_METHODS:
                self.send_error(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
                return False
            self._length = 0
            return True
        text = lengths[0].strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 18):
            self.send_error(HTTPStatus.BAD_REQUEST, "invalid Content-Length")
            return False
        self._length = int(text)
        if self._length > self.limits.max_body_bytes:
            self.send_error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"body of {self._length} bytes is over the limit of "
                f"{self.limits.max_body_bytes} bytes",
            )
            return False
        return True

    def _read_body(self) -> bool:
        if self._length == 0:
            return True
        data = self.rfile.read(self._length)  # TimeoutError at the deadline: dropped
        if len(data) < self._length:
            self.close_connection = True
            log.debug("http %s: body ended early", self.client_address[0])
            return False
        self.body = data
        return True


class _Conn:
    __slots__ = (
        "addr", "closed", "deadline", "handler", "handshaking", "reader", "served", "sock",
        "writer",
    )

    def __init__(
        self, sock: socket.socket, addr: Any, handler: BoundedHandler, limits: ServerLimits
    ) -> None:
        self.sock = sock
        self.addr = addr
        self.reader = _Reader(sock)
        self.writer = _Writer(sock, limits.read_timeout_s)
        self.handler = handler
        self.deadline = 0.0  # parked: closed at this time
        self.served = 0
        self.handshaking = isinstance(sock, ssl.SSLSocket)
        self.closed = False
        handler._attach(self, limits)


def _listen(host: str, port: int) -> socket.socket:
    family, kind, proto, _, addr = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class BoundedServer:
    """Serves ``handler_class`` on ``(host, port)`` within ``limits`` (see module doc);
    with ``ssl_context``, over TLS (a client certificate when the context requires one).

    Same surface as ``socketserver.TCPServer`` where callers use it: ``server_address``,
    ``serve_forever()``, ``shutdown()`` (from another thread), ``server_close()``.
    """

    def __init__(
        self,
        handler_class: type[BoundedHandler],
        address: tuple[str, int],
        limits: ServerLimits,
        *,
        ssl_context: ssl.SSLContext | None = None,
        name: str = "http",
    ) -> None:
        self.handler_class = handler_class
        self.limits = limits
        self.name = name
        self._ssl = ssl_context
        self._listener = _listen(*address)
        sockname = self._listener.getsockname()
        self.server_address: tuple[str, int] = (str(sockname[0]), int(sockname[1]))
        self._ready: queue.SimpleQueue[_Conn | None] = queue.SimpleQueue()
        self._queued = 0  # connections in _ready
        self._returns: collections.deque[_Conn] = collections.deque()
        self._parked: dict[_Conn, None] = {}  # insertion order = oldest first
        self._open = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._started = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._workers: list[threading.Thread] = []
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> threading.Thread:
        """``serve_forever`` in a daemon thread; returns once every thread runs."""
        t = threading.Thread(target=self.serve_forever, name=f"{self.name}-io", daemon=True)
        t.start()
        self._started.wait(10)
        return t

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._done.clear()
        self._workers = [
            threading.Thread(target=self._work, name=f"{self.name}-worker-{i}", daemon=True)
            for i in range(self.limits.workers)
        ]
        for t in self._workers:
            t.start()
        self._started.set()
        sel = selectors.DefaultSelector()
        try:
            sel.register(self._listener, selectors.EVENT_READ, None)
            sel.register(self._wake_r, selectors.EVENT_READ, None)
            while not self._stopping.is_set():
                try:
                    self._loop_once(sel, poll_interval)
                except Exception:  # a bug here must not stop the endpoint for good
                    log.exception("%s: I/O loop error", self.name)
                    time.sleep(0.05)
        finally:
            for conn in list(self._parked):
                self._unpark(sel, conn)
                self._close(conn)
            while self._returns:
                self._close(self._returns.popleft())
            sel.close()
            for _ in self._workers:
                self._ready.put(None)
            self._done.set()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop serving; waits for the loop (and, briefly, the workers) to end."""
        self._stopping.set()
        self._wake()
        self._done.wait(timeout_s)
        deadline = time.monotonic() + timeout_s
        for t in self._workers:
            t.join(max(0.0, deadline - time.monotonic()))

    def server_close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- I/O thread ----------------------------------------------------------------------

    def _loop_once(self, sel: selectors.BaseSelector, poll_interval: float) -> None:
        now = time.monotonic()
        soonest = min((c.deadline for c in self._parked), default=now + poll_interval)
        for key, _ in sel.select(max(0.0, min(poll_interval, soonest - now))):
            if key.fileobj is self._listener:
                self._accept(sel)
            elif key.fileobj is self._wake_r:
                self._drain_wake()
            else:
                self._on_event(sel, key.data)
        while self._returns:
            conn = self._returns.popleft()
            # A TLS socket may hold decrypted bytes the selector cannot see: pull first.
            self._on_event(sel, conn, parked=False)
        now = time.monotonic()
        for conn in [c for c in self._parked if c.deadline <= now]:
            self._unpark(sel, conn)
            log.debug("%s: closing %s after its timeout", self.name, conn.addr)
            self._close(conn)

    def _accept(self, sel: selectors.BaseSelector) -> None:
        for _ in range(64):  # then let parked connections have their turn
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of descriptors: try again next round
                log.warning("%s: accept failed: %s", self.name, exc)
                time.sleep(0.05)
                return
            with contextlib.suppress(OSError):  # answers leave at once (unix: no such option)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._open >= self.limits.max_connections and not self._evict(sel):
                self._refuse(sock, plain=self._ssl is None)
                continue
            if self._ssl is not None:
                try:  # no I/O yet: the handshake is driven by _on_event
                    sock = self._ssl.wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False
                    )
                except (OSError, ValueError) as exc:
                    log.debug("%s: TLS setup for %s failed: %s", self.name, addr, exc)
                    sock.close()
                    continue
            with self._lock:
                self._open += 1
            handler = self.handler_class.__new__(self.handler_class)
            conn = _Conn(sock, addr, handler, self.limits)
            conn.deadline = time.monotonic() + self.limits.read_timeout_s
            self._park(sel, conn)

    def _on_event(self, sel: selectors.BaseSelector, conn: _Conn, parked: bool = True) -> None:
        """The socket is readable (or writable mid-handshake): make progress without
        blocking; queue the connection once a request is in."""
        had = len(conn.reader)
        try:
            sock = conn.sock
            if conn.handshaking and isinstance(sock, ssl.SSLSocket):  # handshaking: TLS only
                sock.setblocking(False)
                sock.do_handshake()
                conn.handshaking = False
            alive = conn.reader.pull()
        except ssl.SSLWantReadError:
            self._watch(sel, conn, selectors.EVENT_READ, parked)
            return
        except ssl.SSLWantWriteError:
            self._watch(sel, conn, selectors.EVENT_WRITE, parked)
            return
        except _CLIENT_GONE as exc:
            log.debug("%s: %s went away: %s", self.name, conn.addr, clip(repr(exc)))
            alive = False
            if not len(conn.reader):
                self._unpark(sel, conn)
                self._close(conn)
                return
        if not alive and not len(conn.reader):
            self._unpark(sel, conn)
            self._close(conn)
        elif not alive or conn.reader.ready():
            self._unpark(sel, conn)
            self._enqueue(conn)  # a partial request at end of stream: the worker answers
        elif not parked:
            self._park(sel, conn)
        elif not had and len(conn.reader):
            # A request has begun: it gets the read timeout from its first byte.
            conn.deadline = time.monotonic() + self.limits.read_timeout_s

    def _watch(
        self, sel: selectors.BaseSelector, conn: _Conn, events: int, parked: bool
    ) -> None:
        if parked:
            sel.modify(conn.sock, events, conn)
        else:
            self._park(sel, conn, events)

    def _evict(self, sel: selectors.BaseSelector) -> bool:
        oldest = next(iter(self._parked), None)
        if oldest is None:
            return False
        self._unpark(sel, oldest)
        log.debug("%s: %d connections open; closing idle %s", self.name, self._open, oldest.addr)
        self._close(oldest)
        return True

    def _park(
        self, sel: selectors.BaseSelector, conn: _Conn, events: int = selectors.EVENT_READ
    ) -> None:
        if self._stopping.is_set():
            self._close(conn)
            return
        if conn.served and not conn.handshaking:
            # Back from a worker: idle until the next request starts, or that request's
            # rest within the read timeout.
            wait = self.limits.read_timeout_s if len(conn.reader) else self.limits.idle_timeout_s
            conn.deadline = time.monotonic() + wait
        try:
            sel.register(conn.sock, events, conn)
        except (OSError, ValueError, KeyError):
            self._close(conn)
            return
        self._parked[conn] = None

    def _unpark(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        if self._parked.pop(conn, 0) is None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                sel.unregister(conn.sock)

    def _enqueue(self, conn: _Conn) -> None:
        with self._lock:
            full = self._queued >= self.limits.queue
            if not full:
                self._queued += 1
        if full:
            log.debug("%s: all workers busy; refusing %s", self.name, conn.addr)
            if not conn.served:
                self._refuse(conn.sock, plain=not isinstance(conn.sock, ssl.SSLSocket))
            self._close(conn)
            return
        self._ready.put(conn)

    @staticmethod
    def _refuse(sock: socket.socket, *, plain: bool) -> None:
        # A 503 only on a plain connection nothing was sent on: its send buffer is empty.
        try:
            if plain:
                sock.setblocking(False)
                sock.send(_BUSY)
        except OSError:
            pass
        finally:
            sock.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass

    def _close(self, conn: _Conn) -> None:
        with self._lock:
            if conn.closed:
                return
            conn.closed = True
            self._open -= 1
        with contextlib.suppress(OSError):
            conn.sock.close()

    # -- workers -------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            conn = self._ready.get()
            if conn is None:
                return
            with self._lock:
                self._queued -= 1
            keep = False
            try:
                keep = self._serve(conn)
            except _CLIENT_GONE as exc:
                log.debug("%s: %s went away: %s", self.name, conn.addr, clip(repr(exc)))
            except Exception:  # a handler bug: the connection goes, the worker stays
                log.exception("%s: error serving %s", self.name, conn.addr)
            if keep and not self._stopping.is_set():
                self._returns.append(conn)
                self._wake()
            else:
                self._close(conn)

    def _serve(self, conn: _Conn) -> bool:
        """Answer the requests already received; True to hand the connection back."""
        h = conn.handler
        for _ in range(_MAX_TURN):
            conn.reader.start_request()
            # The rest of a large body must come within the read timeout.
            conn.reader.deadline = time.monotonic() + self.limits.read_timeout_s
            try:
                h.handle_one_request()
            finally:
                h.body = b""
            conn.served += 1
            if h.close_connection or self._stopping.is_set():
                return False
            if not conn.reader.ready():
                return True
        return True


def server_tls_context(
    cert_file: str, key_file: str, client_ca_file: str | None = None
) -> ssl.SSLContext:
    """TLS 1.2+ server context; with ``client_ca_file`` a client certificate signed by
    that CA is required (mutual TLS)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


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
    registry: Registry,
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
    ready_registry = Registry()
    ready_gauge = Gauge(READY_METRIC, READY_HELP, registry=ready_registry)

    def exposition() -> bytes:
        if readiness is None:
            return registry.expose()
        ready_gauge.set(1 if _run_probe(readiness)[0] else 0)
        return registry.expose() + ready_registry.expose()

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
                self.send_body(200, data, CONTENT_TYPE)
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
