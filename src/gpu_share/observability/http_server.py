"""``BoundedServer``: the bounded HTTP/1.1 server of observability/http.py (see its doc).

One I/O thread accepts connections, does TLS handshakes (non-blocking) and receives whole
requests, heads and bodies, without blocking; ``workers`` threads answer them. Here the
I/O thread's side: the connections it parks, the deadlines, the connection cap and the
shared budget of body bytes; the buffer itself is http_io's ``Reader``.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from http import HTTPStatus
from typing import Any

from gpu_share.observability.hostnames import ascii_host
from gpu_share.observability.http_handler import BoundedHandler, ServerLimits, clip
from gpu_share.observability.http_io import CONTINUE, Reader, Writer, answer, send_once

log = logging.getLogger(__name__)

_MAX_TURN = 32  # pipelined requests served in one go before the connection queues again
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
# A client going away mid-request: expected, logged without a traceback.
_CLIENT_GONE = (OSError, http.client.HTTPException, ssl.SSLError)


class _Dropped(Exception):
    """The I/O thread answered (or just closed) the connection while receiving on it."""


class _Conn:
    __slots__ = (
        "addr", "closed", "deadline", "handler", "handshaking", "reader", "reserved",
        "served", "sock", "writer",
    )

    def __init__(
        self, sock: socket.socket, addr: Any, handler: BoundedHandler, limits: ServerLimits
    ) -> None:
        self.sock = sock
        self.addr = addr
        self.reader = Reader(sock, limits.max_body_bytes)
        self.writer = Writer(sock, limits.read_timeout_s)
        self.handler = handler
        self.deadline = 0.0  # parked: dropped at this time
        self.served = 0
        self.reserved = 0  # bytes of the body budget held by the current request
        self.handshaking = isinstance(sock, ssl.SSLSocket)
        self.closed = False
        handler._attach(sock, addr, self.reader, self.writer, limits)


def _listen(host: str, port: int) -> socket.socket:
    family, kind, proto, _, addr = socket.getaddrinfo(
        ascii_host(host) if host else None, port, type=socket.SOCK_STREAM,
        flags=socket.AI_PASSIVE,
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
        self._reserved = 0  # bytes of limits.body_budget held by requests' bodies
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
            self._expire(sel, conn)

    def _expire(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        if conn.reader.frame() is None:  # idle, or its head still coming: closed
            self._drop(sel, conn, None, "closing after its timeout")
        else:  # a whole head, its body late
            self._drop(sel, conn, HTTPStatus.REQUEST_TIMEOUT,
                       "request body not received within the read timeout")

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
        blocking; queue the connection once a whole request (head and body) is in."""
        if conn.closed:  # dropped earlier in this round (evicted)
            return
        had = len(conn.reader)
        try:
            alive = self._receive(sel, conn)
        except ssl.SSLWantReadError:
            self._watch(sel, conn, selectors.EVENT_READ, parked)
            return
        except ssl.SSLWantWriteError:
            self._watch(sel, conn, selectors.EVENT_WRITE, parked)
            return
        except _Dropped:
            return
        except _CLIENT_GONE as exc:
            log.debug("%s: %s went away: %s", self.name, conn.addr, clip(repr(exc)))
            alive = False
        if conn.reader.ready():
            self._unpark(sel, conn)
            self._enqueue(conn)
        elif not alive:  # end of stream before a whole request: nothing to answer
            self._unpark(sel, conn)
            self._close(conn)
        elif not parked:
            self._park(sel, conn)
        elif not had and len(conn.reader):
            # A request has begun: it gets the read timeout from its first byte.
            conn.deadline = time.monotonic() + self.limits.read_timeout_s

    def _receive(self, sel: selectors.BaseSelector, conn: _Conn) -> bool:
        """Handshake (TLS), then read what has come, up to the head allowance, and the
        body once the head has announced one and the budget has room for it; False at
        end of stream. Raises ``_Dropped`` when the connection was answered and closed."""
        sock = conn.sock
        if conn.handshaking and isinstance(sock, ssl.SSLSocket):  # handshaking: TLS only
            sock.setblocking(False)
            sock.do_handshake()
            conn.handshaking = False
        alive = conn.reader.pull()
        if not alive or not conn.reader.missing():
            return alive
        if not conn.reserved:
            self._reserve(sel, conn)
            conn.reader.grant()
            alive = conn.reader.pull()
        if alive and conn.reader.missing():
            self._continue(sel, conn)
        return alive

    def _reserve(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        """Room in the body budget for ``conn``'s body: the oldest bodies still being
        received make way (503); when requests being served hold the rest, ``conn`` is
        refused (503, ``_Dropped``)."""
        frame = conn.reader.frame()
        need = (frame.length or 0) if frame is not None else 0
        budget = self.limits.body_budget
        while True:
            with self._lock:
                if self._reserved + need <= budget:
                    self._reserved += need
                    conn.reserved = need
                    return
            oldest = next((c for c in self._parked if c.reserved and c is not conn), None)
            if oldest is None:
                self._drop(sel, conn, HTTPStatus.SERVICE_UNAVAILABLE,
                           "no room for the request body now; try again")
                raise _Dropped
            self._drop(sel, oldest, HTTPStatus.SERVICE_UNAVAILABLE,
                       "request body dropped to make room for newer ones")

    def _release(self, conn: _Conn) -> None:
        with self._lock:
            self._reserved -= conn.reserved
            conn.reserved = 0

    def _continue(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        """``100 Continue`` once, to a client that waits for it to send the body."""
        frame = conn.reader.frame()
        if frame is None or not frame.expect_continue or frame.continued:
            return
        frame.continued = True
        if not send_once(conn.sock, CONTINUE):
            self._drop(sel, conn, None, "100 Continue not sent")
            raise _Dropped

    def _drop(
        self, sel: selectors.BaseSelector, conn: _Conn, code: int | None, reason: str
    ) -> None:
        """Close a parked connection, after one non-blocking try at answering ``code``."""
        self._unpark(sel, conn)
        log.debug("%s: %s: %s", self.name, conn.addr, reason)
        if code is not None and not conn.handshaking:
            body, ctype = conn.handler.error_body(code, reason)
            send_once(conn.sock, answer(code, body, ctype))
        self._close(conn)

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
            self._reserved -= conn.reserved
            conn.reserved = 0
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
        """Answer the requests already received (never waiting on the client for one);
        True to hand the connection back."""
        h = conn.handler
        for _ in range(_MAX_TURN):
            conn.reader.begin()
            try:
                h.handle_one_request()
            finally:
                h.body = b""
                conn.reader.done()
                self._release(conn)
            conn.served += 1
            if h.close_connection or self._stopping.is_set():
                return False
            if not conn.reader.ready():
                return True
        return True


def server_tls_context(
    cert_file: str, key_file: str, client_ca_file: str | None = None,
    *, client_cert: ssl.VerifyMode = ssl.CERT_REQUIRED,
) -> ssl.SSLContext:
    """TLS 1.2+ server context; with ``client_ca_file`` a client certificate signed by
    that CA is required (mutual TLS), or with ``client_cert=CERT_OPTIONAL`` only checked
    when one is sent."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = client_cert
    return ctx
