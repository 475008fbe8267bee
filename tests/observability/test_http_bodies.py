"""The bounded server receives bodies in its I/O thread (slow bodies hold no worker, each
within its deadline and a budget shared by all connections), and reads request heads
strictly (RFC 9112): real sockets on 127.0.0.1, ephemeral ports, every wait bounded."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_share.observability.http import (
    BoundedHandler,
    BoundedServer,
    ServerLimits,
    server_tls_context,
)
from tests.extender.tls_support import Pki, make_pki
from tests.observability.test_http import closed_by_server, response

# The webhook's shape (8 workers, 32 queued, 5 s to receive a request, 1 MiB bodies).
WEBHOOK_LIKE = dict(workers=8, queue=32, max_connections=128, read_timeout_s=5,
                    idle_timeout_s=30, max_body_bytes=2**20)


class Recorder(BoundedHandler):
    """Answers every request 200 and records what it served (path, body length)."""

    served: list[tuple[str, int]]
    release: threading.Event | None = None

    def do_GET(self) -> None:
        self.served.append((self.path, len(self.body)))
        self.send_body(200, b"ok\n", "text/plain")

    def do_POST(self) -> None:
        self.served.append((self.path, len(self.body)))
        if self.release is not None:
            self.release.wait(10)
        self.send_body(200, f"got {len(self.body)}\n".encode(), "text/plain")


@contextlib.contextmanager
def recording(
    tls: ssl.SSLContext | None = None, release: threading.Event | None = None, **limits: Any
) -> Iterator[tuple[BoundedServer, list[tuple[str, int]]]]:
    served: list[tuple[str, int]] = []
    handler = type("H", (Recorder,), {"served": served, "release": release})
    server = BoundedServer(handler, ("127.0.0.1", 0), ServerLimits(**limits), name="test",
                           ssl_context=tls)
    t = server.start()
    try:
        yield server, served
    finally:
        if release is not None:
            release.set()
        server.shutdown()
        server.server_close()
        t.join(5)


def open_socket(server: BoundedServer, tls: ssl.SSLContext | None = None) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5)
    s.settimeout(5)
    if tls is None:
        return s
    return tls.wrap_socket(s, server_hostname="127.0.0.1")


def slow_head(length: int, expect: bool = False) -> bytes:
    return (b"POST /mutate HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            + (b"Expect: 100-continue\r\n" if expect else b"")
            + b"Content-Length: %d\r\n\r\n{" % length)


def healthz_within(server: BoundedServer, tls: ssl.SSLContext | None = None) -> float:
    """Seconds a fresh client's ``GET /healthz`` took to be answered 200."""
    t0 = time.monotonic()
    with open_socket(server, tls) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert response(s)[0] == 200
    return time.monotonic() - t0


# -- Defect 1: slow bodies ------------------------------------------------------------------

