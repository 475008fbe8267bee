"""kube.resourceslices against a fake API server holding ResourceSlices in memory."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
from kube_fakes import Call, fake_rest, status_obj

from gpu_share.devices.base import Device
from gpu_share.kube.rbac import DRA_AGENT_RULES
from gpu_share.kube.resourceslices import (
    RESOURCE_SLICES,
    PublishAction,
    ResourceSliceError,
    ResourceSlicePublisher,
)
from gpu_share.kube.rest import KubeTimeouts
from gpu_share.sharing.dra.slices import SliceContent, digest_annotation, slice_content
from gpu_share.sharing.inventory import Inventory
from tests.chart.conftest import k8s_validator

NODE = "node-a"
DRIVER = "gpu-share.vendor.com"


def content(n: int = 2, *, unhealthy: tuple[int, ...] = (), node: str = NODE) -> SliceContent:
    devices = [
        Device(uuid=f"GPU-{i}", index=i, minor=i, memory_mib=8192, model="T4",
               healthy=i not in unhealthy)
        for i in range(n)
    ]
    return slice_content(Inventory.from_devices(devices, 1024), node_name=node, driver=DRIVER,
                         driver_version="550")


class Store:
    """The slices an API server holds; ``fail`` answers the next calls of a method."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.rv = itertools.count(100)
        self.suffix = itertools.count()
        self.fail: dict[str, list[Any]] = {}  # (status, body), or a callable giving one
        self.lock = threading.Lock()

    def add(self, name: str, *, node: str = NODE, driver: str = DRIVER, pool: str = NODE,
            generation: int = 1, digest: str = "old") -> None:
        self.slices[name] = {
            "metadata": {"name": name, "resourceVersion": str(next(self.rv)),
                         "annotations": {digest_annotation(DRIVER): digest}},
            "spec": {"driver": driver, "nodeName": node, "devices": [],
                     "pool": {"name": pool, "generation": generation,
                              "resourceSliceCount": 1}},
        }

    def handler(self, call: Call) -> Any:
        with self.lock:
            queued = self.fail.get(call.method)
            if queued:
                answer = queued.pop(0)
                return answer() if callable(answer) else answer
            return self._serve(call)

    def _serve(self, call: Call) -> Any:
        name = call.path.removeprefix(RESOURCE_SLICES).strip("/")
        if call.method == "GET" and not name:
            sel = dict(kv.split("=", 1) for kv in call.query["fieldSelector"].split(","))
            items = [s for s in self.slices.values()
                     if s["spec"]["nodeName"] == sel["spec.nodeName"]
                     and s["spec"]["driver"] == sel["spec.driver"]]
            return 200, {"metadata": {}, "items": items}
        if call.method == "POST":
            obj = call.body
            obj["metadata"]["name"] = obj["metadata"].pop("generateName") + f"x{next(self.suffix)}"
            obj["metadata"]["resourceVersion"] = str(next(self.rv))
            self.slices[obj["metadata"]["name"]] = obj
            return 201, obj
        if name not in self.slices:
            return 404, status_obj(404)
        if call.method == "PUT":
            if call.body["metadata"]["resourceVersion"] != \
                    self.slices[name]["metadata"]["resourceVersion"]:
                return 409, status_obj(409, "Conflict", "the object has been modified")
            obj = call.body
            obj["metadata"]["resourceVersion"] = str(next(self.rv))
            self.slices[name] = obj
            return 200, obj
        if call.method == "DELETE":
            return 200, self.slices.pop(name)
        return 200, self.slices[name]


def publisher(store: Store, **kw: Any) -> tuple[ResourceSlicePublisher, Any]:
    api, http = fake_rest(store.handler)
    return ResourceSlicePublisher(api, node_name=NODE, driver=DRIVER, **kw), http


def writes(http: Any) -> list[str]:
    return [c.method for c in http.calls if c.method != "GET"]


def test_first_publish_creates_one_valid_slice() -> None:
    store = Store()
    pub, http = publisher(store)
    res = pub.publish(content())
    assert res.action is PublishAction.CREATED and res.generation == 1
    (obj,) = store.slices.values()
    assert res.name == obj["metadata"]["name"]
    assert obj["metadata"]["name"].startswith("node-a-gpu-share-")
    assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    errors = list(k8s_validator("1.34", "resource.k8s.io/v1", "ResourceSlice").iter_errors(obj))
    assert not errors, [e.message for e in errors]
    (lst, post) = http.calls
    assert (lst.method, lst.path) == ("GET", RESOURCE_SLICES)
    assert lst.query["fieldSelector"] == f"spec.nodeName={NODE},spec.driver={DRIVER}"
    assert (post.method, post.path) == ("POST", RESOURCE_SLICES)


def test_same_content_writes_nothing_a_change_updates_with_a_bumped_generation() -> None:
    store = Store()
    pub, http = publisher(store)
    first = pub.publish(content())
    http.calls.clear()
    again = pub.publish(content())
    assert again.action is PublishAction.UNCHANGED and writes(http) == []
    assert again.generation == 1
    changed = pub.publish(content(unhealthy=(1,)))
    assert changed.action is PublishAction.UPDATED
    assert (changed.name, changed.generation) == (first.name, 2)
    (obj,) = store.slices.values()
    assert [d["name"] for d in obj["spec"]["devices"]] == ["gpu-0"]
    assert obj["spec"]["pool"]["generation"] == 2
    put = next(c for c in http.calls if c.method == "PUT")
    assert put.path == f"{RESOURCE_SLICES}/{first.name}"
    assert put.body["metadata"]["resourceVersion"]  # optimistic concurrency


