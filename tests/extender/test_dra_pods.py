"""DRA pods through the extender: the webhook keeps their vcuda keys at 0, so
kube-scheduler asks the extender about them; the extender reads the slice from the
claims' template names, leaves the fit to kube-scheduler's allocator (filter keeps every
node), ranks nodes by the policy's score of the allocator's first-fit devices, and at
bind records the devices the claims were allocated (else the predicted first fit),
never refusing a pod whose devices are allocated already."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_share.errors import KubeAccessError
from gpu_share.extender.core import Extender, ExtenderSettings
from gpu_share.kube.cluster_view import KubeClusterView
from gpu_share.sharing.annotations import InventoryAnnotation, InventoryDevice, inventory_key
from gpu_share.sharing.decision import decision_key, decode_unverified
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import Shape, Workload, make_policy
from testkit.kube_admin import idle_api

KEY = b"dra-extender-test-key-0123456789"
DOM = "vendor.com"
MEM, CORE = f"{DOM}/vcuda-memory", f"{DOM}/vcuda-core"
DRIVER = "gpu-share.vendor.com"


def _inv(node: str, used: tuple[tuple[int, int], tuple[int, int]]) -> InventoryAnnotation:
    return InventoryAnnotation(node, 1024, tuple(
        InventoryDevice(f"{node}-GPU-{i}", i, "T4", 16, m, 100, c, True, 0)
        for i, (m, c) in enumerate(used)))


def _view(used: Mapping[str, tuple[tuple[int, int], tuple[int, int]]]) -> KubeClusterView:
    v = KubeClusterView(idle_api(), domain=DOM, memory_resource=MEM, core_resource=CORE,
                        default_workload=Workload([Shape(4, 30, 1.0), Shape(16, 100, 1.0)]),
                        decision_key=KEY)
    for node, u in used.items():
        ann = {inventory_key(DOM): _inv(node, u).encode()}
        v._apply("nodes", "ADDED", {"metadata": {"name": node, "annotations": ann}})
    return v


def dra_pod(uid: str, memory: int = 4, cores: int = 30) -> dict[str, Any]:
    """A pod as the webhook leaves it with ``--mark-for-extender``."""
    return {
        "metadata": {"name": f"p-{uid}", "namespace": "t", "uid": uid},
        "spec": {
            "containers": [{"name": "c", "resources": {
                "limits": {MEM: "0", CORE: "0"}, "claims": [{"name": "gpu-share-c"}]}}],
            "resourceClaims": [{"name": "gpu-share-c",
                                "resourceClaimTemplateName": f"gpu-share-m{memory}-c{cores}"}],
        },
        "status": {"phase": "Pending", "resourceClaimStatuses": [
            {"name": "gpu-share-c", "resourceClaimName": f"p-{uid}-gpu-share-c-x1"}]},
    }


def vcuda_pod(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{uid}", "namespace": "t", "uid": uid},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {MEM: "4", CORE: "30"}}}]},
            "status": {"phase": "Pending"}}


class Binder:
    def __init__(self) -> None:
        self.annotations: dict[str, Mapping[str, str]] = {}

    def annotate_and_bind(self, namespace: str, name: str, uid: str, node: str,
                          annotations: Mapping[str, str]) -> None:
        self.annotations[uid] = dict(annotations)


class Claims:
    """Claims by name; ``fail``: every read raises (API server unreachable)."""

    def __init__(self, claims: Mapping[str, Any] | None = None, fail: bool = False) -> None:
        self.claims, self.fail = dict(claims or {}), fail

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        if self.fail:
            raise KubeAccessError(f"get resourceclaim {namespace}/{name}: unreachable")
        return self.claims[name]


def allocated(node: str, *devices: str, driver: str = DRIVER) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [
        {"request": "slice", "driver": driver, "pool": node, "device": d} for d in devices]}}}}


def _extender(view: KubeClusterView, binder: Binder, claims: Claims | None) -> Extender:
    return Extender(ExtenderSettings(ResourceNames(MEM, CORE), DOM, KEY), view, binder,
                    lambda v: make_policy("fgd", v.workload()), claims=claims)


def _bind(ext: Extender, view: KubeClusterView, pod: dict[str, Any], node: str) -> Any:
    view.pod = lambda ns, name: pod  # type: ignore[method-assign]  # the bind's GET
    uid = pod["metadata"]["uid"]
    ext.filter({"Pod": pod, "NodeNames": [node]})
    return ext.bind({"PodName": f"p-{uid}", "PodNamespace": "t", "PodUID": uid, "Node": node})


def _recorded(binder: Binder, uid: str) -> tuple[str, ...]:
    text = binder.annotations[uid].get(decision_key(DOM))
    return () if text is None else decode_unverified(text).containers["c"].devices


def test_filter_leaves_a_dra_pods_fit_to_kube_scheduler() -> None:
    # The view says n1 is full; the allocator (on the claims) is the judge of a DRA pod.
    view = _view({"n1": ((16, 100), (16, 100)), "n2": ((0, 0), (0, 0))})
    ext = _extender(view, Binder(), None)
    got = ext.filter({"Pod": dra_pod("a"), "NodeNames": ["n1", "n2"]})
    assert got["NodeNames"] == ["n1", "n2"] and got["FailedNodes"] == {}
    # The same slice asked as vcuda amounts is the extender's to fit.
    got = ext.filter({"Pod": vcuda_pod("b"), "NodeNames": ["n1", "n2"]})
    assert got["NodeNames"] == ["n2"] and set(got["FailedNodes"]) == {"n1"}


def test_prioritize_ranks_by_the_allocators_first_fit() -> None:
    # n1: gpu-0 whole, gpu-1 has just the slice's room left; n2: the other way round.
    # The policy would fill the gap on either node (a tie: n1, the smaller name), but
    # the allocator takes the first device that fits: on n1 it breaks the whole gpu-0,
    # on n2 it fills the gap. So a DRA pod goes to n2, a vcuda pod to n1.
    view = _view({"n1": ((0, 0), (12, 70)), "n2": ((12, 70), (0, 0))})
    ext = _extender(view, Binder(), None)

    def top(pod: dict[str, Any]) -> str:
        scores = ext.prioritize({"Pod": pod, "NodeNames": ["n1", "n2"]})
        return max(scores, key=lambda s: s["Score"])["Host"]

    assert top(dra_pod("a")) == "n2"
    assert top(vcuda_pod("b")) == "n1"


def test_bind_records_the_devices_the_claims_were_allocated() -> None:
    view = _view({"n1": ((0, 0), (0, 0))})
    binder = Binder()
    claims = Claims({"p-a-gpu-share-c-x1": allocated("n1", "gpu-1")})
    ext = _extender(view, binder, claims)
    assert _bind(ext, view, dra_pod("a"), "n1") == {"Error": ""}
    assert _recorded(binder, "a") == ("n1-GPU-1",)  # not the predicted gpu-0
    n = view.node("n1")
    assert n is not None
    assert [(d.memory_free, d.cores_free) for d in n.devices] == [(16, 100), (12, 70)]


def test_bind_predicts_the_first_fit_when_the_claims_cannot_be_read() -> None:
    for claims in (Claims(fail=True), None):
        view, binder = _view({"n1": ((4, 30), (0, 0))}), Binder()
        ext = _extender(view, binder, claims)
        assert _bind(ext, view, dra_pod("a"), "n1") == {"Error": ""}
        assert _recorded(binder, "a") == ("n1-GPU-0",)


def test_claims_holding_none_of_our_devices_record_nothing() -> None:
    # A tenant's own template under our name, for another driver's devices: the pod
    # holds nothing of ours, so the view must not count a phantom share (it would turn
    # other pods away from the node).
    view, binder = _view({"n1": ((0, 0), (0, 0))}), Binder()
    claims = Claims({"p-a-gpu-share-c-x1": allocated("n1", "gpu-1", driver="other")})
    ext = _extender(view, binder, claims)
    assert _bind(ext, view, dra_pod("a"), "n1") == {"Error": ""}
    assert _recorded(binder, "a") == ()
    n = view.node("n1")
    assert n is not None and all(d.memory_free == 16 for d in n.devices)


def test_bind_never_refuses_a_dra_pod() -> None:
    # Its devices are allocated already; a view that lags says the node is full.
    view, binder = _view({"n1": ((16, 100), (16, 100))}), Binder()
    ext = _extender(view, binder, Claims(fail=True))
    assert _bind(ext, view, dra_pod("a"), "n1") == {"Error": ""}
    assert _recorded(binder, "a") == ()


def test_whole_devices_from_claims() -> None:
    view, binder = _view({"n1": ((0, 0), (0, 0))}), Binder()
    claims = Claims({"p-a-gpu-share-c-x1": allocated("n1", "gpu-0", "gpu-1")})
    ext = _extender(view, binder, claims)
    assert _bind(ext, view, dra_pod("a", 16, 200), "n1") == {"Error": ""}
    assert _recorded(binder, "a") == ("n1-GPU-0", "n1-GPU-1")
    n = view.node("n1")
    assert n is not None and all(d.memory_free == 0 and d.cores_free == 0 for d in n.devices)
