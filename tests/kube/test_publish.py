from __future__ import annotations

from typing import Any

import pytest
from kube_fakes import Call, fake_rest, pod_obj, status_obj

from gpu_share.errors import KubeAccessError
from gpu_share.kube.publish import KubePublisher


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def publisher(handler: Any, **kw: Any) -> tuple[KubePublisher, Any, Clock]:
    api, http = fake_rest(handler)
    clock = Clock()
    pub = KubePublisher(api, host_node="node-a", clock=clock, wall_clock=lambda: 1714557600.0, **kw)
    return pub, http, clock


def ok(call: Call) -> Any:
    if call.method == "GET" and "/pods/" in call.path:
        return 200, pod_obj("p", uid="pod-uid")
    return 200, {}


def test_annotate_node_sends_strategic_merge_patch_with_null_deletes() -> None:
    pub, http, _ = publisher(ok)
    pub.annotate_node("node-a", {"vendor.com/inventory": "{}", "vendor.com/old": None})
    (call,) = http.calls
    assert (call.method, call.path) == ("PATCH", "/api/v1/nodes/node-a")
    assert call.headers["Content-Type"] == "application/strategic-merge-patch+json"
    assert call.body == {
        "metadata": {"annotations": {"vendor.com/inventory": "{}", "vendor.com/old": None}}
    }


def test_node_labels_go_in_the_same_patch() -> None:
    pub, http, _ = publisher(ok)
    pub.annotate_node("node-a", {"vendor.com/inventory": "{}"},
                      {"gpu-share.vendor.com/enforcement": None})
    (call,) = http.calls
    assert call.body == {"metadata": {
        "annotations": {"vendor.com/inventory": "{}"},
        "labels": {"gpu-share.vendor.com/enforcement": None}}}


def test_annotate_pod_patches_pod_and_empty_mapping_is_no_call() -> None:
    pub, http, _ = publisher(ok)
    pub.annotate_pod("ns", "p", {})
    assert http.calls == []
    pub.annotate_pod("ns", "p", {"vendor.com/assigned": "GPU-1"})
    (call,) = http.calls
    assert (call.method, call.path) == ("PATCH", "/api/v1/namespaces/ns/pods/p")
    assert call.body == {"metadata": {"annotations": {"vendor.com/assigned": "GPU-1"}}}


@pytest.mark.parametrize("status", [403, 404, 500])
def test_write_failures_are_counted_and_reported_never_raised(status: int) -> None:
    seen: list[tuple[str, BaseException]] = []
    pub, _, _ = publisher(
        lambda c: (status, status_obj(status, "X", "no")),
        on_error=lambda kind, e: seen.append((kind, e)),
    )
    assert pub.annotate_node("node-a", {"a": "b"}) is False  # written again later
    # A pod that is gone (404) has nothing left to annotate: done, not a failure.
    assert pub.annotate_pod("ns", "p", {"a": "b"}) is (status == 404)
    pub.node_event("node-a", reason="R", message="m", warning=True)
    pod_failed = 0 if status == 404 else 1
    assert dict(pub.failures) == {
        k: v for k, v in {"annotate_node": 1, "annotate_pod": pod_failed, "event": 1}.items() if v
    }
    assert [k for k, _ in seen] == ["annotate_node", *["annotate_pod"] * pod_failed, "event"]
    assert all(isinstance(e, KubeAccessError) for _, e in seen)
    assert "annotate node node-a" in str(seen[0][1])


def test_broken_on_error_hook_does_not_raise() -> None:
    def hook(kind: str, e: BaseException) -> None:
        raise RuntimeError("hook")

    pub, _, _ = publisher(lambda c: (500, status_obj(500)), on_error=hook)
    pub.annotate_node("node-a", {"a": "b"})
    assert pub.failures["annotate_node"] == 1