def test_a_restarted_agent_keeps_an_equal_slice() -> None:
    store = Store()
    c = content()
    store.add("node-a-gpu-share-old", generation=7, digest=c.digest)
    pub, http = publisher(store)
    res = pub.publish(c)
    assert (res.action, res.name, res.generation) == (PublishAction.UNCHANGED,
                                                      "node-a-gpu-share-old", 7)
    assert writes(http) == []


def test_extras_are_deleted_and_the_generation_passes_them_all() -> None:
    store = Store()
    store.add("a", generation=3)
    store.add("b", generation=9)
    store.add("c", pool="foreign-pool", generation=12)
    store.add("other-node", node="node-b", generation=50)  # not ours: untouched
    store.add("other-driver", driver="x.example.com", generation=50)
    pub, _ = publisher(store)
    res = pub.publish(content())
    assert res.action is PublishAction.UPDATED
    assert (res.name, res.generation, res.deleted) == ("a", 13, 2)
    assert sorted(store.slices) == ["a", "other-driver", "other-node"]


def test_generation_stays_monotonic_when_the_slice_was_deleted_behind_our_back() -> None:
    store = Store()
    pub, _ = publisher(store)
    pub.publish(content())
    pub.publish(content(unhealthy=(0,)))
    store.slices.clear()
    res = pub.publish(content())
    assert (res.action, res.generation) == (PublishAction.CREATED, 3)


def test_a_conflict_reads_again_and_retries() -> None:
    store = Store()
    pub, http = publisher(store)
    pub.publish(content())
    store.fail["PUT"] = [(409, status_obj(409, "Conflict", "modified"))]
    res = pub.publish(content(unhealthy=(0,)))
    assert res.action is PublishAction.UPDATED and res.generation == 2
    assert [c.method for c in http.calls][-4:] == ["GET", "PUT", "GET", "PUT"]


def test_a_slice_gone_between_list_and_update_is_created_again() -> None:
    store = Store()
    pub, _ = publisher(store)
    first = pub.publish(content())

    def gone() -> tuple[int, Any]:
        store.slices.clear()  # deleted by someone between our list and our update
        return 404, status_obj(404)

    store.fail["PUT"] = [gone]
    res = pub.publish(content(unhealthy=(0,)))
    assert res.action is PublishAction.CREATED and res.generation == 2
    assert [s["metadata"]["name"] for s in store.slices.values()] != [first.name]


def test_conflicts_without_end_give_a_typed_error() -> None:
    store = Store()
    pub, http = publisher(store, max_attempts=3)
    pub.publish(content())
    store.fail["PUT"] = [(409, status_obj(409, "Conflict", "x"))] * 10
    with pytest.raises(ResourceSliceError) as ei:
        pub.publish(content(unhealthy=(1,)))
    assert ei.value.reason == "ResourceSliceConflict" and ei.value.status == 409
    assert [c.method for c in http.calls].count("PUT") == 3


@pytest.mark.parametrize(("status", "reason"), [(403, "KubeForbidden"), (500, "KubeUnreachable")])
def test_errors_are_typed(status: int, reason: str) -> None:
    store = Store()
    store.fail["GET"] = [(status, status_obj(status, "X", "no"))]
    pub, _ = publisher(store)
    with pytest.raises(ResourceSliceError) as ei:
        pub.publish(content())
    assert (ei.value.status, ei.value.reason) == (status, reason)


def test_transport_failure_is_typed() -> None:
    store = Store()
    store.fail["GET"] = [(0, ConnectionError("drop"))]
    pub, _ = publisher(store, timeouts=KubeTimeouts(connect=1.0, read=2.0))
    with pytest.raises(ResourceSliceError) as ei:
        pub.publish(content())
    assert ei.value.status == 0


def test_remove_all_deletes_every_own_slice_and_tolerates_gone_ones() -> None:
    store = Store()
    store.add("a")
    store.add("b")
    store.add("other-node", node="node-b")
    store.fail["DELETE"] = [(404, status_obj(404))]  # "a" went away meanwhile
    pub, _ = publisher(store)
    assert pub.remove_all() == 1
    assert sorted(store.slices) == ["a", "other-node"]  # the fake kept "a": 404 was faked
    store.slices.pop("a")
    assert pub.remove_all() == 0


def test_content_of_another_node_is_refused() -> None:
    pub, _ = publisher(Store())
    with pytest.raises(ValueError):
        pub.publish(content(node="node-b"))


def test_list_follows_continue_tokens() -> None:
    pages = iter([
        (200, {"metadata": {"continue": "t1"}, "items": [{"metadata": {"name": "b"}}]}),
        (200, {"metadata": {}, "items": [{"metadata": {"name": "a"}}]}),
    ])  # fmt: skip
    api, http = fake_rest(lambda call: next(pages))
    pub = ResourceSlicePublisher(api, node_name=NODE, driver=DRIVER)
    assert [s["metadata"]["name"] for s in pub.list_own()] == ["a", "b"]
    assert http.calls[1].query["continue"] == "t1"


def _rbac(call: Call) -> tuple[str, str, str]:
    group_version = "/apis/resource.k8s.io/v1/"
    assert call.path.startswith(group_version), call.path
    named = "/" in call.path.removeprefix(group_version)
    verb = {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(call.method)
    return ("resource.k8s.io", "resourceslices", verb or ("get" if named else "list"))


def test_every_call_is_granted_by_the_dra_rules() -> None:
    store = Store()
    store.add("extra", pool="other")
    pub, http = publisher(store)
    pub.publish(content())
    pub.publish(content(unhealthy=(0,)))
    pub.remove_all()
    granted = {(g, r, v) for g, r, verbs in DRA_AGENT_RULES for v in verbs}
    used = {_rbac(c) for c in http.calls}
    assert used <= granted
    assert {v for _, _, v in used} == {"list", "create", "update", "delete"}
