"""GPU-model requirements: parsing, the model-aware fragmentation measure, the pressure
price, and the dotprod/clustering baselines."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_share.sharing.placement import (
    ANY_MODEL,
    ClusterIndex,
    Demand,
    DeviceSlot,
    ModelReq,
    NodeSlots,
    NoFit,
    NoFitCause,
    PodDemand,
    Shape,
    TieBreak,
    Workload,
    choose,
    evaluate_node,
    label_form,
    make_policy,
)
from gpu_share.sharing.placement.pod_models import models_key, node_model, pod_models

U = 100
LABEL = "nvidia.com/gpu.product"


def node(name: str, frees: list[int], model: str = "", cpu: int | None = None) -> NodeSlots:
    devs = tuple(DeviceSlot(f"{name}-{i}", i, U, f, U, f) for i, f in enumerate(frees))
    return NodeSlots(name, devs, cpu, model=model, cpu_total=cpu)


def pod(share: int, models: ModelReq = ANY_MODEL, whole: int = 0) -> PodDemand:
    amt = whole * U if whole else share
    return PodDemand((Demand("c", amt, amt),), models=models)


# -- requirements


def test_parse_and_allows() -> None:
    r = ModelReq.parse("V100M16|V100M32")
    assert r.allows("V100M16") and r.allows("V100M32") and not r.allows("T4")
    assert ModelReq.parse("") is ANY_MODEL and ANY_MODEL.allows("anything")
    assert ModelReq.parse("A, B") == ModelReq.parse("B|A")  # canonical
    assert ModelReq.parse("Tesla T4").allows("Tesla-T4")  # label form
    assert label_form(" NVIDIA  A100-SXM4-80GB ") == "NVIDIA-A100-SXM4-80GB"
    both = ModelReq.parse("A|B").both(ModelReq.parse("B|C"))
    assert both.allows("B") and not both.allows("A") and not both.allows("C")


def test_parse_is_bounded() -> None:
    with pytest.raises(ValueError, match="more than 64"):
        ModelReq.parse("|".join(f"m{i}" for i in range(65)))
    with pytest.raises(ValueError) as e:
        ModelReq.parse("x" * 5000)
    assert len(str(e.value)) < 150


def _pod(spec: dict[str, object], ann: dict[str, str] | None = None) -> dict[str, object]:
    return {"metadata": {"annotations": ann or {}}, "spec": spec}


def test_pod_models_from_selector_affinity_and_annotation() -> None:
    assert pod_models(_pod({}), LABEL, "d") is ANY_MODEL
    sel = pod_models(_pod({"nodeSelector": {LABEL: "Tesla-T4", "zone": "a"}}), LABEL, "d")
    assert sel.allows("Tesla-T4") and not sel.allows("A10")

    def term(op: str, *vals: str) -> dict[str, object]:
        return {"matchExpressions": [{"key": LABEL, "operator": op, "values": list(vals)}]}

    aff = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [term("In", "A", "B"), term("NotIn", "A", "B", "C")]
                }
            }
        }
    }
    r = pod_models(_pod(aff), LABEL, "d")  # (A or B) or (not A, B, C)
    assert r.allows("A") and r.allows("B") and r.allows("D") and not r.allows("C")
    with_ann = pod_models(_pod(aff, {models_key("d"): "B,C,D"}), LABEL, "d")
    assert with_ann.allows("B") and with_ann.allows("D") and not with_ann.allows("C")
    assert not with_ann.allows("A")
    # a term without the product label leaves the model free
    other = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    aff_any = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [term("In", "A"), other]
                }
            }
        }
    }
    assert pod_models(_pod(aff_any), LABEL, "d") is ANY_MODEL


@pytest.mark.parametrize("text", ["", " , |", "x" * 5000, "|".join("m" * 3 for _ in range(70))])
def test_bad_models_annotation_is_refused_with_bounded_text(text: str) -> None:
    with pytest.raises(ValueError) as e:
        pod_models(_pod({}, {models_key("d"): text}), LABEL, "d")
    assert len(str(e.value)) < 200


def test_node_model_prefers_the_label() -> None:
    assert node_model({LABEL: "NVIDIA-A10"}, LABEL, "whatever") == "NVIDIA-A10"
    assert node_model({}, LABEL, "Tesla T4") == "Tesla-T4"
    assert node_model(None, LABEL, "") == ""


# -- model-aware fragmentation


def test_pods_that_exclude_a_model_do_not_count_toward_its_fragmentation() -> None:
    # Shapes: 30 anywhere (p=1/2), 80 on A100 only (p=1/2). A T4 device with 50 free.
    w = Workload([Shape(30, 30, 1.0), Shape(80, 80, 1.0, models=ModelReq.parse("A100"))])
    state = node("n", [50]).state
    assert w.for_model("T4").fragmentation(state) == 0  # only the 30 counts: it fits
    # On an A100 the 80 counts too: 500 milli it cannot use, with weight 1/2.
    assert w.for_model("A100").fragmentation(state) == pytest.approx(250)
    # Without requirements the workload is its own per-model view (unchanged behaviour).
    plain = Workload([Shape(30, 30, 1.0)])
    assert plain.for_model("T4") is plain


def test_scarce_model_is_kept_for_the_pods_that_can_only_use_it() -> None:
    w = Workload([Shape(50, 50, 1.0), Shape(U, U, 1.0, models=ModelReq.parse("A100"))])
    pol = make_policy("fgd", w)
    nodes = [node("a100", [U], "A100"), node("t4", [U], "T4")]
    got = choose(pol, nodes, pod(50))
    assert got is not None and got.node == "t4"
    idx = ClusterIndex(pol, nodes)
    assert idx.choose(pod(50)) == got
    # The bound pod still goes where it must.
    bound = idx.place(pod(0, ModelReq.parse("A100"), whole=1))
    assert bound is not None and bound.node == "a100"


def test_pressure_moves_flexible_pods_off_the_model_bound_pods_need() -> None:
    # Whole-device shapes only: the fragmentation gradient is 0 everywhere; X-bound
    # demand is ten times Y-bound demand on equal capacity, so a flexible pod takes Y.
    w = Workload(
        [
            Shape(U, U, 1.0),
            Shape(U, U, 1.0, models=ModelReq.parse("X")),
            Shape(U, U, 0.1, models=ModelReq.parse("Y")),
        ]
    )
    nodes = [node("a", [U, U], "X"), node("b", [U, U], "Y")]
    pol = make_policy("fgd", w)
    for tie in TieBreak:
        got = ClusterIndex(pol, nodes, tie, random.Random(1)).choose(pod(0, whole=1))
        assert got is not None and got.node == "b"
    pol.pressure_weight = 0.0  # without the price: a tie, smallest name
    got = ClusterIndex(pol, nodes).choose(pod(0, whole=1))
    assert got is not None and got.node == "a"


def test_model_filter_reason_is_typed_and_bounded() -> None:
    pol = make_policy("fgd", Workload([Shape(30, 30, 1.0)]))
    long = ModelReq.parse("|".join(f"model-{i:02d}" for i in range(40)))
    r = evaluate_node(pol, node("n", [U], "T4"), pod(30, long))
    assert isinstance(r, NoFit) and r.cause is NoFitCause.MODEL
    assert "'T4' is not one the pod accepts" in r.reason and len(r.reason) < 200


# -- the dotprod and clustering baselines


def test_dotprod_takes_the_smallest_dot_product() -> None:
    pol = make_policy("dotprod")
    # GPU dimension: free fraction x asked fraction. b has less free: smaller product.
    nodes = [node("a", [U, U], cpu=1000), node("b", [U, 40], cpu=1000)]
    got = choose(pol, nodes, pod(30))
    assert got is not None and got.node == "b" and got.containers[0].devices[0].index == 1


def test_clustering_puts_equal_requests_together() -> None:
    pol = make_policy("clustering")
    idx = ClusterIndex(pol, [node("a", [U, U]), node("b", [U, U]), node("c", [U, U])])
    first = idx.place(pod(30))
    other = idx.place(pod(60))  # a new kind: an idle node, not next to the 30
    again = idx.place(pod(30))
    assert first is not None and other is not None and again is not None
    assert other.node != first.node and again.node == first.node


# -- invariants with models


MODELS = ["X", "Y", "Z"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, U), min_size=1, max_size=3), st.sampled_from(MODELS)),
        min_size=1,
        max_size=5,
    ),
    st.lists(
        st.tuples(st.integers(1, U), st.sampled_from(["", "X", "Y|Z", "Z"])),
        min_size=1,
        max_size=20,
    ),
    st.sampled_from(["fgd", "best-fit", "dotprod", "clustering"]),
)
def test_models_are_honoured_and_indexed_equals_plain(
    cluster: list[tuple[list[int], str]], pods: list[tuple[int, str]], policy: str
) -> None:
    w = Workload(
        [
            Shape(30, 30, 1.0),
            Shape(U, U, 1.0, models=ModelReq.parse("X")),
            Shape(50, 50, 1.0, models=ModelReq.parse("Y|Z")),
        ]
    )
    nodes = [node(f"n{i}", f, m) for i, (f, m) in enumerate(cluster)]
    pol = make_policy(policy, w)
    idx = ClusterIndex(pol, nodes)
    for size, spec in pods:
        p = pod(size % U, ModelReq.parse(spec), whole=1 if size == U else 0)
        plain = choose(pol, list(idx.nodes.values()), p)
        got = idx.place(p)
        assert got == plain
        if got is not None:
            assert p.models.allows(idx.nodes[got.node].model)


@pytest.mark.parametrize(
    "pod",
    [
        {"spec": {"nodeSelector": ["x"]}},
        {"spec": {"affinity": "x"}},
        {
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": "x"}]
                        }
                    }
                }
            }
        },
        {
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{}] * 65
                        }
                    }
                }
            }
        },
        {"metadata": {"annotations": {models_key("d"): 5}}},
    ],
)
def test_malformed_pod_fields_are_value_errors(pod: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        pod_models(pod, LABEL, "d")