@pytest.mark.parametrize(
    ("length", "expect"),
    [(1000, True), (200_000, False), (200_000, True), (1000, False)],  # the last: kept
    ids=["1000-expect", "200000", "200000-expect", "1000"],
)
def test_sixty_slow_bodies_hold_no_worker(length: int, expect: bool) -> None:
    # Before: a body over 64 KiB, or one after "Expect: 100-continue", was read by a
    # worker until the read timeout: 8 such clients held the 8 workers, the next 32 the
    # queue, and /healthz (the kubelet's probe: 1 s) was answered 503 or not at all.
    with recording(**WEBHOOK_LIKE) as (server, served):
        socks = [open_socket(server) for _ in range(60)]
        try:
            for s in socks:
                s.sendall(slow_head(length, expect))
            time.sleep(0.3)
            for s in socks:  # one more body byte each: still far from whole
                s.sendall(b" ")
            assert healthz_within(server) < 1
            assert served == [("/healthz", 0)]  # no slow body reached a handler
            assert server._queued == 0
        finally:
            for s in socks:
                s.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_slow_bodies_over_tls_hold_no_worker(pki: Pki) -> None:
    # The webhook and the extender's service mode serve TLS: the handshake and then the
    # body are both received by the I/O thread.
    server_ctx = server_tls_context(str(pki.server_cert), str(pki.server_key))
    client_ctx = ssl.create_default_context(cafile=str(pki.ca))
    with recording(tls=server_ctx, **WEBHOOK_LIKE) as (server, served):
        socks = [open_socket(server, client_ctx) for _ in range(60)]
        try:
            for s in socks:
                s.sendall(slow_head(200_000))
            time.sleep(0.3)
            assert healthz_within(server, client_ctx) < 1
            # A whole body in several TLS records is served as one request.
            with open_socket(server, client_ctx) as s:
                body = b"x" * 300_000
                s.sendall(b"POST /m HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
                          % len(body))
                for i in range(0, len(body), 16_000):
                    s.sendall(body[i:i + 16_000])
                assert response(s)[2] == b"got 300000\n"
            assert served == [("/healthz", 0), ("/m", 300_000)]
        finally:
            for s in socks:
                s.close()


@pytest.mark.parametrize("length", [10, 200_000])
def test_a_body_slower_than_its_deadline_is_answered_408(length: int) -> None:
    # Before: a small body was dropped at its deadline without an answer, and a large one
    # held a worker until then.
    with recording(read_timeout_s=0.5, max_body_bytes=2**20) as (server, served), \
            open_socket(server) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % length)
        with contextlib.suppress(OSError):
            for _ in range(9):  # a byte every 0.1 s: no per-read timeout trips
                s.sendall(b"a")
                time.sleep(0.1)
        code, headers, body = response(s)
        assert code == 408 and headers["connection"] == "close"
        assert body == b"request body not received within the read timeout\n"
        assert closed_by_server(s, 1)
        assert 0.4 < time.monotonic() - t0 < 3
        assert served == []


def test_bodies_share_a_budget_and_the_oldest_one_gives_way() -> None:
    with recording(max_body_bytes=1000, max_buffered_bytes=3000, read_timeout_s=30) as (
        server, _
    ):
        socks = [open_socket(server) for _ in range(3)]
        try:
            for s in socks:  # 3 bodies of 1000 bytes on their way: the whole budget
                s.sendall(slow_head(1000))
                time.sleep(0.05)
            time.sleep(0.2)
            assert server._reserved == 3000
            with open_socket(server) as s:  # a new body still gets in
                s.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
                time.sleep(0.2)  # the head alone first: its body needs room
                s.sendall(b"y" * 1000)
                assert response(s)[2] == b"got 1000\n"
            code, _, body = response(socks[0])  # the oldest made room for it
            assert code == 503 and b"make room" in body
            assert closed_by_server(socks[0], 1)
            for s in socks[1:]:  # the others go on
                s.sendall(b" " * 999)
                assert response(s)[2] == b"got 1000\n"
            deadline = time.monotonic() + 2  # released once the worker is done
            while server._reserved:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        finally:
            for s in socks:
                s.close()


def test_a_body_is_refused_503_while_requests_being_served_hold_the_budget() -> None:
    release = threading.Event()
    with recording(release=release, workers=2, max_body_bytes=1000, max_buffered_bytes=2000,
                   read_timeout_s=30) as (server, served):
        busy = [open_socket(server) for _ in range(2)]
        try:
            for s in busy:  # head first: their bodies take the budget until answered
                s.sendall(slow_head(1000))
                time.sleep(0.1)
                s.sendall(b" " * 999)
            deadline = time.monotonic() + 5
            while len(served) < 2:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            with open_socket(server) as s:
                s.sendall(slow_head(1000))
                code, _, body = response(s)
                assert code == 503 and b"no room" in body
            release.set()
            for s in busy:
                assert response(s)[2] == b"got 1000\n"
        finally:
            for s in busy:
                s.close()


