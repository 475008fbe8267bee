from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kube_fakes import Call, FakeStream, fake_rest, pod_obj, status_obj

from gpu_share.config.model import ResourcesConfig
from gpu_share.errors import KubeAccessError
from gpu_share.kube.pods import KubePodSource, NodePodCache, pod_view_from_dict
from gpu_share.kube.rest import KubeTimeouts
from gpu_share.sharing.model import ContainerKind, ContainerRequest
from testkit.harness.wait import poll

MEM = "vendor.com/vcuda-memory"
CORE = "vendor.com/vcuda-core"


def res(limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None) -> Any:
    out: dict[str, Any] = {}
    if limits is not None:
        out["limits"] = limits
    if requests is not None:
        out["requests"] = requests
    return out


def source(handler: Any) -> tuple[KubePodSource, Any]:
    api, http = fake_rest(handler)
    return KubePodSource.from_config(api, ResourcesConfig()), http


# ---------------------------------------------------------------- conversion


def test_conversion_orders_init_sidecar_then_app_and_reads_requests() -> None:
    obj = pod_obj(
        "p",
        init=[
            {"name": "setup", "resources": res({MEM: "2", CORE: "10"})},
            {"name": "proxy", "restartPolicy": "Always", "resources": res(requests={MEM: 1})},
            {"name": "plain"},
        ],
        app=[
            {"name": "b", "resources": res({MEM: "4"}, {CORE: "30"})},
            {"name": "a", "resources": res({"cpu": "1", "memory": "1Gi"})},
        ],
        annotations={"k": "v"},
        deleting=True,
        phase="Running",
    )
    view = pod_view_from_dict(obj, memory_resource=MEM, core_resource=CORE)
    assert [(c.name, c.kind) for c in view.containers] == [
        ("setup", ContainerKind.INIT),
        ("proxy", ContainerKind.SIDECAR),
        ("plain", ContainerKind.INIT),
        ("b", ContainerKind.APP),
        ("a", ContainerKind.APP),
    ]
    assert [c.request for c in view.containers] == [
        ContainerRequest(2, 10),
        ContainerRequest(1, 0),
        ContainerRequest(0, 0),
        ContainerRequest(4, 30),  # limits for memory, requests fallback for cores
        ContainerRequest(0, 0),
    ]
    assert (view.uid, view.namespace, view.name, view.node_name) == ("uid-p", "ns", "p", "node-a")
    assert view.phase == "Running"
    assert view.deleted is True
    assert dict(view.annotations) == {"k": "v"}
    assert view.created_at == 1714557600.0


def test_limits_win_over_requests_and_bad_quantities_count_as_zero() -> None:
    obj = pod_obj(
        "p",
        app=[
            {"name": "x", "resources": res({MEM: "3"}, {MEM: "5", CORE: "1k"})},
            {"name": "y", "resources": res({MEM: "1.5", CORE: "junk"})},
            {"name": "z", "resources": res({MEM: "-2"})},
        ],
    )
    view = pod_view_from_dict(obj, memory_resource=MEM, core_resource=CORE)
    assert [c.request for c in view.containers] == [
        ContainerRequest(3, 1000),
        ContainerRequest(0, 0),
        ContainerRequest(0, 0),
    ]


def test_custom_resource_names_and_empty_pod() -> None:
    rc = ResourcesConfig(domain="example.org", memory_name="npu-mem", core_name="npu-core")
    obj = pod_obj("p", app=[{"name": "c", "resources": res({"example.org/npu-mem": "7"})}])
    view = pod_view_from_dict(
        obj, memory_resource=rc.memory_resource, core_resource=rc.core_resource
    )
    assert view.containers[0].request == ContainerRequest(7, 0)
    bare = pod_view_from_dict({}, memory_resource=MEM, core_resource=CORE)
    assert bare.containers == () and bare.phase == "Pending" and bare.created_at == 0.0


