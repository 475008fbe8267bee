from __future__ import annotations

import contextlib
import http.client
import io
import logging
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_share.observability.http import (
    BoundedHandler,
    BoundedServer,
    Heartbeat,
    HttpHandle,
    ServerLimits,
    start_http,
)
from gpu_share.observability.metrics import Metrics


class Flag:
    def __init__(self, value: bool) -> None:
        self.value = value

    def __call__(self) -> bool:
        return self.value


def get(handle: HttpHandle, path: str) -> tuple[int, str, str]:
    url = f"http://127.0.0.1:{handle.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


@pytest.fixture
def served() -> Iterator[tuple[HttpHandle, Metrics, Flag, Flag]]:
    metrics, live, ready = Metrics(), Flag(True), Flag(False)
    handle = start_http(
        metrics.registry, bind_address="127.0.0.1", port=0, liveness=live, readiness=ready
    )
    try:
        yield handle, metrics, live, ready
    finally:
        handle.stop()


def test_metrics_endpoint(served: tuple[HttpHandle, Metrics, Flag, Flag]) -> None:
    handle, metrics, _, _ = served
    assert handle.port > 0
    metrics.ledger_writes_total.inc(3)
    code, ctype, body = get(handle, "/metrics")
    assert code == 200 and ctype.startswith("text/plain")
    assert "gpu_share_ledger_writes_total 3.0" in body


def test_probes_follow_their_callables(served: tuple[HttpHandle, Metrics, Flag, Flag]) -> None:
    handle, _, live, ready = served
    assert get(handle, "/healthz")[0] == 200
    assert get(handle, "/readyz")[0] == 503
    ready.value, live.value = True, False
    assert get(handle, "/readyz")[0] == 200
    assert get(handle, "/healthz")[0] == 503
    assert get(handle, "/nope")[0] == 404


def test_raising_probe_is_not_ready() -> None:
    def boom() -> bool:
        raise RuntimeError("kubelet gone")

    handle = start_http(Metrics().registry, bind_address="127.0.0.1", port=0, readiness=boom)
    try:
        code, _, body = get(handle, "/readyz")
        assert code == 503 and "kubelet gone" in body
        assert get(handle, "/healthz")[0] == 200  # no probe given: alive
    finally:
        handle.stop()
        handle.stop()  # idempotent


def test_heartbeat() -> None:
    now = [0.0]
    beat = Heartbeat(max_age_s=10, clock=lambda: now[0])
    assert beat.alive()
    now[0] = 11
    assert not beat.alive()
    beat.beat()
    assert beat.alive()


# -- the bounded server, over real sockets on 127.0.0.1 -------

class Echo(BoundedHandler):
    def do_GET(self) -> None:
        self.send_body(200, b"ok\n", "text/plain")

    def do_POST(self) -> None:
        self.send_body(200, f"got {len(self.body)}\n".encode(), "text/plain")


@contextlib.contextmanager
def bounded(**limits: Any) -> Iterator[BoundedServer]:
    server = BoundedServer(Echo, ("127.0.0.1", 0), ServerLimits(**limits), name="test")
    t = server.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def connect(server: BoundedServer | HttpHandle) -> socket.socket:
    port = server.port if isinstance(server, HttpHandle) else server.server_address[1]
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.settimeout(10)
    return s


