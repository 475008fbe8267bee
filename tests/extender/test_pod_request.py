"""``sharing.placement.pod_request``: the one pod-request parser of the agent (kube/pods), the
extender (core) and its cluster view. Pure; tenant input."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_share.sharing.model import ContainerKind, ContainerRequest
from gpu_share.sharing.placement import ANY_MODEL, Demand
from gpu_share.sharing.placement.pod_models import models_key
from gpu_share.sharing.placement.pod_request import (
    MAX_AMOUNT,
    MAX_CONTAINERS,
    PodRequest,
    PodRequestError,
    parse_pod_request,
    read_pod_request,
)

MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"


def c(name: str, limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None,
      **extra: Any) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if limits is not None:
        res["limits"] = limits
    if requests is not None:
        res["requests"] = requests
    return {"name": name, "resources": res, **extra}


def pod(app: list[Any], init: list[Any] | None = None, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": app}
    if init is not None:
        spec["initContainers"] = init
    return {"metadata": meta, "spec": spec}


def test_admission_order_kinds_limits_win_and_host_request() -> None:
    p = pod(
        [c("b", {MEM: "4", "cpu": "1"}, {CORE: 30, "memory": "1Gi"}), c("a")],
        init=[c("setup", {MEM: "2", CORE: "10"}), c("proxy", requests={MEM: "1k"},
                                                     restartPolicy="Always")],
    )
    got = parse_pod_request(p, MEM, CORE)
    assert [(x.name, x.kind, x.request) for x in got.containers] == [
        ("setup", ContainerKind.INIT, ContainerRequest(2, 10)),
        ("proxy", ContainerKind.SIDECAR, ContainerRequest(1000, 0)),
        ("b", ContainerKind.APP, ContainerRequest(4, 30)),
        ("a", ContainerKind.APP, ContainerRequest(0, 0)),
    ]
    assert got.asking == {"setup": ContainerRequest(2, 10), "proxy": ContainerRequest(1000, 0),
                          "b": ContainerRequest(4, 30)}
    assert (got.cpu, got.memory, got.models, got.problems) == (1000, 1024, ANY_MODEL, ())
    assert got.demand().containers == (Demand("setup", 2, 10), Demand("proxy", 1000, 0),
                                       Demand("b", 4, 30))
    # A limit wins over a request of the same resource.
    assert parse_pod_request(pod([c("x", {MEM: 3}, {MEM: 5})]), MEM, CORE).asking == {
        "x": ContainerRequest(3, 0)}


@pytest.mark.parametrize(
    "bad", ["1.5", "500m", "-2", "junk", "²", "٣", "", "1e99999", True, [1], {"a": 1},
            str(MAX_AMOUNT + 1), "1" * 70],
)
def test_malformed_amounts_are_a_typed_error_or_zero_when_reading(bad: Any) -> None:
    p = pod([c("x", {MEM: bad, CORE: "7"})])
    with pytest.raises(PodRequestError, match=r"spec.containers\[0\].resources.limits"):
        parse_pod_request(p, MEM, CORE)
    got = read_pod_request(p, MEM, CORE)
    assert got.containers[0].request == ContainerRequest(0, 7) and len(got.problems) == 1
    assert len(str(got.problems[0])) < 200


def test_whole_quantities_in_any_spelling() -> None:
    for q, n in [("4", 4), (4, 4), ("1k", 1000), ("1e3", 1000), ("2000m", 2), (4.0, 4),
                 (str(MAX_AMOUNT), MAX_AMOUNT), ("0", 0)]:
        assert parse_pod_request(pod([c("x", {CORE: q})]), MEM, CORE).containers[0].request == (
            ContainerRequest(0, n)), q


@pytest.mark.parametrize(
    "bad_pod",
    [
        {"spec": "x"},
        {"spec": {"containers": "x"}},
        {"spec": {"containers": ["x"]}},
        {"spec": {"containers": [{"name": "a", "resources": []}]}},
        {"spec": {"containers": [{"name": "a", "resources": {"limits": "x"}}]}},
        {"spec": {"containers": [{"name": "a"}] * (MAX_CONTAINERS + 1)}},
        {"spec": {"containers": [], "overhead": {"cpu": "lots"}}},
        {"metadata": {"annotations": {models_key("vendor.com"): "x" * 10_000}},
         "spec": {"containers": []}},
    ],
)
def test_malformed_pods_raise_only_the_typed_error(bad_pod: dict[str, Any]) -> None:
    with pytest.raises(PodRequestError):
        parse_pod_request(bad_pod, MEM, CORE, domain="vendor.com")
    got = read_pod_request(bad_pod, MEM, CORE, domain="vendor.com")
    assert got.problems and isinstance(got, PodRequest)


def test_models_and_placement_off() -> None:
    p = pod([c("x", {MEM: 1})], annotations={models_key("vendor.com"): "Tesla-T4"})
    assert str(parse_pod_request(p, MEM, CORE, domain="vendor.com").models) == "Tesla-T4"
    bad = pod([c("x", {MEM: 1})], annotations={models_key("vendor.com"): ","})
    # The agent skips placement: host request and models are not even read.
    only = parse_pod_request(bad, MEM, CORE, domain="vendor.com", placement=False)
    assert only.asking == {"x": ContainerRequest(1, 0)} and only.models is ANY_MODEL
    lenient = read_pod_request(bad, MEM, CORE, domain="vendor.com")
    assert lenient.models is ANY_MODEL and lenient.asking and lenient.problems


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["spec", "containers", "initContainers", "resources", "limits",
                         "requests", MEM, CORE, "name", "restartPolicy", "metadata",
                         "annotations", "overhead", "cpu"]), inner, max_size=4),
    max_leaves=30,
)


@given(value=json_like)
def test_any_input_parses_or_raises_the_typed_error(value: Any) -> None:
    p = value if isinstance(value, dict) else {"spec": value}
    with contextlib.suppress(PodRequestError):
        parse_pod_request(p, MEM, CORE, domain="vendor.com")
    got = read_pod_request(p, MEM, CORE, domain="vendor.com")
    assert all(0 <= x.request.memory_units <= MAX_AMOUNT for x in got.containers)