def test_conversion_of_a_sidecar_and_an_app_container() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {
            "nodeName": "n",
            "initContainers": [{"name": "side", "restartPolicy": "Always"}],
            "containers": [{"name": "c", "resources": {"limits": {MEM: "2", CORE: "50"}}}],
        },
    }
    view = pod_view_from_dict(pod, memory_resource=MEM, core_resource=CORE)
    assert [(c.name, c.kind, c.request) for c in view.containers] == [
        ("side", ContainerKind.SIDECAR, ContainerRequest(0, 0)),
        ("c", ContainerKind.APP, ContainerRequest(2, 50)),
    ]


names = st.lists(st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True), max_size=5, unique=True)


@given(
    init=names,
    app=names,
    sidecar=st.lists(st.booleans(), min_size=5, max_size=5),
    amounts=st.lists(st.integers(0, 1000), min_size=10, max_size=10),
)
def test_order_and_amounts_survive_any_spec(
    init: list[str], app: list[str], sidecar: list[bool], amounts: list[int]
) -> None:
    init_c = [
        {
            "name": n,
            "resources": res({MEM: str(amounts[i])}),
            **({"restartPolicy": "Always"} if sidecar[i] else {}),
        }
        for i, n in enumerate(init)
    ]
    app_c = [
        {"name": n, "resources": res(requests={CORE: amounts[5 + i]})} for i, n in enumerate(app)
    ]
    view = pod_view_from_dict(
        pod_obj("p", init=init_c, app=app_c), memory_resource=MEM, core_resource=CORE
    )
    assert [c.name for c in view.containers] == init + app
    for i, c in enumerate(view.containers[: len(init)]):
        assert c.kind is (ContainerKind.SIDECAR if sidecar[i] else ContainerKind.INIT)
        assert c.request == ContainerRequest(amounts[i], 0)
    for i, c in enumerate(view.containers[len(init) :]):
        assert c.kind is ContainerKind.APP
        assert c.request == ContainerRequest(0, amounts[5 + i])


# ---------------------------------------------------------------- KubePodSource


def test_get_pod_reads_one_pod_with_timeout() -> None:
    src, http = source(lambda call: (200, pod_obj("p")))
    view = src.get_pod("ns", "p")
    assert view is not None and view.name == "p"
    (call,) = http.calls
    assert (call.method, call.path) == ("GET", "/api/v1/namespaces/ns/pods/p")
    # Every request is bounded (the timeouts themselves: tests/kube/test_rest.py).
    assert src._api.t == KubeTimeouts(connect=5.0, read=15.0)
    fast = KubePodSource.from_config(src._api, ResourcesConfig(),
                                     timeouts=KubeTimeouts(connect=1.0, read=2.0))
    assert fast._api.t == KubeTimeouts(connect=1.0, read=2.0) and src._api.t.read == 15.0


def test_get_pod_404_is_none() -> None:
    src, _ = source(lambda call: (404, status_obj(404)))
    assert src.get_pod("ns", "gone") is None


@pytest.mark.parametrize("status", [403, 500, 503])
def test_get_pod_errors_raise_kube_access_error_naming_the_op(status: int) -> None:
    src, _ = source(lambda call: (status, status_obj(status, "X", "denied for reasons")))
    with pytest.raises(KubeAccessError) as ei:
        src.get_pod("ns", "p")
    assert "get pod ns/p" in str(ei.value) and str(status) in str(ei.value)
    assert "denied for reasons" in str(ei.value)
    assert ei.value.reason == ("KubeForbidden" if status == 403 else "KubeUnreachable")


def test_transport_error_raises_kube_access_error() -> None:
    def boom(call: Call) -> Any:
        return (0, ConnectionResetError("dropped"))  # the server drops the connection

    src, _ = source(boom)
    with pytest.raises(KubeAccessError, match="list pods of node n1"):
        src.list_node_pods("n1")


