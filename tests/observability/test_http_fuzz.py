"""Hypothesis against the agent's real /metrics endpoint on 127.0.0.1: arbitrary methods,
paths, headers and bodies get a well-formed answer, never 5xx, errors short."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_share.observability.http import HttpHandle, ServerLimits, start_http
from gpu_share.observability.metrics import Metrics

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
MAX_ERROR = 512


@pytest.fixture(scope="module")
def handle() -> Iterator[HttpHandle]:
    # A short read timeout: a request the fuzzer leaves incomplete is dropped quickly.
    h = start_http(
        Metrics().registry,
        bind_address="127.0.0.1",
        port=0,
        liveness=lambda: True,
        readiness=lambda: True,
        limits=ServerLimits(workers=2, read_timeout_s=0.5, idle_timeout_s=1),
    )
    yield h
    h.stop()


def exchange(h: HttpHandle, raw: bytes) -> None:
    """Send ``raw``; if an answer comes, it must be well-formed and not 5xx (a HEAD
    answer has its Content-Length and no body)."""
    with socket.create_connection(("127.0.0.1", h.port), timeout=10) as s:
        s.settimeout(10)
        try:
            s.sendall(raw)
        except OSError:
            return  # refused mid-send (e.g. 413 then close): checked by the answer below
        f = s.makefile("rb")
        try:
            line = f.readline(1000)
            if line.startswith(b"HTTP/1.1 100 "):  # Expect: 100-continue
                assert f.readline(1000) == b"\r\n"
                line = f.readline(1000)
        except ConnectionError:
            return
        if not line:
            return  # closed without an answer: an incomplete request at its deadline
        version, code, _ = line.decode("latin-1").split(" ", 2)
        assert version == "HTTP/1.1", line
        status = int(code)
        headers = http.client.parse_headers(f)
        length = 0 if raw.startswith(b"HEAD ") else int(headers["Content-Length"])
        body = f.read(length)
        assert len(body) == length
        assert status < 500, (raw[:200], line, body[:200])
        if status >= 400:
            assert len(body) <= MAX_ERROR


token = st.text(
    st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"), min_size=1,
    max_size=12,
)
paths = st.one_of(
    st.sampled_from(["/metrics", "/healthz", "/livez", "/readyz", "/", "/metrics?x=1"]),
    st.text(max_size=40).map(lambda p: "/" + p),
)
methods = st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE"]) | token
header_names = token.filter(
    lambda n: n.lower() not in ("content-length", "transfer-encoding", "expect")
)
headers = st.lists(st.tuples(header_names, st.text(max_size=30)), max_size=6)


@FUZZ
@given(method=methods, path=paths, hdrs=headers, body=st.binary(max_size=200))
def test_requests(handle: HttpHandle, method: str, path: str, hdrs: list[tuple[str, str]],
                  body: bytes) -> None:
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\n"
    head += "".join(f"{n}: {v}\r\n" for n, v in hdrs)
    head += f"Content-Length: {len(body)}\r\n\r\n"
    exchange(handle, head.encode("utf-8", "surrogateescape") + body)


@FUZZ
@given(raw=st.binary(max_size=400))
def test_arbitrary_bytes(handle: HttpHandle, raw: bytes) -> None:
    exchange(handle, raw + b"\r\n\r\n")


@FUZZ
@given(
    method=methods,
    path=paths,
    framing=st.sampled_from([
        "Transfer-Encoding: chunked\r\n", "Content-Length: -1\r\n", "Content-Length: x\r\n",
        "Content-Length: 99999999999\r\n", "Content-Length: 1\r\nContent-Length: 2\r\n",
        "Expect: 100-continue\r\nContent-Length: 5\r\n", "",
    ]),
    body=st.binary(max_size=50),
)
def test_framing_headers(
    handle: HttpHandle, method: str, path: str, framing: str, body: bytes
) -> None:
    raw = f"{method} {path} HTTP/1.1\r\nHost: t\r\n{framing}\r\n".encode("utf-8", "surrogateescape")
    exchange(handle, raw + body)
