"""L1: the webhook's HTTPS server on 127.0.0.1: routes, socket bounds, TLS reload.

Each bound of the project's socket rules has a test here that fails without it: the
body limit (413 before the body), the read and idle timeouts, the worker pool (503
when full), a fixed 4xx reason that echoes nothing, never a 500.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import shutil
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpu_share.observability.http import BoundedServer, ServerLimits
from gpu_share.webhook.http import WEBHOOK_LIMITS, make_server
from gpu_share.webhook.review import Mutator
from gpu_share.webhook.tls import ReloadingTLS
from tests.extender.tls_support import Pki, make_pki
from tests.webhook.test_review import SECRET, UID, S, review

SMALL = ServerLimits(workers=2, queue=4, max_connections=16, read_timeout_s=0.5,
                     idle_timeout_s=0.5, max_body_bytes=64 * 1024)


def _noop(bodies: Iterable[Mapping[str, Any]], deadline: float) -> None:
    pass


@contextlib.contextmanager
def server_of(limits: ServerLimits = SMALL, ensure: Any = _noop,
              tls: ssl.SSLContext | None = None, liveness: Any = None) -> Iterator[BoundedServer]:
    server: BoundedServer = make_server(Mutator(S, ensure), "127.0.0.1", 0, ssl_context=tls,
                                        limits=limits, liveness=liveness)
    server.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def serving(limits: ServerLimits = SMALL, ensure: Any = _noop,
            tls: ssl.SSLContext | None = None, liveness: Any = None) -> Iterator[int]:
    with server_of(limits, ensure, tls, liveness) as server:
        yield server.server_address[1]


def post(port: int, body: bytes, path: str = "/mutate") -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def raw(port: int, data: bytes, wait_s: float = 3.0) -> tuple[bytes, float]:
    """Send ``data``, read until the server closes; (answer, seconds until closed)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                raise AssertionError("the server kept the connection open") from None
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return got, time.monotonic() - start
            got += chunk


def test_defaults_are_bounded() -> None:
    assert WEBHOOK_LIMITS.max_body_bytes == 2**20
    assert WEBHOOK_LIMITS.workers <= 16 and WEBHOOK_LIMITS.queue <= 64
    assert WEBHOOK_LIMITS.read_timeout_s <= 10 and WEBHOOK_LIMITS.idle_timeout_s <= 120


def test_mutate_answers_a_review_and_ignores_the_timeout_query() -> None:
    with serving() as port:
        code, answer = post(port, json.dumps(review()).encode(), "/mutate?timeout=5s")
    assert code == 200 and answer["response"]["uid"] == UID
    assert answer["response"]["allowed"] is True
    assert json.loads(base64.b64decode(answer["response"]["patch"]))


def test_healthz_and_unknown_routes() -> None:
    with serving() as port:
        for path in ("/healthz", "/readyz"):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            assert conn.getresponse().status == 200
            conn.close()
        assert post(port, b"{}", "/filter")[0] == 404
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/mutate")
        assert conn.getresponse().status == 404
        conn.close()
        answer, _ = raw(port, b"PUT /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 405")


def test_liveness_failing_is_503() -> None:
    def broken() -> bool:
        raise RuntimeError(SECRET)

    for probe in (lambda: False, broken):
        with serving(liveness=probe) as port:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            assert resp.status == 503 and SECRET.encode() not in resp.read()
            conn.close()


def test_malformed_review_is_400_without_echo() -> None:
    with serving() as port:
        for body in (f"nope {SECRET}".encode(), json.dumps(review(uid=SECRET + "!")).encode()):
            code, answer = post(port, body)
            assert code == 400 and SECRET not in json.dumps(answer)


def test_a_bug_never_answers_500() -> None:
    def ensure(bodies: Iterable[Mapping[str, Any]], deadline: float) -> None:
        raise ZeroDivisionError(SECRET)

    with serving(ensure=ensure) as port:
        code, answer = post(port, json.dumps(review()).encode())
    assert code == 200 and answer["response"]["uid"] == UID
    assert answer["response"]["status"]["code"] == 500
    assert SECRET not in json.dumps(answer)


def test_body_over_the_limit_is_413_before_the_body_is_sent() -> None:
    limits = ServerLimits(workers=1, queue=2, max_connections=8, read_timeout_s=5,
                          idle_timeout_s=5, max_body_bytes=WEBHOOK_LIMITS.max_body_bytes)
    with serving(limits) as port:
        # No body byte is sent: a server waiting for it would time out instead.
        answer, took = raw(port, b"POST /mutate HTTP/1.1\r\nHost: x\r\n"
                                 b"Content-Length: %d\r\n\r\n" % (2**20 + 1), wait_s=3)
        assert answer.startswith(b"HTTP/1.1 413") and took < 3


