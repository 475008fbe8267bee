"""Binds overlap: the extender decides and reserves one bind at a time, but the API calls
of a bind run outside that lock (they were inside it, and serialised every bind of the
cluster behind two API round trips). Each bind still sees the reservations of those
before it, so overlapping binds never pick the same capacity; a bind the API server
refused gives its reservation back, one whose outcome is unknown keeps it."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from gpu_share.errors import BindRefused, KubeAccessError
from gpu_share.extender.core import Extender, ExtenderSettings
from gpu_share.kube.binder import KubeBinder
from gpu_share.kube.cluster_view import KubeClusterView
from gpu_share.kube.rest import ApiError
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import make_policy
from testkit.kube_admin import idle_api
from tests.extender.test_view import CORE, DOM, KEY, MEM, _view


def _pod(uid: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"p-{uid}", "namespace": "t", "uid": uid},
        "spec": {"containers": [
            {"name": "c", "resources": {"limits": {MEM: "16", CORE: "100"}}}]},
        "status": {"phase": "Pending"},
    }


def _free(v: KubeClusterView) -> list[tuple[int, int]]:
    n = v.node("n1")
    assert n is not None
    return [(d.memory_free, d.cores_free) for d in n.devices]


class Binder:
    """Blocks the bind of ``hold`` until ``release`` is set; raises ``fail`` if given."""

    def __init__(self, hold: str = "", fail: Exception | None = None) -> None:
        self.hold, self.fail = hold, fail
        self.entered, self.release = threading.Event(), threading.Event()
        self.bound: list[str] = []

    def annotate_and_bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        if uid == self.hold:
            self.entered.set()
            assert self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        self.bound.append(uid)


def _extender(view: KubeClusterView, binder: Binder) -> Extender:
    return Extender(
        ExtenderSettings(ResourceNames(MEM, CORE), DOM, KEY),
        view,
        binder,
        lambda v: make_policy("fgd", v.workload()),
    )


def _bind(ext: Extender, uid: str) -> dict[str, Any]:
    ext.filter({"Pod": _pod(uid), "NodeNames": ["n1"]})  # bind finds the ask filter saw
    return dict(ext.bind({"PodName": f"p-{uid}", "PodNamespace": "t", "PodUID": uid,
                          "Node": "n1"}))


def test_a_bind_waiting_on_the_api_does_not_hold_up_the_next() -> None:
    view, binder = _view(), Binder(hold="a")
    ext = _extender(view, binder)
    first: dict[str, Any] = {}
    t = threading.Thread(target=lambda: first.update(_bind(ext, "a")), daemon=True)
    t.start()
    assert binder.entered.wait(10)
    try:
        # "a" is still in its API call; "b" is decided and bound meanwhile, on the other
        # device: "a"'s reservation already counts.
        assert _bind(ext, "b") == {"Error": ""}
        assert binder.bound == ["b"]
        assert _free(view) == [(0, 0), (0, 0)]
        # A third whole-GPU pod finds no device while "a" is still in flight.
        assert "no single device fits" in _bind(ext, "c")["Error"]
    finally:
        binder.release.set()
        t.join(10)
    assert first == {"Error": ""} and binder.bound == ["b", "a"]


def test_a_refused_bind_gives_its_reservation_back() -> None:
    view = _view()
    ext = _extender(view, Binder(fail=BindRefused("bind pod t/p-a to n1: answered 409")))
    assert "409" in _bind(ext, "a")["Error"]
    assert _free(view) == [(16, 100), (16, 100)]


def test_a_bind_of_unknown_outcome_keeps_its_reservation() -> None:
    # A timeout or a 5xx may have bound the pod: until the watch shows it (or the
    # reservation expires) its device stays taken, so nothing is over-committed.
    view = _view()
    ext = _extender(view, Binder(fail=KubeAccessError("bind pod t/p-a: unreachable")))
    assert "unreachable" in _bind(ext, "a")["Error"]
    assert sorted(_free(view)) == [(0, 0), (16, 100)]


def test_a_refusal_elsewhere_leaves_a_newer_reservation_alone() -> None:
    view = _view()
    view.reserve("a", "n1", {"GPU-0": (16, 100)})
    view.unreserve("a", "n2")
    assert _free(view) == [(0, 0), (16, 100)]
    view.unreserve("a", "n1")
    assert _free(view) == [(16, 100), (16, 100)]


@pytest.mark.parametrize(("status", "refused"), [(404, True), (409, True), (422, True),
                                                 (403, True), (500, False), (504, False)])
def test_kube_binder_calls_a_4xx_refused_and_a_5xx_unknown(status: int, refused: bool) -> None:
    api = idle_api()
    calls: list[tuple[str, str]] = []

    def answer(op: str, method: str, path: str, **_kw: Any) -> Any:
        calls.append((method, path))
        raise ApiError(op, status, "x")

    api.request = answer  # type: ignore[method-assign]
    with pytest.raises(KubeAccessError) as got:
        KubeBinder(api).annotate_and_bind("t", "p", "u", "n1", {})
    assert isinstance(got.value, BindRefused) is refused
    assert str(status) in str(got.value)
    assert calls == [("POST", "/api/v1/namespaces/t/bindings")]
