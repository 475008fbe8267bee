"""Only the scheduler can call the extender: loopback by default,
mutual TLS otherwise, real HTTPS on 127.0.0.1 with certificates made for the test."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_share.cli import extender_main
from gpu_share.cli.extender_main import UsageError, parse_args, serving
from gpu_share.extender.http import make_server
from gpu_share.observability.http import server_tls_context
from tests.extender.test_http import FakeBinder, FakeView, fgd_extender, kpod
from tests.extender.tls_support import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def https(pki: Pki) -> Iterator[tuple[int, FakeBinder]]:
    view, binder = FakeView(), FakeBinder()
    ext = fgd_extender(view, binder, clock=lambda: 1_700_000_000.0)
    ctx = server_tls_context(str(pki.server_cert), str(pki.server_key), str(pki.ca))
    server = make_server(ext, "127.0.0.1", 0, ssl_context=ctx)
    t = server.start()
    try:
        yield server.server_address[1], binder
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def client_context(pki: Pki, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None and key is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def call(port: int, ctx: ssl.SSLContext, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data)
    with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
        return r.status, json.loads(r.read())


BIND = {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-1", "Node": "b"}
REFUSED = (ssl.SSLError, ConnectionError, urllib.error.URLError)


def test_client_with_the_chart_ca_certificate_is_served(pki: Pki, https: Any) -> None:
    port, binder = https
    ctx = client_context(pki, pki.client_cert, pki.client_key)
    assert call(port, ctx, "/healthz") == (200, {"status": "ok"})
    code, got = call(port, ctx, "/filter", {"Pod": kpod(4, 30), "NodeNames": ["a", "b"]})
    assert code == 200 and got["NodeNames"] == ["a", "b"]
    assert call(port, ctx, "/bind", BIND) == (200, {"Error": ""})
    assert [c[0] for c in binder.calls] == ["annotate", "bind"]


@pytest.mark.parametrize("who", ["no certificate", "another CA"])
def test_other_clients_are_refused_and_bind_nothing(
    pki: Pki, https: Any, who: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port, binder = https
    if who == "no certificate":
        ctx = client_context(pki, None, None)
    else:
        ctx = client_context(pki, pki.other_client_cert, pki.other_client_key)
    with pytest.raises(REFUSED):
        call(port, ctx, "/bind", BIND)
    # TLS 1.2: the refusal is the handshake itself (in 1.3 the client learns it on read).
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, pytest.raises(
        REFUSED
    ), ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert not tls.recv(100).startswith(b"HTTP/1.1 200")
        raise ConnectionError("no answer")
    assert binder.calls == []
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]


def test_plain_http_to_the_tls_port_gets_nothing(https: Any) -> None:
    port, binder = https
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /bind HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}")
        try:
            data = s.recv(100)
        except ConnectionError:
            data = b""
    assert not data.startswith(b"HTTP/1.1 2") and binder.calls == []


def test_a_stalled_handshake_holds_no_worker(pki: Pki, https: Any) -> None:
    # Connections that never finish the handshake (nothing sent, or half a ClientHello)
    # wait in the I/O thread; the scheduler's own client still gets through at once.
    port, _ = https
    base = threading.active_count()
    stalled = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
    try:
        for s in stalled[::2]:
            s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello's start
        ctx = client_context(pki, pki.client_cert, pki.client_key)
        assert call(port, ctx, "/healthz")[0] == 200
        assert threading.active_count() <= base + 1
    finally:
        for s in stalled:
            s.close()


# -- the command line ---------------------------------------------------------------------

def test_off_loopback_without_mutual_tls_refuses_to_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert extender_main.main(["--listen", "0.0.0.0:0"]) == 2
    assert "refusing to listen on 0.0.0.0:0 without mutual TLS" in capsys.readouterr().err


def test_env_listen_is_checked_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPU_SHARE_EXTENDER_LISTEN", "10.1.2.3:8888")
    assert extender_main.main([]) == 2
    assert "without mutual TLS" in capsys.readouterr().err


def test_defaults_are_loopback_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("LISTEN", "TLS_CERT_FILE", "TLS_KEY_FILE", "CLIENT_CA_FILE"):
        monkeypatch.delenv(f"GPU_SHARE_EXTENDER_{var}", raising=False)
    plan = serving(parse_args([]))
    assert (plan.host, plan.port, plan.tls, plan.mutual_tls) == ("127.0.0.1", 8888, None, False)
    limits = plan.limits
    assert (limits.workers, limits.max_body_bytes) == (16, 4 * 2**20)
    assert (limits.read_timeout_s, limits.idle_timeout_s) == (10.0, 30.0)


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "localhost:0", "[::1]:0", "127.9.9.9:1"])
def test_loopback_needs_no_tls(listen: str) -> None:
    assert serving(parse_args(["--listen", listen])).tls is None


def test_mutual_tls_or_the_explicit_insecure_flag_allow_other_addresses(pki: Pki) -> None:
    mtls = serving(parse_args([
        "--listen", "0.0.0.0:0", "--tls-cert-file", str(pki.server_cert),
        "--tls-key-file", str(pki.server_key), "--client-ca-file", str(pki.ca),
    ]))
    assert mtls.mutual_tls and mtls.tls is not None
    assert mtls.tls.verify_mode == ssl.CERT_REQUIRED
    insecure = serving(parse_args(["--listen", ":8888", "--insecure-allow-unauthenticated"]))
    assert (insecure.host, insecure.tls) == ("0.0.0.0", None)


@pytest.mark.parametrize(
    "extra",
    [
        ["--tls-cert-file", "c"],  # without its key
        ["--client-ca-file", "ca"],  # without a certificate
        ["--listen", "0.0.0.0:0", "--tls-cert-file", "/nonexistent", "--tls-key-file", "k",
         "--client-ca-file", "ca"],
        ["--listen", "nonsense"],
        ["--workers", "0"],
        ["--read-timeout-seconds", "0"],
    ],
)
def test_bad_serving_flags_are_usage_errors(extra: list[str]) -> None:
    with pytest.raises(UsageError):
        serving(parse_args(extra))


def test_server_only_tls_off_loopback_is_not_enough(pki: Pki) -> None:
    with pytest.raises(UsageError, match="without mutual TLS"):
        serving(parse_args([
            "--listen", "0.0.0.0:0", "--tls-cert-file", str(pki.server_cert),
            "--tls-key-file", str(pki.server_key),
        ]))


def test_invalid_resource_names_refuse_to_start(capsys: pytest.CaptureFixture[str]) -> None:
    """The extender applies the agent's rules to its names (before: any --domain went)."""
    assert extender_main.main(["--domain", "x" * 300]) == 2
    err = capsys.readouterr().err
    assert "invalid resource names" in err and len(err) < 600


def test_the_probe_presents_the_client_certificate(
    pki: Pki, https: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The chart's exec probes of a mutual-TLS sidecar (host network): ``gpu-share probe``
    with the scheduler's certificate and the name the server's certificate carries."""
    from gpu_share.cli.admin import main as admin

    port, _ = https
    url = f"https://127.0.0.1:{port}/healthz"
    tls = ["--cert", str(pki.client_cert), "--key", str(pki.client_key), "--ca", str(pki.ca)]
    assert admin(["probe", *tls, url]) == 0
    assert admin(["probe", *tls, "--server-name", "localhost", url]) == 0
    assert "200" in capsys.readouterr().out
    # No certificate: the server refuses the handshake; a name outside the certificate:
    # the probe refuses the server.
    assert admin(["probe", "--ca", str(pki.ca), url]) == 1
    assert admin(["probe", *tls, "--server-name", "evil.example.com", url]) == 1
    other = ["--cert", str(pki.other_client_cert), "--key", str(pki.other_client_key)]
    assert admin(["probe", *other, "--ca", str(pki.ca), url]) == 1
