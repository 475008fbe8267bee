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
    ],
)
def test_refusals_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
                         ) -> None:
    assert cli.main(argv) == 2
    assert needle in capsys.readouterr().err


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