def test_small_body_limit() -> None:
    limits = ServerLimits(workers=1, queue=2, max_connections=8, read_timeout_s=5,
                          idle_timeout_s=5, max_body_bytes=1000)
    with serving(limits) as port:
        answer, _ = raw(port, b"POST /mutate HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: 1001\r\n\r\n" + b" " * 1001)
        assert answer.startswith(b"HTTP/1.1 413")
        ok = json.dumps(review()).encode()
        assert len(ok) < 1000 and post(port, ok)[0] == 200


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         b"411"),
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\n\r\n", b"411"),
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", b"400"),
        (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n"
         b"\r\n{}", b"400"),
        (b"GARBAGE " + SECRET.encode() + b"\r\n\r\n", b"400"),
    ],
)
def test_bad_framing_is_4xx(request_bytes: bytes, status: bytes) -> None:
    with serving() as port:
        answer, _ = raw(port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 " + status)
    assert SECRET.encode() not in answer


def test_a_half_sent_request_is_closed_after_the_read_timeout() -> None:
    with serving() as port:
        answer, took = raw(port, b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Le", wait_s=4)
        assert answer == b"" and took < 3
        # A declared body that never comes: the same.
        _, took = raw(port, b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
                      wait_s=4)
        assert took < 3


def test_an_idle_kept_alive_connection_is_closed() -> None:
    with serving() as port, socket.create_connection(("127.0.0.1", port), timeout=4) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b'{"status": "ok"}'):  # head and body may come apart
            chunk = s.recv(65536)
            assert chunk, "closed before the answer"
            first += chunk
        assert first.startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        assert s.recv(65536) == b""  # closed by the server, not by our timeout
        assert time.monotonic() - start < 3


def test_the_worker_pool_is_bounded() -> None:
    release = threading.Event()
    entered = threading.Semaphore(0)

    def slow(bodies: Iterable[Mapping[str, Any]], deadline: float) -> None:
        entered.release()
        release.wait(10)

    limits = ServerLimits(workers=1, queue=1, max_connections=16, read_timeout_s=5,
                          idle_timeout_s=5, max_body_bytes=64 * 1024)
    body = json.dumps(review()).encode()
    results: list[int] = []

    def call() -> None:
        results.append(post(port, body)[0])

    with server_of(limits, ensure=slow) as server:
        port = server.server_address[1]
        first = threading.Thread(target=call)
        first.start()
        assert entered.acquire(timeout=5)  # the one worker is busy
        second = threading.Thread(target=call)
        second.start()
        deadline = time.monotonic() + 5
        while server._queued < 1:  # the second request waits in the queue
            assert time.monotonic() < deadline
            time.sleep(0.01)
        data = (b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        answer, _ = raw(port, data)
        assert answer.startswith(b"HTTP/1.1 503")  # pool and queue full: refused at once
        release.set()
        first.join(10)
        second.join(10)
    assert results == [200, 200]


# ---------------------------------------------------------------- TLS


def _fetch_cert(port: int, ca: Path) -> bytes:
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s, \
            ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:  # IP: no SNI is sent
        der = t.getpeercert(binary_form=True)
        assert der is not None
        return der


@pytest.fixture(scope="module")
def two_pkis(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pki, Pki]:
    return (make_pki(tmp_path_factory.mktemp("pki-a")),
            make_pki(tmp_path_factory.mktemp("pki-b")))


def test_https_review(two_pkis: tuple[Pki, Pki], tmp_path: Path) -> None:
    a, _ = two_pkis
    tls = ReloadingTLS(str(a.server_cert), str(a.server_key))
    with serving(tls=tls.context) as port:
        ctx = ssl.create_default_context(cafile=str(a.ca))
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ctx)
        conn.request("POST", "/mutate", body=json.dumps(review()).encode())
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["response"]["uid"] == UID
        conn.close()
        # Plain HTTP on the TLS port gets no answer.
        answer, _ = raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200" not in answer


def test_the_certificate_is_reloaded_when_its_files_change(
    two_pkis: tuple[Pki, Pki], tmp_path: Path
) -> None:
    a, b = two_pkis
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(a.server_cert, cert)
    shutil.copy(a.server_key, key)
    tls = ReloadingTLS(str(cert), str(key), check_interval_s=0.0)
    with serving(tls=tls.context) as port:
        before = _fetch_cert(port, a.ca)
        assert before == ssl.PEM_cert_to_DER_cert(a.server_cert.read_text())
        # Half a rotation (the key first): the pair does not match, the old one stays.
        shutil.copy(b.server_key, key)
        assert _fetch_cert(port, a.ca) == before
        shutil.copy(b.server_cert, cert)
        after = _fetch_cert(port, b.ca)
        assert after == ssl.PEM_cert_to_DER_cert(b.server_cert.read_text())
        assert tls.reloads == 1
        # A broken file keeps the last good pair.
        cert.write_text("not a certificate")
        assert _fetch_cert(port, b.ca) == after


def test_reload_checks_are_throttled(two_pkis: tuple[Pki, Pki], tmp_path: Path) -> None:
    a, b = two_pkis
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(a.server_cert, cert)
    shutil.copy(a.server_key, key)
    now = [0.0]
    tls = ReloadingTLS(str(cert), str(key), check_interval_s=10.0, clock=lambda: now[0])
    first = tls.current()
    shutil.copy(b.server_key, key)
    shutil.copy(b.server_cert, cert)
    now[0] = 5.0
    assert tls.current() is first  # not checked yet
    now[0] = 10.0
    assert tls.current() is not first and tls.reloads == 1


def test_unloadable_files_fail_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "x.pem"
    bad.write_text("nope")
    with pytest.raises((OSError, ssl.SSLError)):
        ReloadingTLS(str(bad), str(bad))
