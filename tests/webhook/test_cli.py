"""L1: the ``gpu-share-webhook`` entry point (flags, refusals, a bound server)."""

from __future__ import annotations

import http.client
import json
import ssl
from pathlib import Path

import pytest

from gpu_share.cli import webhook_main as cli
from tests.extender.tls_support import make_pki
from tests.webhook.test_review import UID, review


def _kubeconfig(tmp_path: Path) -> str:
    p = tmp_path / "kubeconfig"
    p.write_text("""apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
""")
    return str(p)


def test_defaults() -> None:
    a = cli.parse_args([])
    s = cli.settings_of(a)
    assert (s.names.memory, s.names.core) == ("vendor.com/vcuda-memory", "vendor.com/vcuda-core")
    assert s.memory_unit_mib == 1024 and s.device_class == "gpu-share.vendor.com"
    assert (a.bind, a.port) == ("0.0.0.0", 8443)
    assert cli.limits_of(a).max_body_bytes == 2**20


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "--tls-cert-file and --tls-key-file are required"),
        (["--tls-cert-file", "/nonexistent", "--tls-key-file", "/nonexistent"],
         "cannot load the TLS files"),
        (["--memory-unit-mib", "0"], "invalid settings"),
        (["--domain", "Not A Domain"], "invalid settings"),
        (["--workers", "0"], "must be at least 1"),
        (["--read-timeout-seconds", "0"], "timeouts must be positive"),
        (["--namespace-label", "no-equals-sign"], "--namespace-label must be KEY=VALUE"),
        (["--namespace-label", "=x"], "--namespace-label must be KEY=VALUE"),
        (["--namespace-label", "Bad_Prefix!/dra=enabled"], "--namespace-label"),
        (["--namespace-label", "k=" + "v" * 64], "--namespace-label"),
    ],
)
def test_refusals_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
                         ) -> None:
    assert cli.main(argv) == 2
    assert needle in capsys.readouterr().err


def test_namespace_label() -> None:
    assert cli.namespace_label_of(cli.parse_args([])) == ("gpu-share.vendor.com/dra", "enabled")
    a = cli.parse_args(["--namespace-label", "example.org/gpu=on"])
    assert cli.namespace_label_of(a) == ("example.org/gpu", "on")
    assert cli.namespace_label_of(cli.parse_args(["--namespace-label", "gpu="])) == ("gpu", "")


def test_client_certificates_are_required_with_a_client_ca(tmp_path: Path) -> None:
    """--client-ca-file: a caller with a certificate of another CA cannot complete the
    handshake, one without a certificate (any pod that reaches the port) gets 403 for a
    review and nothing is done; the API server, given a client certificate by its
    admission config, is served; probes (no certificate) still answer."""
    pki = make_pki(tmp_path)
    tls = ["--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key)]
    assert cli.main([*tls, "--client-ca-file", str(tmp_path / "missing.pem")]) == 2
    a = cli.parse_args([
        *tls, "--client-ca-file", str(pki.ca), "--bind", "127.0.0.1", "--port", "0",
        "--kubeconfig", _kubeconfig(tmp_path),
    ])
    server = cli.build(a)
    server.start()
    port = server.server_address[1]

    def call(cert: Path | None, key: Path | None, method: str = "POST",
             path: str = "/mutate") -> tuple[int, bytes]:
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        if cert is not None and key is not None:
            ctx.load_cert_chain(str(cert), str(key))
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
        try:
            body = json.dumps(review(dryRun=True)).encode() if method == "POST" else None
            conn.request(method, path, body=body)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    try:
        code, body = call(pki.client_cert, pki.client_key)
        assert code == 200 and json.loads(body)["response"]["uid"] == UID
        code, body = call(None, None)
        assert code == 403 and json.loads(body) == {"error": "a client certificate is required"}
        assert call(None, None, "GET", "/healthz")[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            call(pki.other_client_cert, pki.other_client_key)
    finally:
        server.shutdown()
        server.server_close()


def test_builds_a_serving_https_server(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    a = cli.parse_args([
        "--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key),
        "--bind", "127.0.0.1", "--port", "0", "--kubeconfig", _kubeconfig(tmp_path),
    ])
    server = cli.build(a)
    server.start()
    try:
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        conn = http.client.HTTPSConnection("127.0.0.1", server.server_address[1], timeout=10,
                                           context=ctx)
        conn.request("POST", "/mutate", body=json.dumps(review(dryRun=True)).encode())
        answer = json.loads(conn.getresponse().read())
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
    assert answer["response"]["uid"] == UID and answer["response"]["allowed"] is True