def test_undecodable_answer_is_kube_access_error() -> None:
    src, _ = source(lambda c: (200, b"<html>"))
    with pytest.raises(KubeAccessError, match="undecodable"):
        src.get_pod("ns", "p")


def test_list_node_pods_uses_field_selector_and_follows_pages() -> None:
    def handler(call: Call) -> Any:
        if call.query.get("continue") == "tok":
            return 200, {"metadata": {"resourceVersion": "9"}, "items": [pod_obj("b")]}
        return 200, {
            "metadata": {"resourceVersion": "8", "continue": "tok"},
            "items": [pod_obj("a")],
        }

    src, http = source(handler)
    assert [p.name for p in src.list_node_pods("node-a")] == ["a", "b"]
    assert [c.path for c in http.calls] == ["/api/v1/pods", "/api/v1/pods"]
    assert all(c.query["fieldSelector"] == "spec.nodeName=node-a" for c in http.calls)
    assert "watch" not in http.calls[0].query
    _, rv = src.list_node_pod_objects("node-a")
    assert rv == "9"


# ---------------------------------------------------------------- NodePodCache


def test_cache_applies_watch_events() -> None:
    # (resourceVersions, bookmarks and ERROR events: tests/kube/test_listwatch.py)
    src, _ = source(lambda call: (404, status_obj(404)))
    cache = NodePodCache(src, "node-a")
    cache._apply("ADDED", pod_obj("a", rv="11"))
    cache._apply("MODIFIED", pod_obj("a", rv="12", phase="Running"))
    assert cache._pods[("ns", "a")].phase == "Running"
    # A DELETED of an older incarnation (other uid) leaves the newer one in place.
    cache._apply("DELETED", pod_obj("a", uid="old", rv="13"))
    assert ("ns", "a") in cache._pods
    cache._apply("DELETED", pod_obj("a", rv="21"))
    assert cache._pods == {}
    # Bounded: pods of other nodes and annotations not gpu-share's stay out.
    cache._apply("ADDED", pod_obj("elsewhere", node="node-b"))
    cache._apply("ADDED", pod_obj("b", annotations={"gpu-share.vendor.com/decision": "d",
                                                    "tenant/blob": "x" * 1000}))
    assert list(cache._pods) == [("ns", "b")]
    assert dict(cache._pods[("ns", "b")].annotations) == {"gpu-share.vendor.com/decision": "d"}



def test_cache_lists_watches_relists_on_410_and_stops() -> None:
    lists = {"n": 0}
    watches: list[FakeStream] = []
    lock = threading.Lock()

    def handler(call: Call) -> Any:
        with lock:
            if call.path == "/api/v1/pods" and call.query.get("watch") == "true":
                if not watches:
                    s = FakeStream(
                        [
                            {"type": "ADDED", "object": pod_obj("b", rv="11")},
                            {"type": "ERROR", "object": status_obj(410, "Expired", "old")},
                        ]
                    )
                else:
                    s = FakeStream(block=True)
                watches.append(s)
                return s
            if call.path == "/api/v1/pods":
                lists["n"] += 1
                items = [pod_obj("a")] if lists["n"] == 1 else [pod_obj("a"), pod_obj("c")]
                return 200, {"metadata": {"resourceVersion": str(10 * lists["n"])}, "items": items}
            if call.path == "/api/v1/namespaces/ns/pods/x":
                return 200, pod_obj("x")
            return 404, status_obj(404)

    src, http = source(handler)
    cache = NodePodCache(src, "node-a", backoff_s=(0.01, 0.05))
    cache.start()
    try:
        assert cache.wait_synced(10)
        assert poll(lambda: len(watches) >= 2 and cache.relists == 2)
        assert sorted(p.name for p in cache.list_node_pods("node-a")) == ["a", "c"]
        watch_calls = [c for c in http.calls if c.query.get("watch") == "true"]
        assert [c.query["resourceVersion"] for c in watch_calls[:2]] == ["10", "20"]
        assert all(c.query["allowWatchBookmarks"] == "true" for c in watch_calls)
        assert all(c.query["fieldSelector"] == "spec.nodeName=node-a" for c in watch_calls)
        n = len(http.calls)
        assert cache.get_pod("ns", "a") is not None
        assert len(http.calls) == n  # served from memory
        x = cache.get_pod("ns", "x")  # miss: one GET, then cached
        assert x is not None and len(http.calls) == n + 1
        assert cache.get_pod("ns", "x") == x and len(http.calls) == n + 1
        # Live event through the open watch.
        watches[-1].feed({"type": "ADDED", "object": pod_obj("d", rv="21")})
        assert poll(lambda: any(p.name == "d" for p in cache.list_node_pods("node-a")))
        # Another node's list is not served from this cache.
        cache.list_node_pods("node-b")
        assert http.calls[-1].query["fieldSelector"] == "spec.nodeName=node-b"
    finally:
        cache.stop(timeout=5)
    assert cache._watch.thread is not None and not cache._watch.thread.is_alive()
    assert poll(watches[-1].shut.is_set, 5)  # the server saw the watch closed
    assert not cache.synced


