"""``kube.rest``: configuration, auth headers, bounded answers, timeouts, keep-alive and
watches, against loopback servers (the real API server: test_l3_rest_auth.py)."""

from __future__ import annotations

import base64
import dataclasses
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kube_fakes import Call, FakeStream, fake_rest, status_obj

from gpu_share.errors import KubeAccessError
from gpu_share.kube.listwatch import WatchEventError
from gpu_share.kube.rest import (
    MAX_IDLE_CONNECTIONS,
    ApiError,
    KubeTimeouts,
    RestClient,
    RestConfig,
    load_rest_config,
    make_rest_client,
)
from tests.kube.conftest import KUBECONFIG, write_kubeconfig

# ---------------------------------------------------------------- configuration


def test_explicit_kubeconfig_wins(tmp_path: Path) -> None:
    env = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBECONFIG": write_kubeconfig(tmp_path, 2222),
    }
    cfg = load_rest_config(write_kubeconfig(tmp_path, 1111), environ=env)
    assert (cfg.server, cfg.token, cfg.insecure) == ("https://127.0.0.1:1111", "tok-1111", True)


def test_in_cluster_honours_service_env(tmp_path: Path) -> None:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-token\n")
    ca.write_text("only read when a client is built")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443",
           "KUBECONFIG": write_kubeconfig(tmp_path, 2222)}
    cfg = load_rest_config(environ=env, token_file=str(token), ca_file=str(ca))
    assert cfg == RestConfig(server="https://[fd00::1]:6443", ca_file=str(ca),
                             token_file=str(token))