def response(
    sock: socket.socket, f: io.BufferedReader | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One well-formed answer (status line, headers, Content-Length body) from ``f``
    (pass the same ``sock.makefile("rb")`` for several pipelined answers)."""
    f = f or sock.makefile("rb")
    version, code, _ = f.readline().decode("latin-1").split(" ", 2)
    assert version == "HTTP/1.1"
    msg = http.client.parse_headers(f)
    headers = {k.lower(): v for k, v in msg.items()}
    body = f.read(int(headers["content-length"]))
    assert len(body) == int(headers["content-length"])
    return int(code), headers, body


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes ``sock`` within ``within_s`` (any answer read first)."""
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def wait_threads_settle() -> None:
    time.sleep(0.3)


def test_over_cap_body_is_refused_before_it_is_read() -> None:
    with bounded(max_body_bytes=1024) as server, connect(server) as s:
        # Only the headers: the answer must not wait for the 60 MiB.
        s.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 62914560\r\n\r\n")
        code, headers, body = response(s)
        assert code == 413 and headers["connection"] == "close"
        assert body == b"body of 62914560 bytes is over the limit of 1024 bytes\n"
        assert closed_by_server(s, 5)


def test_post_without_length_is_411_and_chunked_body_is_not_a_second_request() -> None:
    with bounded() as server:
        with connect(server) as s:
            s.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\n\r\n")
            assert response(s)[0] == 411
            assert closed_by_server(s, 5)
        with connect(server) as s:
            # Before: no Content-Length read as 0, and the chunk was served as a request.
            inner = b"GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n"
            s.sendall(
                b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                + f"{len(inner):x}\r\n".encode() + inner + b"\r\n0\r\n\r\n"
            )
            code, _, body = response(s)
            assert code == 411 and b"Transfer-Encoding" in body
            s.settimeout(5)
            assert s.recv(65536) == b""  # closed, and no second answer


def test_bad_content_length_is_400() -> None:
    with bounded() as server:
        for value in (b"-1", b"1e3", b"\xb2", b"5, 5", b"9" * 40):
            with connect(server) as s:
                s.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: " + value + b"\r\n\r\n")
                assert response(s)[0] == 400, value
        with connect(server) as s:
            s.sendall(b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nab")
            assert response(s)[0] == 400


def test_keep_alive_serves_pipelined_requests_and_drops_the_body() -> None:
    with bounded() as server, connect(server) as s:
        s.sendall(
            b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc"
            b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"
        )
        f = s.makefile("rb")
        assert response(s, f)[2] == b"got 3\n"
        assert response(s, f)[2] == b"ok\n"


def test_idle_connections_hold_no_threads() -> None:
    # Before: one thread per connection (300 idle connections held 309 threads).
    base = threading.active_count()
    with bounded(workers=4, max_connections=200, read_timeout_s=30) as server:
        assert threading.active_count() <= base + 4 + 1
        socks = [connect(server) for _ in range(100)]
        try:
            wait_threads_settle()
            assert threading.active_count() <= base + 4 + 1
            t0 = time.monotonic()
            with connect(server) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                assert response(s)[0] == 200
            assert time.monotonic() - t0 < 2
        finally:
            for s in socks:
                s.close()


def test_half_sent_requests_are_dropped_after_the_read_timeout() -> None:
    # Before: 400 half-sent requests held 417 threads, for good.
    base = threading.active_count()
    with bounded(workers=2, queue=4, read_timeout_s=0.5) as server:
        socks = [connect(server) for _ in range(40)]
        try:
            for s in socks:
                s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n")  # no end of headers
            wait_threads_settle()
            assert threading.active_count() <= base + 2 + 1
            # Each is answered 503 at once or dropped at its deadline; none waits longer
            # than (queue / workers + 1) read timeouts.
            deadline = time.monotonic() + 5
            assert all(closed_by_server(s, max(0.1, deadline - time.monotonic())) for s in socks)
            with connect(server) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                assert response(s)[0] == 200
        finally:
            for s in socks:
                s.close()


def test_a_trickling_client_is_dropped_at_the_deadline() -> None:
    # A byte every 0.1 s never trips a per-recv timeout; the request deadline does.
    with bounded(read_timeout_s=0.5) as server, connect(server) as s:
        t0 = time.monotonic()
        with contextlib.suppress(OSError):
            for ch in b"GET / HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                s.send(bytes([ch]))
                time.sleep(0.1)
        assert closed_by_server(s, 1)
        assert time.monotonic() - t0 < 3


def test_idle_keep_alive_connection_is_closed_after_the_idle_timeout() -> None:
    with bounded(idle_timeout_s=0.3) as server, connect(server) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert response(s)[0] == 200
        t0 = time.monotonic()
        assert closed_by_server(s, 3)
        assert 0.2 < time.monotonic() - t0 < 2


def test_connection_cap_evicts_the_oldest_idle_connection() -> None:
    with bounded(max_connections=10, read_timeout_s=30) as server:
        socks = [connect(server) for _ in range(10)]
        try:
            wait_threads_settle()
            with connect(server) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                assert response(s)[0] == 200
            assert closed_by_server(socks[0], 2)
        finally:
            for s in socks:
                s.close()


def test_idle_connections_to_the_metrics_endpoint_hold_no_threads() -> None:
    base = threading.active_count()
    handle = start_http(Metrics().registry, bind_address="127.0.0.1", port=0)
    socks = [connect(handle) for _ in range(60)]
    try:
        for s in socks[::2]:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")  # half of them half-sent
        wait_threads_settle()
        # The agent's default pool is 4 workers; before, one thread per connection.
        assert threading.active_count() <= base + 4 + 2
        assert get(handle, "/healthz")[0] == 200
    finally:
        for s in socks:
            s.close()
        handle.stop()


def test_client_disconnects_print_no_traceback(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Before: each reset connection printed a traceback on stderr.
    caplog.set_level(logging.DEBUG)
    handle = start_http(Metrics().registry, bind_address="127.0.0.1", port=0)
    try:
        for i in range(20):
            s = connect(handle)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: t\r\n" if i % 2 else b"POST /metr")
            # RST instead of FIN: the server's next read fails with ECONNRESET.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        time.sleep(0.5)
        assert get(handle, "/healthz")[0] == 200
    finally:
        handle.stop()
    assert "Traceback" not in capfd.readouterr().err
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]


def test_unknown_methods_and_bad_lines_answer_4xx_with_short_bodies(
    served: tuple[HttpHandle, Metrics, Flag, Flag],
) -> None:
    handle = served[0]
    cases = [
        b"DELETE /metrics HTTP/1.1\r\nHost: t\r\n\r\n",  # before: 501
        b"BREW /metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/2.0\r\n\r\n",  # before: 505
        b"GET /metrics\r\n\r\n",  # HTTP/0.9: before, an answer without a status line
        b"GET /" + b"x" * 70_000 + b" HTTP/1.1\r\n\r\n",
        b"GET /metrics " + b"\xff" * 30_000 + b" HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n" + b"X-Big: " + b"y" * 70_000 + b"\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"z" * 2000)
                                                for i in range(90)) + b"\r\n",
    ]
    for raw in cases:
        with connect(handle) as s:
            s.sendall(raw)
            code, headers, body = response(s)
            assert 400 <= code < 500, (raw[:40], code)
            assert len(body) <= 2 * 100 + 10, raw[:40]  # 100 characters, UTF-8
            assert headers.get("connection") == "close"


def test_expect_100_continue_gets_its_interim_answer_or_a_refusal() -> None:
    with bounded(max_body_bytes=10) as server:
        with connect(server) as s:
            s.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                      b"Content-Length: 3\r\n\r\n")
            f = s.makefile("rb")
            assert f.readline() == b"HTTP/1.1 100 Continue\r\n" and f.readline() == b"\r\n"
            s.sendall(b"abc")
            assert response(s, f)[2] == b"got 3\n"
        with connect(server) as s:  # over the cap: refused before the body is sent
            s.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                      b"Content-Length: 11\r\n\r\n")
            assert response(s)[0] == 413


def test_an_answer_leaves_in_one_write_on_a_no_delay_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: the headers and the body were two writes; on a kept-alive connection the
    # second waited for the client's delayed ACK (Nagle): ~40 ms per answer, which held
    # kube-scheduler with the extender (2 calls per pod) at ~13 pods/s.
    from gpu_share.observability.http_io import Writer

    writes: list[tuple[bytes, int]] = []
    real = Writer.write

    def counted(self: Any, data: bytes) -> int:
        nodelay = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        writes.append((bytes(data), nodelay))
        return real(self, data)

    monkeypatch.setattr(Writer, "write", counted)
    with bounded() as server, connect(server) as s:
        f = s.makefile("rb")
        for req, want in ((b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", 200),
                          (b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc", 200),
                          (b"POST /x HTTP/1.1\r\nHost: t\r\n\r\n", 411)):  # an error answer
            writes.clear()
            s.sendall(req)
            code, _, body = response(s, f)
            assert code == want and len(writes) == 1, [w for w, _ in writes]
            data, nodelay = writes[0]
            assert data.endswith(b"\r\n\r\n" + body) and nodelay
