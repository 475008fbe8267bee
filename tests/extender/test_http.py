"""The extender over real HTTP on 127.0.0.1, against a fake view and binder."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from gpu_share.extender.core import Extender, ExtenderSettings
from gpu_share.extender.http import make_server
from gpu_share.extender.ports import Binder, ClusterView
from gpu_share.observability.http import BoundedServer
from gpu_share.sharing.decision import decision_key, verify
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRequest,
    ContainerView,
    PodView,
    ResourceNames,
)
from gpu_share.sharing.placement import DeviceSlot, NodeSlots, Shape, Workload, make_policy

KEY = b"secret-key-for-tests"
MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"


class FakeView:
    def __init__(self) -> None:
        self.slots = {
            # a: one device with 8 units / 40 cores free; b: idle 16-unit devices.
            "a": NodeSlots("a", (DeviceSlot("GPU-a0", 0, 16, 8, 100, 40),)),
            "b": NodeSlots(
                "b",
                (
                    DeviceSlot("GPU-b0", 0, 16, 16, 100, 100),
                    DeviceSlot("GPU-b1", 1, 16, 16, 100, 100),
                ),
            ),
        }
        self.reserved: list[tuple[str, str, dict[str, tuple[int, int]]]] = []

    def nodes(self, names: Sequence[str]) -> dict[str, NodeSlots | None]:
        return {n: self.node(n) for n in names}

    def node(self, name: str) -> NodeSlots | None:
        return self.slots.get(name)

    def workload(self) -> Workload:
        return Workload([Shape(4, 30, 1.0), Shape(16, 100, 1.0)])

    def reserve(self, pod_uid: str, node: str, shares: Mapping[str, tuple[int, int]]) -> None:
        self.reserved.append((pod_uid, node, dict(shares)))

    def unreserve(self, pod_uid: str, node: str) -> None:
        self.reserved = [r for r in self.reserved if r[:2] != (pod_uid, node)]

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None


class FakeBinder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.annotations: dict[str, str] = {}

    def annotate_and_bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        self.annotations.update(annotations)
        self.calls.append(("annotate", namespace, name, uid))
        self.calls.append(("bind", namespace, name, node))


def kpod(mem: int, cores: int, uid: str = "uid-1") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": uid},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": {MEM: str(mem), CORE: str(cores)}}},
                {"name": "plain", "resources": {"requests": {"cpu": "1"}}},
            ]
        },
    }


def fgd_extender(view: ClusterView, binder: Binder, **kw: Any) -> Extender:
    """The extender of these tests (vendor.com resources, KEY) on ``view`` and ``binder``,
    placing with the fgd policy over the view's workload; ``kw``: Extender's clock and
    on_bind."""
    return Extender(
        ExtenderSettings(ResourceNames(MEM, CORE), "vendor.com", KEY),
        view,
        binder,
        lambda v: make_policy("fgd", v.workload()),
        **kw,
    )


@pytest.fixture
def served() -> Iterator[tuple[str, FakeView, FakeBinder]]:
    view, binder = FakeView(), FakeBinder()
    ext = fgd_extender(view, binder, clock=lambda: 1_700_000_000.0)
    with serving(make_server(ext, "127.0.0.1", 0)) as url:
        yield url, view, binder


@contextlib.contextmanager
def serving(server: BoundedServer) -> Iterator[str]:
    """``server`` serving in a thread (polling every 50 ms): its base URL; shut down and
    closed afterwards."""
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        t.join(timeout=5)


def post(url: str, body: object) -> Any:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def post_raw(url: str, body: bytes) -> tuple[int, Any]:
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_filter_removes_nodes_without_a_single_fitting_device(served: Any) -> None:
    url, _, _ = served
    got = post(url + "/filter", {"Pod": kpod(12, 30), "NodeNames": ["a", "b", "zz"]})
    assert got["NodeNames"] == ["b"]
    assert "no single device fits" in got["FailedNodes"]["a"]
    assert "largest free block is 8 memory units" in got["FailedNodes"]["a"]
    assert "inventory" in got["FailedNodes"]["zz"]
    assert got["Error"] == ""


def test_filter_with_full_node_objects(served: Any) -> None:
    url, _, _ = served
    nodes = {"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}
    got = post(url + "/filter", {"Pod": kpod(4, 30), "Nodes": nodes})
    assert [n["metadata"]["name"] for n in got["Nodes"]["items"]] == ["a", "b"]


def test_prioritize_gives_the_policy_choice_the_top_score(served: Any) -> None:
    url, _, _ = served
    got = post(url + "/prioritize", {"Pod": kpod(4, 30), "NodeNames": ["b", "a"]})
    scores = {h["Host"]: h["Score"] for h in got}
    # Finishing the half-used device of a keeps b's devices whole.
    assert scores == {"a": 10, "b": 9}


def test_pod_without_our_resources_passes_everything(served: Any) -> None:
    url, _, _ = served
    got = post(url + "/filter", {"Pod": kpod(0, 0), "NodeNames": ["a", "b"]})
    assert got["NodeNames"] == ["a", "b"] and got["FailedNodes"] == {}


def test_bind_writes_signed_decision_then_binds(served: Any) -> None:
    url, view, binder = served
    post(url + "/filter", {"Pod": kpod(4, 30), "NodeNames": ["a", "b"]})
    got = post(
        url + "/bind", {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-1", "Node": "b"}
    )
    assert got == {"Error": ""}
    assert [c[0] for c in binder.calls] == ["annotate", "bind"]
    text = binder.annotations[decision_key("vendor.com")]
    pv = PodView(
        "uid-1",
        "ns",
        "p",
        "b",
        (ContainerView("main", ContainerKind.APP, ContainerRequest(4, 30)),),
    )
    d = verify(text, KEY, pv, 1_700_000_010.0, node="b")
    assert d.devices_of("main") == ("GPU-b0",)
    assert view.reserved == [("uid-1", "b", {"GPU-b0": (4, 30)})]


def test_bind_that_no_longer_fits_reports_an_error(served: Any) -> None:
    url, _, binder = served
    post(url + "/filter", {"Pod": kpod(12, 30, uid="u2"), "NodeNames": ["a"]})
    got = post(url + "/bind", {"PodName": "p", "PodNamespace": "ns", "PodUID": "u2", "Node": "a"})
    assert "no single device fits" in got["Error"] and binder.calls == []


def test_bad_requests(served: Any) -> None:
    url, _, _ = served
    req = urllib.request.Request(url + "/filter", b"not json", {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
    with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
        assert r.status == 200


def test_host_cpu_and_memory_count_like_the_replay(served: Any) -> None:
    url, view, _ = served
    gpu = (DeviceSlot("GPU-c0", 0, 16, 16, 100, 100),)
    # c: the GPU fits but only 0.5 CPU is left (the pod's plain container asks 1);
    # d: CPU fits, memory does not.
    view.slots["c"] = NodeSlots("c", gpu, cpu_free=500, host_memory_free=10_000)
    pod = kpod(4, 30)
    pod["spec"]["containers"][1]["resources"]["requests"]["memory"] = "2Gi"
    view.slots["d"] = NodeSlots("d", gpu, cpu_free=8000, host_memory_free=1024)
    view.slots["e"] = NodeSlots("e", gpu, cpu_free=8000, host_memory_free=4096)
    got = post(url + "/filter", {"Pod": pod, "NodeNames": ["c", "d", "e"]})
    assert got["NodeNames"] == ["e"]
    assert "insufficient cpu (500m free, 1000m requested)" in got["FailedNodes"]["c"]
    assert "insufficient memory (1024Mi free, 2048Mi requested)" in got["FailedNodes"]["d"]


def test_unparseable_host_quantity_is_a_bad_request(served: Any) -> None:
    url, _, _ = served
    pod = kpod(4, 30)
    pod["spec"]["containers"][1]["resources"]["requests"]["cpu"] = "lots"
    code, got = post_raw(url + "/filter", json.dumps({"Pod": pod, "NodeNames": ["a"]}).encode())
    assert code == 400
    assert got["Error"] == (
        "Pod.spec.containers[1].resources.requests.cpu: not a quantity: 'lots'"
    )


# -- malformed requests: 400 with a short reason, never 500 ----------

def raw_exchange(url: str, data: bytes, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes; one answer (status, lower-cased headers, body)."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        f = s.makefile("rb")
        code = int(f.readline().split(b" ", 2)[1])
        headers = {k.lower(): v for k, v in http.client.parse_headers(f).items()}
        return code, headers, f.read(int(headers["content-length"]))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"Pod": {}, "NodeNames": [NaN]}', "NaN is not valid JSON"),
        (b'{"Pod": {}, "NodeNames": ["a"], "x": -Infinity}', "-Infinity is not valid JSON"),
        (b'{"Pod": "x", "NodeNames": ["a"]}', "Pod: must be an object, got str"),
        (b'{"Pod": {}, "NodeNames": 5}', "NodeNames: must be a list, got int"),
        (b'{"Pod": {}, "NodeNames": [5]}', "NodeNames[0]: must be a string, got int"),
        (b'{"Pod": {}, "Nodes": {"items": [{}]}}',
         "Nodes.items[0].metadata: is required"),
        (b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": 1}}]}}',
         "Nodes.items[0].metadata.name: must be a string, got int"),
        (b'{"Pod": {}, "Nodes": []}', "Nodes: must be an object, got list"),
        (b'{"Pod": {"spec": {"containers": "x"}}}',
         "Pod.spec.containers: must be a list, got str"),
        (b'{"Pod": {"spec": {"containers": [{"resources": {"limits": []}}]}}}',
         "Pod.spec.containers[0].resources.limits: must be an object, got list"),
        (b'{"Pod": {"spec": {"containers": [{"resources": {"limits": {"cpu": "1e999999999"}}}]}}}',
         "Pod.spec.containers[0].resources.limits.cpu: not a quantity: '1e999999999'"),
        # The one quantity grammar (sharing/quantity.py): "ni" is no suffix, digits are
        # ASCII, an exponent is bounded.
        (b'{"Pod": {"spec": {"containers": [{"resources": {"limits": {"cpu": "1ni"}}}]}}}',
         "Pod.spec.containers[0].resources.limits.cpu: not a quantity: '1ni'"),
        ('{"Pod": {"spec": {"containers": [{"resources": {"limits": {"cpu": "\u0663"}}}]}}}'
         .encode(), "Pod.spec.containers[0].resources.limits.cpu: not a quantity"),
        (b'{"Pod": {"spec": {"containers": [{"resources": {"limits": {"cpu": "1e41"}}}]}}}',
         "Pod.spec.containers[0].resources.limits.cpu: not a quantity: '1e41'"),
        (b'{"Pod": {"metadata": {"uid": 7}}}', "Pod.metadata.uid: must be a string, got int"),
        (b'{"Pod": {"metadata": []}}', "Pod.metadata: must be an object, got list"),
        (b"[]", "body: must be an object, got list"),
        (b"\xff\xfe{}", "body is not UTF-8"),
        (b"[" * 100_000, "JSON nested too deeply"),
        # A node object is answered back whole: its nesting is bounded (a pod's is not
        # echoed, only the parser bounds it).
        (b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "n"}, "x": '
         + b"[" * 64 + b"]" * 64 + b"}]}}", "Nodes.items[0]: nested deeper than 64 levels"),
        (b'{"Pod": {}, "NodeNames": [1' + b"0" * 5000 + b"]}", "bad JSON: Exceeds the limit"),
        (b"not json", "bad JSON: Expecting value: line 1 column 1 (char 0)"),
        # Unterminated, full of escaped quotes: quadratic for a string-skipping regex.
        (b'"' + b'\\"' * 1_000_000, "bad JSON: Unterminated string starting at"),
    ],
)
def test_malformed_filter_is_400_with_a_reason(served: Any, body: bytes, reason: str) -> None:
    url, _, _ = served
    for route in ("/filter", "/prioritize"):
        code, got = post_raw(url + route, body)
        assert code == 400 and got["Error"].startswith(reason), (route, got)


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ({"PodName": 5, "PodNamespace": "ns", "PodUID": "u", "Node": "a"},
         "PodName: must be a string, got int"),
        ({"PodName": "p", "PodNamespace": "ns", "PodUID": "u"}, "Node: is required"),
        ({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": None},
         "Node: must be a string, got null"),
        ({"PodName": "p", "PodNamespace": ["ns"], "PodUID": "u", "Node": "a"},
         "PodNamespace: must be a string, got list"),
        ({"PodName": "p" * 300, "PodNamespace": "ns", "PodUID": "u", "Node": "a"},
         "PodName: longer than 253 characters"),
    ],
)
def test_malformed_bind_is_400_and_binds_nothing(
    served: Any, args: dict[str, Any], reason: str
) -> None:
    url, _, binder = served
    code, got = post_raw(url + "/bind", json.dumps(args).encode())
    assert code == 400 and got["Error"].startswith(reason) and binder.calls == []


def test_reasons_never_echo_unbounded_input(served: Any) -> None:
    url, _, _ = served
    big = "A" * 1_000_000
    for route, body in [
        ("/filter", {"Pod": {"spec": {"containers": [{"resources": {"limits": {big: big}}}]}}}),
        ("/filter", {"Pod": {}, "NodeNames": [big]}),
        ("/bind", {"PodName": big, "PodNamespace": "ns", "PodUID": "u", "Node": "a"}),
        ("/" + big[:10_000], {}),
    ]:
        code, got = post_raw(url + route, json.dumps(body).encode())
        assert 400 <= code < 500 and len(got["Error"]) <= 300, (route[:20], got["Error"][:80])


def test_unknown_route_is_a_fixed_404(served: Any) -> None:
    url, _, _ = served
    code, got = post_raw(url + "/" + "x" * 5000, b"{}")
    assert (code, got) == (404, {"Error": "no such route"})


def test_a_bug_answers_500_without_its_details(served: Any, caplog: Any) -> None:
    url, view, _ = served

    def broken(name: str) -> None:
        raise RuntimeError("secret internals")

    view.node = broken
    body = json.dumps({"Pod": kpod(4, 30), "NodeNames": ["a"]}).encode()
    code, got = post_raw(url + "/filter", body)
    assert (code, got) == (500, {"Error": "internal error (see the extender log)"})
    assert "secret internals" in caplog.text


def test_body_over_the_cap_is_413_before_it_is_sent(served: Any) -> None:
    # Before: the server read up to 64 MiB per request into memory.
    url, _, _ = served
    code, headers, body = raw_exchange(
        url, b"POST /filter HTTP/1.1\r\nHost: t\r\nContent-Length: 62914560\r\n\r\n"
    )
    assert code == 413 and headers["connection"] == "close"
    assert json.loads(body) == {
        "Error": "body of 62914560 bytes is over the limit of 4194304 bytes"
    }


def test_chunked_body_is_refused_and_not_served_as_a_second_request(served: Any) -> None:
    # Before: no Content-Length was 400 on a kept-alive connection, and the chunk data,
    # a whole /bind request here, was then served as the next request.
    url, _, binder = served
    bind = json.dumps({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "a"})
    inner = (f"POST /bind HTTP/1.1\r\nHost: t\r\nContent-Length: {len(bind)}\r\n\r\n"
             f"{bind}").encode()
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /filter HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                  + f"{len(inner):x}\r\n".encode() + inner + b"\r\n0\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 411 ") and data.count(b"HTTP/1.1") == 1
    assert binder.calls == []


def test_post_without_content_length_is_411(served: Any) -> None:
    url, _, _ = served
    code, headers, _ = raw_exchange(url, b"POST /filter HTTP/1.1\r\nHost: t\r\n\r\n")
    assert code == 411 and headers["connection"] == "close"


def test_healthz_names_a_stalled_cluster_view_loop() -> None:
    """The extender's probes follow its cluster view's watch loops: a loop that stopped
    beating turns /healthz and /readyz to 503 naming it (before: always 200)."""
    from gpu_share.observability.loops import LoopSupervisor

    now = [0.0]
    loops = LoopSupervisor(clock=lambda: now[0])
    loops.register("watch-pods", max_age_s=60.0)
    view = FakeView()
    ext = fgd_extender(view, FakeBinder())
    with serving(make_server(ext, "127.0.0.1", 0, liveness=loops.check)) as url:
        for path in ("/healthz", "/readyz"):
            with urllib.request.urlopen(url + path, timeout=10) as r:
                assert r.status == 200
        now[0] = 120.0
        for path in ("/healthz", "/readyz"):
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(url + path, timeout=10)
            assert info.value.code == 503
            assert "watch-pods" in json.loads(info.value.read())["status"]