def test_cache_retries_after_errors_with_backoff_and_serves_gets_meanwhile() -> None:
    def handler(call: Call) -> Any:
        if call.path == "/api/v1/pods":
            return 500, status_obj(500, "Internal", "etcd down")
        return 200, pod_obj("p")

    src, http = source(handler)
    cache = NodePodCache(src, "node-a", backoff_s=(0.01, 0.02))
    cache.start()
    try:
        assert poll(lambda: sum(c.path == "/api/v1/pods" for c in http.calls) >= 3)
        assert not cache.synced
        assert cache.get_pod("ns", "p") is not None  # falls back to GET
        with pytest.raises(KubeAccessError):
            cache.list_node_pods("node-a")  # unhealthy: direct list, which fails
    finally:
        cache.stop(timeout=5)
    assert cache._watch.thread is not None and not cache._watch.thread.is_alive()


def test_cache_refetches_terminating_pod() -> None:
    src, http = source(lambda call: (200, pod_obj("s", uid="new")))
    cache = NodePodCache(src, "node-a")
    cache._replace([])  # synced, empty
    cache._watch.synced.set()
    cache._apply("MODIFIED", pod_obj("s", uid="old", deleting=True))
    assert cache.get("ns", "s") is None and http.calls == []  # never the network
    got = cache.get_pod("ns", "s")
    assert got is not None and got.uid == "new" and len(http.calls) == 1
    assert cache._pods[("ns", "s")].uid == "new"


def test_cache_start_twice_is_an_error() -> None:
    src, _ = source(
        lambda call: (
            FakeStream(block=True)
            if call.query.get("watch")
            else (200, {"metadata": {"resourceVersion": "1"}, "items": []})
        )
    )
    cache = NodePodCache(src, "node-a")
    cache.start()
    try:
        with pytest.raises(RuntimeError):
            cache.start()
    finally:
        cache.stop()


def test_get_never_calls_the_api_and_fetch_is_the_fresh_read() -> None:
    answers = {"p": (200, pod_obj("p")), "q": (200, pod_obj("q", node="node-b"))}
    missing = (404, status_obj(404))
    src, http = source(lambda call: answers.get(call.path.rsplit("/", 1)[1], missing))
    cache = NodePodCache(src, "node-a")
    cache._apply("ADDED", pod_obj("p"))
    assert cache.get("ns", "p") is None  # not synced: memory is not trusted yet
    cache._watch.synced.set()
    assert cache.get("ns", "p") is not None and cache.get("ns", "x") is None
    assert http.calls == []
    # A fresh read: kept when the pod is on this node, dropped on 404 or another node.
    assert cache.fetch("ns", "q") is not None and ("ns", "q") not in cache._pods
    answers.pop("p")
    assert cache.fetch("ns", "p") is None and cache.get("ns", "p") is None
    assert len(http.calls) == 2
