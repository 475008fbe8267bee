"""Hypothesis against a real extender on 127.0.0.1 (fake view and binder): whatever the
body, /filter, /prioritize and /bind answer a well-formed JSON response, never 5xx, and an
error's reason is short; each request is
counted once in the extender's metrics, a refused one as refused."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_share.extender.http import make_server
from gpu_share.observability.http import BoundedServer
from gpu_share.observability.metrics import ExtenderMetrics
from tests.extender.test_http import CORE, MEM, FakeBinder, FakeView, fgd_extender, kpod

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
ROUTES = ["/filter", "/prioritize", "/bind"]
MAX_ERROR = 512  # bytes of an error answer


@pytest.fixture(scope="module")
def server() -> Iterator[BoundedServer]:
    view, binder, metrics = FakeView(), FakeBinder(), ExtenderMetrics()
    ext = fgd_extender(view, binder, clock=lambda: 1_700_000_000.0)
    srv = make_server(ext, "127.0.0.1", 0, metrics=metrics)
    srv.metrics = metrics  # type: ignore[attr-defined]
    t = srv.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    t.join(5)


def _requests(m: ExtenderMetrics, verb: str) -> dict[str, float]:
    return {o: m.registry.get_sample_value(
        "gpu_share_extender_requests_total", {"verb": verb, "outcome": o}) or 0.0
        for o in ("ok", "error", "refused", "internal")}


def exchange(srv: BoundedServer, route: str, body: bytes) -> None:
    m: ExtenderMetrics = srv.metrics  # type: ignore[attr-defined]
    before = _requests(m, route.strip("/"))
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=30)
    try:
        conn.request("POST", route, body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    assert r.status < 500, (route, body[:200], data[:300])
    assert r.getheader("Content-Type") == "application/json"
    assert len(data) == int(r.getheader("Content-Length") or -1)
    got = json.loads(data)  # well-formed JSON, whatever the answer
    if r.status != 200:
        assert len(data) <= MAX_ERROR and isinstance(got.get("Error"), str)
    after = _requests(m, route.strip("/"))
    grew = {o: after[o] - before[o] for o in after if after[o] != before[o]}
    want = "refused" if r.status >= 400 else ("error" if isinstance(got, dict)
                                               and got.get("Error") else "ok")
    assert grew == {want: 1.0}, (route, r.status, grew)


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=25,
)


def maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right shape (so the core runs), now and then anything at all."""
    return st.integers(0, 15).flatmap(lambda i: json_values if i == 0 else valid)


quantity = maybe(
    st.one_of(
        st.integers(min_value=0, max_value=200).map(str),
        st.sampled_from(["1", "100m", "2Gi", "1e3", "0.5", "-1", "²", "٣", "1e99999", "", "x"]),
        st.integers(min_value=-5, max_value=300),
        st.text(max_size=8),
    )
)
amounts = maybe(
    st.dictionaries(st.sampled_from([MEM, CORE, "cpu", "memory", "x"]), quantity, max_size=4)
)
container = maybe(
    st.fixed_dictionaries(
        {"name": maybe(st.sampled_from(["main", "side", ""])),
         "resources": maybe(st.fixed_dictionaries({}, optional={"requests": amounts,
                                                                 "limits": amounts}))},
        optional={"restartPolicy": maybe(st.just("Always"))},
    )
)
MODEL_LABEL = "nvidia.com/gpu.product"
models = st.sampled_from(["Tesla-T4", "NVIDIA-A10", "", "a|b", ",", "x" * 70]) | st.text(
    max_size=10
)
expression = maybe(
    st.fixed_dictionaries(
        {"key": maybe(st.sampled_from([MODEL_LABEL, "zone"])),
         "operator": maybe(st.sampled_from(["In", "NotIn", "Exists", "Gt"])),
         "values": maybe(st.lists(maybe(models), max_size=3))}
    )
)
affinity = maybe(
    st.fixed_dictionaries({"nodeAffinity": maybe(st.fixed_dictionaries({
        "requiredDuringSchedulingIgnoredDuringExecution": maybe(st.fixed_dictionaries({
            "nodeSelectorTerms": maybe(st.lists(maybe(st.fixed_dictionaries(
                {"matchExpressions": maybe(st.lists(expression, max_size=3))})), max_size=3)),
        })),
    }))})
)
annotations = maybe(
    st.dictionaries(st.sampled_from(["gpu-share.vendor.com/models", "other"]), maybe(models),
                    max_size=2)
)
pod = maybe(
    st.fixed_dictionaries(
        {"metadata": maybe(st.fixed_dictionaries(
            {"uid": maybe(st.text(max_size=8))}, optional={"annotations": annotations})),
         "spec": maybe(st.fixed_dictionaries(
             {"containers": maybe(st.lists(container, max_size=3))},
             optional={"initContainers": maybe(st.lists(container, max_size=2)),
                       "overhead": amounts,
                       "nodeSelector": maybe(st.dictionaries(
                           st.sampled_from([MODEL_LABEL, "zone"]), maybe(models), max_size=2)),
                       "affinity": affinity},
         ))}
    )
)
node_name = st.sampled_from(["a", "b", "zz", ""]) | st.text(max_size=10)
extender_args = maybe(
    st.fixed_dictionaries(
        {"Pod": pod},
        optional={
            "NodeNames": maybe(st.lists(maybe(node_name), max_size=4)),
            "Nodes": maybe(st.fixed_dictionaries({"items": maybe(st.lists(maybe(
                st.fixed_dictionaries({"metadata": maybe(st.fixed_dictionaries(
                    {"name": maybe(node_name)}))})), max_size=3))})),
        },
    )
)
# Well-formed asks of every size, so placement itself runs on most examples.
realistic_args = st.builds(
    lambda mem, cores, uid, names: {"Pod": kpod(mem, cores, uid=uid), "NodeNames": names},
    st.integers(0, 40),
    st.integers(0, 400),
    st.sampled_from(["uid-1", "uid-2", ""]),
    st.lists(st.sampled_from(["a", "b", "zz"]), max_size=4),
)
binding_args = maybe(
    st.fixed_dictionaries(
        {k: maybe(st.text(max_size=8)) for k in ("PodName", "PodNamespace")}
        | {"PodUID": maybe(st.sampled_from(["uid-1", "uid-2", ""]) | st.text(max_size=8)),
           "Node": maybe(node_name)}
    )
)


@FUZZ
@given(route=st.sampled_from(ROUTES[:2]), args=extender_args | realistic_args)
def test_filter_and_prioritize_shapes(server: BoundedServer, route: str, args: Any) -> None:
    exchange(server, route, json.dumps(args).encode())


@FUZZ
@given(args=binding_args)
def test_bind_shapes(server: BoundedServer, args: Any) -> None:
    exchange(server, "/bind", json.dumps(args).encode())


@FUZZ
@given(route=st.sampled_from(ROUTES), body=st.binary(max_size=300))
def test_arbitrary_bytes(server: BoundedServer, route: str, body: bytes) -> None:
    exchange(server, route, body)


@FUZZ
@given(route=st.sampled_from(ROUTES), value=json_values)
def test_arbitrary_json(server: BoundedServer, route: str, value: Any) -> None:
    exchange(server, route, json.dumps(value).encode())
