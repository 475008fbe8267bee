"""L1: placement of DRA pods (sharing/placement/first_fit.py, claim_names.py, the pod
request read from claims): the devices are the allocator's first fit in slice (index)
order, the score the policy's own for that plan."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_share.sharing.claim_names import template_name, template_shape
from gpu_share.sharing.placement import (
    Demand,
    DeviceSlot,
    NodeSlots,
    NoFit,
    PodDemand,
    Shape,
    Workload,
    make_policy,
)
from gpu_share.sharing.placement.cluster_policy import Plan
from gpu_share.sharing.placement.first_fit import FirstFitScores, first_fit
from gpu_share.sharing.placement.pod_request import parse_pod_request

MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"
LOAD = Workload([Shape(4, 30, 1.0), Shape(16, 100, 1.0)])


def node(*free: tuple[int, int], healthy: tuple[bool, ...] = ()) -> NodeSlots:
    return NodeSlots("n", tuple(
        DeviceSlot(f"G{i}", i, 16, m, 100, c, healthy[i] if healthy else True)
        for i, (m, c) in enumerate(free)))


def ask(*containers: tuple[int, int]) -> PodDemand:
    return PodDemand(tuple(Demand(f"c{i}", m, c) for i, (m, c) in enumerate(containers)))


def picked(n: NodeSlots, pod: PodDemand) -> list[tuple[int, ...]] | None:
    got = first_fit(n, pod)
    return None if got is None else [tuple(d.index for d in cp.devices) for cp in got[1]]


def test_a_share_takes_the_first_device_with_room_not_the_best() -> None:
    n = node((16, 100), (4, 30))
    assert picked(n, ask((4, 30))) == [(0,)]
    assert picked(n, ask((8, 30))) == [(0,)]
    assert picked(node((2, 100), (16, 100)), ask((4, 30))) == [(1,)]  # memory short on 0


def test_whole_devices_are_the_first_wholly_free_ones() -> None:
    n = node((4, 30), (16, 100), (16, 100), (16, 100))
    assert picked(n, ask((16, 200))) == [(1, 2)]
    assert picked(n, ask((16, 400))) is None


def test_containers_see_what_the_ones_before_took_and_unhealthy_devices_are_skipped() -> None:
    assert picked(node((16, 100), (16, 100)), ask((8, 60), (8, 60))) == [(0,), (1,)]
    assert picked(node((16, 100), (16, 100)), ask((8, 40), (8, 40))) == [(0,), (0,)]
    assert picked(node((16, 100), (16, 100), healthy=(False, True)), ask((4, 30))) == [(1,)]


def test_the_score_is_the_policys_score_of_the_first_fit_plan() -> None:
    pol = make_policy("fgd", LOAD)
    n = node((16, 100), (4, 30))
    p = FirstFitScores(pol, ask((4, 30))).placement(n)
    assert not isinstance(p, NoFit)
    plan, _ = first_fit(n, ask((4, 30))) or (Plan((), ()), ())
    assert p.score == pol.score(n.state, plan)
    # The policy's own best plan fills the gap and scores better than the first fit.
    best = pol.evaluate(n.state, ((4, 30),))
    assert best is not None and best.score < p.score
    assert isinstance(FirstFitScores(pol, ask((16, 200))).placement(n), NoFit)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 16), st.integers(0, 100)), min_size=1, max_size=8),
       st.integers(0, 16), st.sampled_from([1, 10, 30, 60, 99, 100, 200, 300]))
def test_first_fit_never_overcommits(free: list[tuple[int, int]], m: int, c: int) -> None:
    n = node(*free)
    got = first_fit(n, ask((m, c)))
    if got is None:
        return
    for cp in got[1]:
        for d in cp.devices:
            assert d.memory_free >= cp.memory_units and d.cores_free >= cp.cores
    plan = got[0]
    assert sum(x[0] for x in plan.after) == sum(x[0] for x in n.state) - sum(
        cp.memory_units * len(cp.devices) for cp in got[1])


def test_template_names_round_trip_and_nothing_else_reads() -> None:
    assert template_shape(template_name(4, 30)) == (4, 30)
    for bad in ("gpu-share-m04-c30", "gpu-share-m4-c30x", "gpu-share-m4", "x-m4-c30",
                "gpu-share-m" + "9" * 13 + "-c1", 7, None, "gpu-share-m٣-c3"):
        assert template_shape(bad) is None


def _dra(claims: list[dict[str, object]], templates: dict[str, object]) -> dict[str, object]:
    return {"spec": {
        "containers": [{"name": "c", "resources": {"limits": {MEM: "0"}, "claims": claims}}],
        "resourceClaims": [{"name": k, "resourceClaimTemplateName": v}
                           for k, v in templates.items()]}}


def test_a_dra_pod_asks_what_its_claim_templates_name() -> None:
    pod = _dra([{"name": "a"}, {"name": "b"}, {"name": "other"}],
               {"a": "gpu-share-m4-c30", "b": "gpu-share-m2-c10", "other": "someone-elses"})
    r = parse_pod_request(pod, MEM, CORE, claims=True)
    assert r.from_claims and r.asking["c"].memory_units == 6 and r.asking["c"].cores == 40
    assert not parse_pod_request(pod, MEM, CORE).uses_ours  # only when asked to read claims
    # Garbage a tenant may write reads as no ask, never as an error.
    for junk in ([{"name": 3}], ["x"], [{"name": "a"}] * 2000):
        got = parse_pod_request(_dra(junk, {"a": "gpu-share-m1-c1"}), MEM, CORE, claims=True)
        assert got.asking == {} or got.asking["c"].memory_units >= 1
    # A pod asking vcuda amounts is read by them, whatever its claims say.
    pod["spec"]["containers"][0]["resources"]["limits"] = {MEM: "1", CORE: "5"}  # type: ignore[index]
    r = parse_pod_request(pod, MEM, CORE, claims=True)
    assert not r.from_claims and r.asking["c"].cores == 5