def test_budget_is_at_least_one_body() -> None:
    assert ServerLimits(max_body_bytes=2**20).body_budget >= 8 * 2**20
    assert ServerLimits(max_body_bytes=10).body_budget == 2**20
    with pytest.raises(ValueError, match="max_buffered_bytes"):
        ServerLimits(max_body_bytes=1000, max_buffered_bytes=999)


def test_end_of_stream_mid_body_reaches_no_worker() -> None:
    with recording() as (server, served):
        with open_socket(server) as s:
            s.sendall(slow_head(100))
            s.shutdown(socket.SHUT_WR)
            assert closed_by_server(s, 2)
        assert healthz_within(server) < 1
        assert served == [("/healthz", 0)]


# -- Defect 2: strict heads -----------------------------------------------------------------

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n"


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        # Before: accepted, and the "body" was served as a second request.
        (b"Content-Length : %d\r\n" % len(SMUGGLED), 400),
        (b"Content-Length\t: %d\r\n" % len(SMUGGLED), 400),
        (b"Transfer-Encoding : chunked\r\n", 400),
        (b"X-A: 1\r\n Content-Length: %d\r\n" % len(SMUGGLED), 400),  # obsolete folding
        (b" X-A: 1\r\n", 400),  # whitespace before the first field
        (b"X y: 1\r\n", 400),
        (b"X(y): 1\r\n", 400),
        (b": 1\r\n", 400),
        (b"no colon here\r\n", 400),
        (b"X-A: 1\rContent-Length: %d\r\n" % len(SMUGGLED), 400),  # a bare CR
        (b"X-A: a\x00b\r\n", 400),
        # Already refused before; kept.
        (b"Content-Length: 5\r\nContent-Length: 6\r\n", 400),
        (b"Content-Length: 5\r\ncontent-length: 5\r\n", 400),
        (b"Content-Length: -5\r\n", 400),
        (b"Content-Length: +5\r\n", 400),
        (b"Content-Length: 5a\r\n", 400),
        (b"Content-Length: 0x10\r\n", 400),
        (b"Content-Length: \r\n", 400),
        (b"Transfer-Encoding: chunked\r\n", 411),
        (b"Transfer-Encoding: identity\r\nContent-Length: %d\r\n" % len(SMUGGLED), 411),
    ],
)
def test_malformed_heads_are_refused_and_nothing_after_them_is_served(
    fields: bytes, status: int
) -> None:
    with recording() as (server, served), open_socket(server) as s:
        s.sendall(b"GET /first HTTP/1.1\r\nHost: t\r\n" + fields + b"\r\n" + SMUGGLED)
        code, headers, body = response(s)
        assert code == status, body
        assert headers["connection"] == "close" and len(body) < 120
        assert closed_by_server(s, 2)  # and no second answer
        assert served == []


@pytest.mark.parametrize(
    "fields",
    [
        b"Content-Length:3\r\n",
        b"Content-Length: \t3 \t\r\n",
        b"content-length: 003\r\n",
        b"X-Obs-Text: \xb2\xff\r\nX-Tab: a\tb\r\nContent-Length: 3\r\n",
        b"X!#$%&'*+-.^_`|~9: v\r\nContent-Length: 3\r\n",
    ],
)
def test_well_formed_heads_are_served(fields: bytes) -> None:
    with recording() as (server, served), open_socket(server) as s:
        s.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\n" + fields + b"\r\nabc" + SMUGGLED)
        f = s.makefile("rb")
        assert response(s, f)[2] == b"got 3\n"
        assert response(s, f)[0] == 200
        assert served == [("/x", 3), ("/smuggled", 0)]


def test_bare_lf_line_endings_are_served() -> None:
    with recording() as (server, _), open_socket(server) as s:
        s.sendall(b"POST /x HTTP/1.1\nHost: t\nContent-Length: 3\n\nabc")
        assert response(s)[2] == b"got 3\n"