def test_pod_event_looks_up_uid_and_fills_the_event() -> None:
    pub, http, _ = publisher(ok)
    pub.pod_event("ns", "p", reason="NoFit", message="no device fits", warning=True)
    get, post = http.calls
    assert (get.method, get.path) == ("GET", "/api/v1/namespaces/ns/pods/p")
    assert (post.method, post.path) == ("POST", "/api/v1/namespaces/ns/events")
    ev = post.body
    assert ev["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ns",
        "name": "p",
        "uid": "pod-uid",
    }
    assert ev["metadata"]["namespace"] == "ns" and ev["metadata"]["name"].startswith("p.")
    assert (ev["reason"], ev["message"], ev["type"], ev["count"]) == (
        "NoFit",
        "no device fits",
        "Warning",
        1,
    )
    assert ev["source"] == {"component": "gpu-share-plugin", "host": "node-a"}
    assert ev["reportingComponent"] == "gpu-share-plugin"
    assert ev["reportingInstance"] == "node-a"
    assert ev["firstTimestamp"].startswith("2024-05-01T10:00:00")


def test_pod_event_with_known_uid_needs_no_lookup_and_unknown_pod_still_gets_event() -> None:
    pub, http, _ = publisher(ok)
    pub.pod_event("ns", "p", reason="R", message="m", warning=False, uid="given")
    (post,) = http.calls
    assert post.body["involvedObject"]["uid"] == "given" and post.body["type"] == "Normal"

    def no_pod(call: Call) -> Any:
        return (404, status_obj(404)) if call.method == "GET" else (201, {})

    pub2, http2, _ = publisher(no_pod)
    pub2.pod_event("ns", "gone", reason="R", message="m", warning=True)
    assert "uid" not in http2.calls[-1].body["involvedObject"]
    assert pub2.failures == {}


def test_node_event_goes_to_default_namespace_with_node_name_uid() -> None:
    pub, http, _ = publisher(ok)
    pub.node_event("node-a", reason="Degraded", message="NVML down", warning=True)
    (post,) = http.calls
    assert post.path == "/api/v1/namespaces/default/events"
    assert post.body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "node-a",
        "uid": "node-a",
    }


def test_identical_events_in_window_are_aggregated_by_count_patch() -> None:
    pub, http, clock = publisher(ok)
    for _ in range(3):
        pub.node_event("node-a", reason="R", message="m", warning=True)
        clock.t += 10
    post, patch1, patch2 = http.calls
    assert post.method == "POST"
    name = post.body["metadata"]["name"]
    assert (patch1.method, patch1.path) == ("PATCH", f"/api/v1/namespaces/default/events/{name}")
    assert patch1.body["count"] == 2 and patch2.body["count"] == 3
    assert "lastTimestamp" in patch2.body
    # Other message: its own event. After the window: a new event.
    pub.node_event("node-a", reason="R", message="other", warning=True)
    assert http.calls[-1].method == "POST"
    clock.t += 60
    pub.node_event("node-a", reason="R", message="m", warning=True)
    assert http.calls[-1].method == "POST"
    assert pub.failures == {}


def test_aggregated_event_that_vanished_is_recreated() -> None:
    def handler(call: Call) -> Any:
        if call.method == "PATCH":
            return 404, status_obj(404)
        return 201, {}

    pub, http, _ = publisher(handler)
    pub.node_event("node-a", reason="R", message="m", warning=True)
    pub.node_event("node-a", reason="R", message="m", warning=True)
    assert [c.method for c in http.calls] == ["POST", "PATCH", "POST"]
    assert http.calls[-1].body["count"] == 1
    assert pub.failures == {}


def test_tracked_events_are_bounded() -> None:
    pub, _, _ = publisher(ok, max_tracked_events=3)
    for i in range(10):
        pub.node_event("node-a", reason="R", message=f"m{i}", warning=True)
    assert len(pub._sent) == 3


def test_long_messages_are_truncated() -> None:
    pub, http, _ = publisher(ok)
    pub.node_event("node-a", reason="R", message="x" * 5000, warning=True)
    assert len(http.calls[-1].body["message"]) == 1024


def test_node_annotations_read() -> None:
    node = {"metadata": {"name": "node-a", "annotations": {"a": "1"}}}
    pub, http, _ = publisher(lambda c: (200, node))
    assert pub.node_annotations("node-a") == {"a": "1"}
    assert http.calls[0].path == "/api/v1/nodes/node-a"
    pub404, _, _ = publisher(lambda c: (404, status_obj(404)))
    assert pub404.node_annotations("x") is None
    pub500, _, _ = publisher(lambda c: (500, status_obj(500)))
    with pytest.raises(KubeAccessError, match="get node x"):
        pub500.node_annotations("x")
