"""The extender's own metrics: every scheduler request counted by verb and
outcome and timed, filter and bind results, the cluster view's counts; served on a
separate read-only listener (the agent's bounded /metrics server), never on the
scheduler's API port."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping

import pytest
from prometheus_client import CONTENT_TYPE_LATEST

from gpu_share.cli import extender_main
from gpu_share.extender.http import make_server
from gpu_share.kube.cluster_view import KubeClusterView
from gpu_share.observability.http import AGENT_LIMITS, BoundedServer, start_http
from gpu_share.observability.metrics import (
    BIND_OUTCOMES,
    EXTENDER_VERBS,
    OTHER_VERB,
    REQUEST_OUTCOMES,
    ExtenderMetrics,
)
from gpu_share.sharing.placement import Shape, Workload
from testkit.kube_admin import idle_api
from tests.extender.test_http import (
    CORE,
    KEY,
    MEM,
    FakeBinder,
    FakeView,
    fgd_extender,
    kpod,
    post_raw,
)

Served = tuple[str, ExtenderMetrics, FakeView, FakeBinder]


class FailingBinder(FakeBinder):
    def annotate_and_bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        raise RuntimeError("API server said no")


def _serve(binder: FakeBinder | None = None) -> tuple[BoundedServer, ExtenderMetrics, FakeView,
                                                      FakeBinder]:
    metrics, view, binder = ExtenderMetrics(), FakeView(), binder or FakeBinder()
    ext = fgd_extender(
        view, binder, clock=lambda: 1_700_000_000.0, on_bind=metrics.observe_bind
    )
    return make_server(ext, "127.0.0.1", 0, metrics=metrics), metrics, view, binder


@pytest.fixture
def served() -> Iterator[Served]:
    server, metrics, view, binder = _serve()
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", metrics, view, binder
    finally:
        server.shutdown()
        server.server_close()
        t.join(timeout=5)


def requests(m: ExtenderMetrics, verb: str, outcome: str) -> float:
    got = m.registry.get_sample_value(
        "gpu_share_extender_requests_total", {"verb": verb, "outcome": outcome}
    )
    assert got is not None
    return got


def counted(m: ExtenderMetrics) -> dict[tuple[str, str], float]:
    """The non-zero request counters."""
    out = {}
    for verb in (*EXTENDER_VERBS, OTHER_VERB):
        for outcome in REQUEST_OUTCOMES:
            if (n := requests(m, verb, outcome)) > 0:
                out[(verb, outcome)] = n
    return out


def sample(m: ExtenderMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_every_series_of_the_closed_label_sets_exists_at_zero() -> None:
    m = ExtenderMetrics()
    assert counted(m) == {}
    for outcome in BIND_OUTCOMES:
        assert sample(m, "gpu_share_extender_binds_total", outcome=outcome) == 0
    text = m.render().decode()
    assert 'gpu_share_extender_requests_total{outcome="refused",verb="bind"} 0.0' in text
    assert 'gpu_share_extender_request_duration_seconds_count{verb="filter"} 0.0' in text


def test_filter_prioritize_and_bind_are_counted_and_timed(served: Served) -> None:
    url, m, _, binder = served
    code, got = post_raw(url + "/filter", json.dumps(
        {"Pod": kpod(12, 30), "NodeNames": ["a", "b", "zz"]}).encode())
    assert code == 200 and got["NodeNames"] == ["b"]
    assert sample(m, "gpu_share_extender_filter_nodes_total", result="passed") == 1
    assert sample(m, "gpu_share_extender_filter_nodes_total", result="failed") == 2
    code, _ = post_raw(url + "/prioritize", json.dumps(
        {"Pod": kpod(4, 30), "NodeNames": ["a", "b"]}).encode())
    assert code == 200
    bind = {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-1", "Node": "b"}
    code, got = post_raw(url + "/bind", json.dumps(bind).encode())
    assert code == 200 and got == {"Error": ""} and binder.calls
    assert counted(m) == {("filter", "ok"): 1, ("prioritize", "ok"): 1, ("bind", "ok"): 1}
    assert sample(m, "gpu_share_extender_binds_total", outcome="bound") == 1
    for verb in EXTENDER_VERBS:
        n = sample(m, "gpu_share_extender_request_duration_seconds_count", verb=verb)
        total = sample(m, "gpu_share_extender_request_duration_seconds_sum", verb=verb)
        assert n == 1 and total is not None and 0 < total < 10, verb


def test_answers_with_an_error_count_as_error_and_by_bind_outcome(served: Served) -> None:
    url, m, _, _ = served
    # A bind that no longer fits (a 16-unit ask on node a's 8 free units).
    post_raw(url + "/filter", json.dumps({"Pod": kpod(16, 30, "uid-9"),
                                          "NodeNames": ["b"]}).encode())
    bind = {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-9", "Node": "a"}
    code, got = post_raw(url + "/bind", json.dumps(bind).encode())
    assert code == 200 and got["Error"]
    # A bind of a pod neither seen nor in the view.
    gone = {"PodName": "q", "PodNamespace": "ns", "PodUID": "uid-x", "Node": "a"}
    assert post_raw(url + "/bind", json.dumps(gone).encode())[1]["Error"]
    # A filter of a pod with a malformed quantity: refused before the core runs.
    bad = kpod(4, 30)
    bad["spec"]["containers"][0]["resources"]["limits"][MEM] = "lots"
    code, _ = post_raw(url + "/filter", json.dumps({"Pod": bad, "NodeNames": ["a"]}).encode())
    assert code == 400
    assert counted(m) == {("filter", "ok"): 1, ("bind", "error"): 2, ("filter", "refused"): 1}
    assert sample(m, "gpu_share_extender_binds_total", outcome="no_fit") == 1
    assert sample(m, "gpu_share_extender_binds_total", outcome="pod_not_found") == 1
    # an answered error counts no nodes
    assert sample(m, "gpu_share_extender_filter_nodes_total", result="passed") == 1


def test_a_failed_bind_write_is_an_api_error() -> None:
    server, m, _, _ = _serve(FailingBinder())
    t = server.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        post_raw(url + "/filter", json.dumps({"Pod": kpod(4, 30), "NodeNames": ["b"]}).encode())
        bind = {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-1", "Node": "b"}
        code, got = post_raw(url + "/bind", json.dumps(bind).encode())
        assert code == 200 and "API server said no" in got["Error"]
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)
    assert sample(m, "gpu_share_extender_binds_total", outcome="api_error") == 1
    assert requests(m, "bind", "error") == 1


def raw(url: str, data: bytes) -> int:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.sock = None
        conn.connect()
        assert conn.sock is not None
        conn.sock.sendall(data)
        resp = http.client.HTTPResponse(conn.sock)
        resp.begin()
        resp.read()
        return resp.status
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("path", "data", "verb", "code"),
    [
        ("/filter", b"{not json", "filter", 400),
        ("/bind", b'{"PodName": 3}', "bind", 400),
        ("/prioritize", b"[]", "prioritize", 400),
        ("/nope", b"{}", OTHER_VERB, 404),
    ],
)
def test_malformed_requests_count_as_refused(
    served: Served, path: str, data: bytes, verb: str, code: int
) -> None:
    url, m, _, _ = served
    assert post_raw(url + path, data)[0] == code
    assert counted(m) == {(verb, "refused"): 1}
    assert sample(m, "gpu_share_extender_request_duration_seconds_count", verb=verb) == 1


@pytest.mark.parametrize(
    ("data", "verb"),
    [
        (b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", "filter"),
        (b"POST /bind HTTP/1.1\r\nHost: x\r\n\r\n", "bind"),  # no Content-Length: 411
        (b"PUT /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", "filter"),  # 405
        (b"GARBAGE\r\n\r\n", OTHER_VERB),
    ],
)
def test_framing_refusals_count_as_refused_and_the_server_goes_on(
    served: Served, data: bytes, verb: str
) -> None:
    url, m, _, _ = served
    assert 400 <= raw(url, data) < 500
    assert counted(m) == {(verb, "refused"): 1}
    code, _ = post_raw(url + "/filter", json.dumps({"Pod": kpod(4, 30),
                                                    "NodeNames": ["a"]}).encode())
    assert code == 200 and requests(m, "filter", "ok") == 1


def test_probes_are_not_counted_and_the_api_port_has_no_metrics(served: Served) -> None:
    url, m, _, _ = served
    with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
        assert r.status == 200
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url + "/metrics", timeout=10)
    assert info.value.code == 404
    assert counted(m) == {}


def test_a_bug_counts_as_internal(served: Served) -> None:
    url, m, view, _ = served

    def boom(name: str) -> None:
        raise RuntimeError("bug")

    view.node = boom  # type: ignore[method-assign]
    code, _ = post_raw(url + "/filter", json.dumps({"Pod": kpod(4, 30),
                                                    "NodeNames": ["a"]}).encode())
    assert code == 500
    assert counted(m) == {("filter", "internal"): 1}


def test_view_counts_are_read_at_scrape_time_and_counters_never_go_down() -> None:
    m = ExtenderMetrics()
    state = {"nodes": 3, "pods": 7, "lists": {"nodes": 1, "pods": 2}, "errors": {"pods": 1}}
    m.registry.collectors.append(lambda: m.set_view(
        state["nodes"], state["pods"], state["lists"], state["errors"]))  # type: ignore[arg-type]
    text = m.render().decode()
    assert "gpu_share_extender_view_nodes 3.0" in text
    assert "gpu_share_extender_view_pods 7.0" in text
    assert 'gpu_share_extender_view_lists_total{watch="pods"} 2.0' in text
    assert 'gpu_share_extender_view_watch_errors_total{watch="pods"} 1.0' in text
    state.update(nodes=2, lists={"nodes": 1, "pods": 5}, errors={"pods": 0})
    text = m.render().decode()
    assert "gpu_share_extender_view_nodes 2.0" in text
    assert 'gpu_share_extender_view_lists_total{watch="pods"} 5.0' in text
    assert 'gpu_share_extender_view_watch_errors_total{watch="pods"} 1.0' in text


def test_untrusted_reasons_are_counted_and_capped() -> None:
    m = ExtenderMetrics()
    for i in range(200):
        m.observe_untrusted(f"reason-{i}")
    text = m.render().decode()
    assert text.count("gpu_share_extender_untrusted_annotations_total{") == 65  # cap + other
    assert 'gpu_share_extender_untrusted_annotations_total{reason="other"} 136.0' in text


def test_the_cluster_view_feeds_untrusted_and_its_counts() -> None:
    m = ExtenderMetrics()
    v = KubeClusterView(
        idle_api(), domain="vendor.com", memory_resource=MEM, core_resource=CORE,
        default_workload=Workload([Shape(4, 30, 1.0)]), decision_key=KEY,
        on_untrusted=m.observe_untrusted,
    )
    m.registry.collectors.append(lambda: m.set_view(*v.stats()))
    pod = {
        "metadata": {"name": "p", "namespace": "t", "uid": "u1",
                     "annotations": {"gpu-share.vendor.com/decision": "forged"}},
        "spec": {"nodeName": "n1", "containers": [
            {"name": "c", "resources": {"limits": {MEM: "4", CORE: "30"}}}]},
        "status": {"phase": "Running"},
    }
    v._apply("pods", "ADDED", pod)
    assert sum(v.untrusted.values()) == 1
    text = m.render().decode()
    (reason,) = v.untrusted
    assert f'gpu_share_extender_untrusted_annotations_total{{reason="{reason}"}} 1.0' in text
    assert "gpu_share_extender_view_pods 1.0" in text
    assert "gpu_share_extender_view_nodes 0.0" in text
    assert 'gpu_share_extender_view_lists_total{watch="nodes"} 0.0' in text


# ---- the metrics listener --------------------------------------------------------------


def test_metrics_listener_serves_get_metrics_only(served: Served) -> None:
    url, m, _, _ = served
    post_raw(url + "/filter", json.dumps({"Pod": kpod(4, 30), "NodeNames": ["a"]}).encode())
    handle = start_http(m.registry, bind_address="127.0.0.1", port=0)
    base = f"http://127.0.0.1:{handle.port}"
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            assert r.headers["Content-Type"] == CONTENT_TYPE_LATEST
            text = r.read().decode()
        assert 'gpu_share_extender_requests_total{outcome="ok",verb="filter"} 1.0' in text
        with urllib.request.urlopen(base + "/healthz", timeout=10) as r:
            assert r.status == 200
        for path, data in (("/filter", b"{}"), ("/metrics", b"x")):
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(urllib.request.Request(base + path, data), timeout=10)
            assert info.value.code == 405, path  # no POST handler at all: read-only
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + "/filter", timeout=10)
        assert info.value.code == 404
    finally:
        handle.stop()
    # nothing sent to the metrics listener was counted as a scheduler request
    assert counted(m) == {("filter", "ok"): 1}


def test_cli_metrics_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_SHARE_EXTENDER_METRICS_PORT", raising=False)
    monkeypatch.delenv("GPU_SHARE_EXTENDER_METRICS_BIND", raising=False)
    a = extender_main.parse_args([])
    assert (a.metrics_port, a.metrics_bind) == (0, "0.0.0.0")
    assert extender_main._metrics_listener(a, ExtenderMetrics(), FakeKubeView()) is None  # type: ignore[arg-type]
    monkeypatch.setenv("GPU_SHARE_EXTENDER_METRICS_PORT", "9402")
    assert extender_main.parse_args([]).metrics_port == 9402
    for bad in ("70000", "-1", "x"):
        with pytest.raises(SystemExit) as info:
            extender_main.parse_args(["--metrics-port", bad])
        assert info.value.code == 2


class FakeKubeView:
    loops = None


def test_cli_metrics_listener_is_bounded_and_serves_the_registry() -> None:
    a = extender_main.parse_args(["--metrics-port", "9402", "--metrics-bind", "127.0.0.1"])
    m = ExtenderMetrics()
    m.observe_request("bind", "ok", 0.01)
    handle = start_http(m.registry, bind_address="127.0.0.1", port=0)
    try:
        a.metrics_port = handle.port
        # the port is taken: the CLI reports it (main exits 1), nothing half-started
        with pytest.raises(OSError):
            extender_main._metrics_listener(a, m, FakeKubeView())  # type: ignore[arg-type]
    finally:
        handle.stop()
    assert AGENT_LIMITS.max_connections <= 64 and AGENT_LIMITS.workers <= 4
    a.metrics_port = _free_port()
    got = extender_main._metrics_listener(a, m, FakeKubeView())  # type: ignore[arg-type]
    assert got is not None
    try:
        assert got._server.limits == AGENT_LIMITS  # the agent's bounded /metrics server
        with urllib.request.urlopen(f"http://127.0.0.1:{got.port}/metrics", timeout=10) as r:
            assert b'gpu_share_extender_requests_total{outcome="ok",verb="bind"} 1.0' in r.read()
    finally:
        got.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