def test_kubeconfig_env_then_missing_everything(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    env = {"KUBECONFIG": f"{missing}:{write_kubeconfig(tmp_path, 3333)}"}
    assert load_rest_config(environ=env).server == "https://127.0.0.1:3333"
    with pytest.raises(KubeAccessError) as ei:
        load_rest_config(environ={"KUBECONFIG": missing})
    assert ei.value.reason == "KubeConfigMissing"
    with pytest.raises(KubeAccessError, match="not in a cluster"):
        load_rest_config(environ={"HOME": str(tmp_path)})


def test_in_cluster_without_token_file_is_an_access_error(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    with pytest.raises(KubeAccessError) as ei:
        load_rest_config(environ=env, token_file=str(tmp_path / "t"), ca_file=str(tmp_path / "c"))
    assert ei.value.reason == "KubeConfigInvalid"


@pytest.mark.parametrize(
    "text",
    [
        "apiVersion: v1\nkind: Config\ncurrent-context: nope\n",
        "- a list\n",
        "key: [unclosed\n",
        KUBECONFIG.replace('token: "tok-{port}"', "exec: {{command: gcloud}}"),
        KUBECONFIG.replace('token: "tok-{port}"', "auth-provider: {{name: oidc}}"),
        KUBECONFIG.replace('token: "tok-{port}"', "username: a, password: b"),
        KUBECONFIG.replace("insecure-skip-tls-verify: true", "proxy-url: 'http://p:3128'"),
        KUBECONFIG.replace("https://", "ftp://"),
        KUBECONFIG.replace('token: "tok-{port}"', 'client-certificate-data: "!!"'),
    ],
)
def test_broken_or_unsupported_kubeconfig_is_an_access_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(KubeAccessError) as ei:
        load_rest_config(write_kubeconfig(tmp_path, 1, text))
    assert ei.value.reason == "KubeConfigInvalid"


def test_kubeconfig_files_are_relative_to_it_and_data_is_decoded(tmp_path: Path) -> None:
    text = """
clusters: [{{name: c, cluster: {{server: "https://h:1/prefix/", certificate-authority: ca.crt,
  tls-server-name: api.example}}}}]
users: [{{name: u, user: {{client-certificate: sub/c.crt, client-key-data: {key},
  tokenFile: /abs/token}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}, {{name: y, context: {{cluster: c}}}}]
current-context: x
""".replace("{key}", base64.b64encode(b"KEY").decode())
    path = write_kubeconfig(tmp_path, 1, text)
    cfg = load_rest_config(path)
    assert cfg.server == "https://h:1/prefix" and cfg.tls_server_name == "api.example"
    assert cfg.ca_file == str(tmp_path / "ca.crt")
    assert cfg.cert_file == str(tmp_path / "sub" / "c.crt") and cfg.key_data == b"KEY"
    assert cfg.token_file == "/abs/token" and cfg.token is None
    bare = load_rest_config(path, context="y")  # no user: no credentials
    assert (bare.cert_file, bare.key_data, bare.token_file) == (None, None, None)


def test_agent_path_does_not_import_the_generated_client() -> None:
    code = (
        "import sys, gpu_share.cli.plugin_main, gpu_share.kube.rest, gpu_share.kube.pods,"
        " gpu_share.kube.publish, gpu_share.kube.listwatch\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('kubernetes', 'urllib3', 'pydantic_settings'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_component_imports_the_generated_client() -> None:
    """Every entry point and API module, imported together: no ``kubernetes`` (nor its
    urllib3) is loaded; ``kube.rest`` is the one client."""
    mods = ", ".join(f"gpu_share.cli.{m}" for m in (
        "plugin_main", "extender_main", "webhook_main", "admin", "kubectl_plugin",
        "kubectl_cordon", "kubectl_fit", "kubectl_plot"))
    code = (
        f"import sys, {mods}, gpu_share.kube.cluster_view, gpu_share.kube.binder\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'urllib3'))\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# ---------------------------------------------------------------- requests


def test_token_file_is_reread_when_it_rotates(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    api, http = fake_rest(lambda c: (200, {}))
    api = RestClient(RestConfig(server=api.host, token_file=str(token)))
    api.get("get", "/api/v1/nodes/a")
    new = tmp_path / "token.new"
    new.write_text("second\n")
    new.replace(token)  # the kubelet swaps projected tokens atomically
    api.get("get", "/api/v1/nodes/a")
    token.unlink()  # mid-rotation: the last token is kept
    api.get("get", "/api/v1/nodes/a")
    assert [c.headers["Authorization"] for c in http.calls] == [
        "Bearer first", "Bearer second", "Bearer second"]
    assert all(c.headers["User-Agent"] == "gpu-share-plugin" for c in http.calls)


def test_http_errors_carry_status_and_message() -> None:
    api, _ = fake_rest(lambda c: (403, status_obj(403, "Forbidden", "pods is forbidden")))
    with pytest.raises(ApiError) as ei:
        api.get("get pod ns/p", "/api/v1/namespaces/ns/pods/p")
    e = ei.value
    assert (e.status, e.reason) == (403, "KubeForbidden")
    assert str(e) == "get pod ns/p: API server answered 403: pods is forbidden"
    api2, _ = fake_rest(lambda c: (502, b"<html>bad gateway" + b"x" * 10_000))
    with pytest.raises(ApiError) as ei2:
        api2.get("op", "/x")
    assert ei2.value.reason == "KubeUnreachable" and len(str(ei2.value)) < 300


def test_answers_are_bounded_in_size() -> None:
    big = {"items": ["x" * 1000] * 100}
    api, _ = fake_rest(lambda c: (200, big), max_body_bytes=10_000)
    with pytest.raises(KubeAccessError, match="byte bound"):
        api.get("list", "/api/v1/pods")
    # Without a Content-Length (a chunked answer) the read stops at the bound too.
    chunked, _ = fake_rest(lambda c: FakeStream([big]), max_body_bytes=10_000)
    with pytest.raises(KubeAccessError, match="byte bound"):
        chunked.get("list", "/api/v1/pods")
    ok, _ = fake_rest(lambda c: (200, big), max_body_bytes=200_000)
    assert ok.get("list", "/api/v1/pods") == big


def silent_server() -> tuple[socket.socket, list[socket.socket]]:
    """Accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        for _ in range(8):
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    return srv, held


def test_read_timeout_bounds_a_silent_server() -> None:
    srv, held = silent_server()
    try:
        port = srv.getsockname()[1]
        api = RestClient(RestConfig(server=f"http://127.0.0.1:{port}"),
                         timeouts=KubeTimeouts(connect=1.0, read=0.3))
        t0 = time.monotonic()
        with pytest.raises(KubeAccessError, match="unreachable"):
            api.get("get pod ns/p", "/api/v1/namespaces/ns/pods/p")
        assert time.monotonic() - t0 < 3.0
        # A watch's silence is bounded by its own timeout.
        t0 = time.monotonic()
        with pytest.raises(KubeAccessError):
            list(api.watch("watch", "/api/v1/pods", {"watch": True}, 0.3))
        assert time.monotonic() - t0 < 3.0
    finally:
        srv.close()
        for c in held:
            c.close()


def test_refused_connection_is_an_access_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    api = RestClient(RestConfig(server=f"http://127.0.0.1:{port}"))
    with pytest.raises(KubeAccessError, match="get node n: API server unreachable"):
        api.get("get node n", "/api/v1/nodes/n")


def test_keep_alive_is_reused_and_a_closed_idle_connection_is_replaced() -> None:
    peers: list[int] = []

    def handler(call: Call) -> Any:
        return 200, {"n": len(peers)}

    api, http = fake_rest(handler)
    for _ in range(3):
        api.get("get", "/api/v1/nodes/a")
    assert len(api._idle) == 1  # one connection served all three
    # The server closes the idle connection (its keep-alive timeout): next call still works.
    idle = api._idle[0]
    assert idle.sock is not None
    idle.sock.shutdown(socket.SHUT_RDWR)
    assert api.get("get", "/api/v1/nodes/a") == {"n": 0}
    assert len(http.calls) == 4
    api.close()
    assert api._idle == []


def test_query_and_body_encoding() -> None:
    api, http = fake_rest(lambda c: (201, {"ok": True}))
    assert api.create("create", "/api/v1/namespaces/n%2Fx/events", {"a": [1, None]}) == {"ok": True}
    api.get("list", "/api/v1/pods", {"watch": False, "limit": 5, "continue": None,
                                     "fieldSelector": "spec.nodeName=a b"})
    post, get = http.calls
    assert post.headers["Content-Type"] == "application/json" and post.body == {"a": [1, None]}
    assert post.path == "/api/v1/namespaces/n%2Fx/events"
    assert get.query == {"watch": "false", "limit": "5", "fieldSelector": "spec.nodeName=a b"}


# ---------------------------------------------------------------- watches


def test_watch_streams_events_and_interrupt_unblocks_it() -> None:
    s = FakeStream([{"type": "ADDED", "object": {"metadata": {"name": "a"}}}], block=True)
    api, _ = fake_rest(lambda c: s)
    w = api.watch("watch", "/api/v1/pods", {"watch": True}, 30)
    events = iter(w)
    assert next(events)["object"]["metadata"]["name"] == "a"
    threading.Timer(0.2, w.interrupt).start()
    t0 = time.monotonic()
    with pytest.raises((StopIteration, KubeAccessError)):
        next(events)
    assert time.monotonic() - t0 < 5
    w.close()


def test_watch_open_errors_and_oversized_events() -> None:
    api, _ = fake_rest(lambda c: (410, status_obj(410, "Expired", "too old")))
    with pytest.raises(ApiError) as ei:
        api.watch("watch", "/api/v1/pods", {"watch": True}, 5)
    assert ei.value.status == 410
    import gpu_share.kube.listwatch as lw

    s = FakeStream(block=False)
    s._q.queue.clear()
    s._q.put(b"{" + b" " * 200)
    s._q.put(None)
    api2, _ = fake_rest(lambda c: s)
    w = api2.watch("watch", "/api/v1/pods", {"watch": True}, 5)
    old, lw.MAX_EVENT_BYTES = lw.MAX_EVENT_BYTES, 100
    try:
        with pytest.raises(WatchEventError):
            list(w)
    finally:
        lw.MAX_EVENT_BYTES = old
        w.close()


def test_make_rest_client_applies_timeouts(tmp_path: Path) -> None:
    api = make_rest_client(write_kubeconfig(tmp_path, 4444),
                           timeouts=KubeTimeouts(connect=1.0, read=2.0))
    assert api.t == KubeTimeouts(1.0, 2.0) and api.host == "https://127.0.0.1:4444"


def test_only_a_failed_connect_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    api, fake = fake_rest(lambda c: (500, status_obj(500, "InternalError", "boom")))
    api = dataclasses.replace(api, connect_retries=2)
    real = socket.create_connection
    refusals = [2]

    def flaky(*args: Any, **kw: Any) -> socket.socket:
        if refusals[0]:
            refusals[0] -= 1
            raise ConnectionRefusedError("refused")
        return real(*args, **kw)

    monkeypatch.setattr(socket, "create_connection", flaky)
    # Two refused connects, then one request; its 500 is not repeated.
    with pytest.raises(ApiError) as ei:
        api.get("get", "/api/v1/nodes/a")
    assert ei.value.status == 500 and len(fake.calls) == 1
    api.close()  # no idle keep-alive connection: the next request connects
    refusals[0] = 3  # one more than the retries
    with pytest.raises(KubeAccessError, match="unreachable: refused"):
        api.get("get", "/api/v1/nodes/a")
    assert len(fake.calls) == 1


def test_no_connect_retry_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    api, fake = fake_rest(lambda c: (200, {}))
    tries = []

    def refused(*args: Any, **kw: Any) -> socket.socket:
        tries.append(1)
        raise ConnectionRefusedError("refused")

    monkeypatch.setattr(socket, "create_connection", refused)
    with pytest.raises(KubeAccessError):
        api.get("get", "/api/v1/nodes/a")
    assert len(tries) == 1 and not fake.calls


@pytest.mark.parametrize("max_idle", [MAX_IDLE_CONNECTIONS, 8])
def test_idle_connections_kept_up_to_max_idle(max_idle: int) -> None:
    # 8 requests in flight at once need 8 connections; afterwards the client keeps
    # max_idle of them and the next 8 requests open only what it did not keep.
    barrier = threading.Barrier(8, timeout=10)

    def handler(call: Call) -> Any:
        if call.path.endswith("/wait"):
            barrier.wait()
        return 200, {}

    api, http = fake_rest(handler, max_idle=max_idle)

    def burst() -> None:
        threads = [threading.Thread(target=api.get, args=("get", "/api/v1/nodes/wait"))
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)

    burst()
    assert len(api._idle) == max_idle
    kept = set(map(id, api._idle))
    barrier.reset()
    burst()
    assert len(api._idle) == max_idle
    assert len(http.calls) == 16
    if max_idle == 8:
        assert set(map(id, api._idle)) == kept  # all 8 reused, none opened
    api.close()
