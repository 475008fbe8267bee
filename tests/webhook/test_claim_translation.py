"""L1: sharing/dra/claim_translation.py: vcuda amounts -> claims, templates and a JSONPatch."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_share.sharing.dra.claim_translation import (
    ClaimRequestError,
    ClaimShape,
    TranslationSettings,
    claim_name,
    escape_pointer,
    template_body,
    template_matches,
    translate_pod,
)
from gpu_share.sharing.model import ResourceNames
from testkit.jsonpatch import PatchError, apply_patch

MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"
S = TranslationSettings(ResourceNames(MEM, CORE), 1024)


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None,
        **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init is not None:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": body}


def ctr(name: str, mem: Any = None, cores: Any = None, *, requests: bool = True,
        **extra: Any) -> dict[str, Any]:
    limits = {k: v for k, v in ((MEM, mem), (CORE, cores)) if v is not None}
    res: dict[str, Any] = {"limits": {"cpu": "1", **limits}}
    if requests:
        res["requests"] = {"cpu": "1", **limits}
    return {"name": name, "image": "x", "resources": res, **extra}


def has_vcuda(p: dict[str, Any]) -> bool:
    spec = p["spec"]
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            if {MEM, CORE} & set(res.get(part) or {}):
                return True
    return False


# ---------------------------------------------------------------- the shapes


def test_shared_pod_patch_is_exact() -> None:
    p = pod(ctr("main", "4", "30"))
    t = translate_pod(p, "ns", S)
    assert [(c.container, c.claim, c.shape) for c in t.claims] == [
        ("main", "gpu-share-main", ClaimShape(4, 30))]
    assert list(t.patch) == [
        {"op": "remove", "path": "/spec/containers/0/resources/limits/vendor.com~1vcuda-memory"},
        {"op": "remove", "path": "/spec/containers/0/resources/limits/vendor.com~1vcuda-core"},
        {"op": "remove",
         "path": "/spec/containers/0/resources/requests/vendor.com~1vcuda-memory"},
        {"op": "remove", "path": "/spec/containers/0/resources/requests/vendor.com~1vcuda-core"},
        {"op": "add", "path": "/spec/containers/0/resources/claims",
         "value": [{"name": "gpu-share-main"}]},
        {"op": "add", "path": "/spec/resourceClaims",
         "value": [{"name": "gpu-share-main", "resourceClaimTemplateName": "gpu-share-m4-c30"}]},
    ]
    out = apply_patch(p, t.patch)
    assert out["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1"}, "requests": {"cpu": "1"}, "claims": [{"name": "gpu-share-main"}]}
    assert t.templates == (template_body(ClaimShape(4, 30), "ns", S),)


def test_template_bodies() -> None:
    shared = template_body(ClaimShape(4, 30), "ns", S)
    assert shared == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu-share-m4-c30", "namespace": "ns",
                     "labels": {"app.kubernetes.io/managed-by": "gpu-share"}},
        "spec": {"spec": {"devices": {"requests": [{"name": "slice", "exactly": {
            "deviceClassName": "gpu-share.vendor.com",
            "allocationMode": "ExactCount",
            "count": 1,
            "capacity": {"requests": {"memory": "4096Mi", "cores": "30"}},
        }}]}}},
    }
    cores_only = template_body(ClaimShape(0, 50), "ns", S)["spec"]["spec"]["devices"]
    assert cores_only["requests"][0]["exactly"]["capacity"] == {"requests": {"cores": "50"}}
    whole = template_body(ClaimShape(8, 300), "ns", S)["spec"]["spec"]["devices"]
    exactly = whole["requests"][0]["exactly"]
    assert (exactly["count"], exactly["capacity"]) == (3, {"requests": {"cores": "100"}})
    other = TranslationSettings(ResourceNames(MEM, CORE), 256, "my-class")
    ex = template_body(ClaimShape(3, 0), "ns", other)["spec"]["spec"]["devices"]
    assert ex["requests"][0]["exactly"]["deviceClassName"] == "my-class"
    assert ex["requests"][0]["exactly"]["capacity"]["requests"]["memory"] == "768Mi"


def test_every_container_kind_gets_its_own_claim_and_templates_are_shared() -> None:
    p = pod(ctr("app", "4", "30"), ctr("plain"), ctr("app2", "4", "30"),
            init=[ctr("setup", None, "10"), ctr("side", "1", "5", restartPolicy="Always")])
    t = translate_pod(p, "ns", S)
    assert [(c.field, c.index, c.claim) for c in t.claims] == [
        ("initContainers", 0, "gpu-share-setup"), ("initContainers", 1, "gpu-share-side"),
        ("containers", 0, "gpu-share-app"), ("containers", 2, "gpu-share-app2")]
    assert [b["metadata"]["name"] for b in t.templates] == [
        "gpu-share-m0-c10", "gpu-share-m1-c5", "gpu-share-m4-c30"]
    out = apply_patch(p, t.patch)
    assert not has_vcuda(out)
    assert "claims" not in out["spec"]["containers"][1]["resources"]
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == [
        "gpu-share-setup", "gpu-share-side", "gpu-share-app", "gpu-share-app2"]


def test_existing_arrays_are_appended_to() -> None:
    c = ctr("main", "2", "20")
    c["resources"]["claims"] = [{"name": "theirs"}]
    p = pod(c, resourceClaims=[{"name": "theirs", "resourceClaimName": "x"}])
    out = apply_patch(p, translate_pod(p, "ns", S).patch)
    assert out["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "theirs"}, {"name": "gpu-share-main"}]
    assert out["spec"]["resourceClaims"] == [
        {"name": "theirs", "resourceClaimName": "x"},
        {"name": "gpu-share-main", "resourceClaimTemplateName": "gpu-share-m2-c20"}]


def test_null_arrays_are_replaced() -> None:
    c = ctr("main", "2", "20")
    c["resources"]["claims"] = None
    p = pod(c, resourceClaims=None)
    out = apply_patch(p, translate_pod(p, "ns", S).patch)
    assert out["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpu-share-main"}]
    assert len(out["spec"]["resourceClaims"]) == 1


def test_limits_only_or_requests_only() -> None:
    p = pod(ctr("a", "4", "30", requests=False),
            {"name": "b", "resources": {"requests": {MEM: "2"}}})
    t = translate_pod(p, "ns", S)
    assert [c.shape for c in t.claims] == [ClaimShape(4, 30), ClaimShape(2, 0)]
    assert not has_vcuda(apply_patch(p, t.patch))


def test_zero_amounts_lose_their_keys_but_get_no_claim() -> None:
    p = pod(ctr("z", "0", "0"))
    t = translate_pod(p, "ns", S)
    assert t.claims == () and t.templates == ()
    out = apply_patch(p, t.patch)
    assert not has_vcuda(out) and "resourceClaims" not in out["spec"]


def test_a_pod_without_vcuda_is_not_patched() -> None:
    t = translate_pod(pod(ctr("plain")), "ns", S)
    assert not t.changed and t.claims == ()


def test_a_pod_carrying_our_claims_is_left_alone() -> None:
    p = pod(ctr("main", "4", "30"))
    once = apply_patch(p, translate_pod(p, "ns", S).patch)
    again = translate_pod(once, "ns", S)
    assert again.already_done and not again.changed
    # Even with vcuda keys back (another webhook): reinvocation does not add twice.
    mixed = copy.deepcopy(once)
    mixed["spec"]["containers"][0]["resources"]["limits"][MEM] = "4"
    assert not translate_pod(mixed, "ns", S).changed


def test_claim_names() -> None:
    assert claim_name("main") == "gpu-share-main"
    long = "c" * 63
    name = claim_name(long)
    digest = hashlib.sha256(long.encode()).hexdigest()[:8]
    assert name == ("gpu-share-" + long)[:50] + "-" + digest
    assert len(name) == 59
    assert claim_name("c" * 53) == "gpu-share-" + "c" * 53  # exactly 63
    assert len(claim_name("c" * 54)) == 59


def test_long_names_sharing_a_prefix_get_distinct_claims() -> None:
    t = translate_pod(pod(ctr("c" * 60 + "a", "4", "30"), ctr("c" * 60 + "b", "4", "30")),
                      "ns", S)
    assert len({c.claim for c in t.claims}) == 2


def test_escape_pointer() -> None:
    assert escape_pointer("a/b~c") == "a~1b~0c"
    assert escape_pointer("~1") == "~01"


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("p", "needle"),
    [
        (pod(ctr("m", "4", "150")), "150 cores is more than one device but not a multiple"),
        (pod(ctr("m", None, "3300")), "a claim allocates at most 32"),
        (pod(ctr("m", "-1", "10")), "must be a whole number"),
        (pod(ctr("m", "1.5", "10")), "must be a whole number"),
        (pod(ctr("m", "abc", "10")), "not a quantity"),
        (pod(ctr("m", 10**12, "10")), "memory units is too large"),
        (pod(ctr("m", "4", "30"), ctr("m", "4", "30")), "container name 'm' is used twice"),
        (pod(ctr("m", "4", "30"), ctr("m")), "container name 'm' is used twice"),
        (pod(ctr("Bad_Name", "4", "30")), "is not a DNS label"),
        (pod(ctr("", "4", "30")), "is not a DNS label"),
        (pod(ctr("m", "4", "30"), resourceClaims={"x": 1}), "spec.resourceClaims: must be a"),
        (pod(ctr("m", "4", "30", requests=False) | {"resources": {"limits": {MEM: "4"},
                                                                  "claims": "x"}}),
         "resources.claims: must be a list"),
        ({"spec": {"containers": "x"}}, "spec.containers: must be a list"),
        ({"spec": []}, "spec: must be an object"),
        ([], "the pod must be an object"),
        ("pod", "the pod must be an object"),
    ],
)
def test_refusals(p: Any, needle: str) -> None:
    with pytest.raises(ClaimRequestError) as e:
        translate_pod(p, "ns", S)
    assert needle in str(e.value)
    assert len(str(e.value)) <= 300


def test_limits_and_requests_must_agree() -> None:
    c = ctr("m", "4", "30")
    c["resources"]["requests"][MEM] = "2"
    with pytest.raises(ClaimRequestError, match=r"requests\['vendor.com/vcuda-memory'\]: "
                       r"'2' differs from the limit '4'"):
        translate_pod(pod(c), "ns", S)
    # The same amount written differently is equal.
    c["resources"]["requests"][MEM] = 4
    assert translate_pod(pod(c), "ns", S).claims[0].shape == ClaimShape(4, 30)
    # Also in a container asking nothing in its limits (limit 0, request 2).
    z = ctr("z", "0")
    z["resources"]["requests"][MEM] = "2"
    with pytest.raises(ClaimRequestError, match="differs"):
        translate_pod(pod(z), "ns", S)


def test_refusal_messages_are_bounded() -> None:
    c = ctr("m", "x" * 10_000, "30")
    with pytest.raises(ClaimRequestError) as e:
        translate_pod(pod(c), "ns", S)
    assert "x" * 41 not in str(e.value)


def test_exclusive_memory_is_not_requested() -> None:
    t = translate_pod(pod(ctr("m", "4", "100")), "ns", S)
    exactly = t.templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert t.claims[0].shape.template_name == "gpu-share-m4-c100"
    assert (exactly["count"], exactly["capacity"]) == (1, {"requests": {"cores": "100"}})


# ---------------------------------------------------------------- template_matches


def _stored(body: dict[str, Any]) -> dict[str, Any]:
    got = copy.deepcopy(body)
    got["metadata"] = {**got["metadata"], "uid": "u", "resourceVersion": "1"}
    return got


def test_template_matches() -> None:
    body = template_body(ClaimShape(4, 30), "ns", S)
    assert template_matches(body, _stored(body))
    canonical = _stored(body)
    caps = canonical["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    caps["requests"] = {"memory": "4Gi", "cores": "30"}
    assert template_matches(body, canonical)


@pytest.mark.parametrize(
    "change",
    [
        lambda ex, sp: ex.update(selectors=[{"cel": {"expression": "true"}}]),
        lambda ex, sp: ex.update(adminAccess=True),
        lambda ex, sp: ex.update(count=2),
        lambda ex, sp: ex.update(deviceClassName="other"),
        lambda ex, sp: ex["capacity"]["requests"].update(memory="8Gi"),
        lambda ex, sp: ex["capacity"]["requests"].pop("cores"),
        lambda ex, sp: ex["capacity"]["requests"].update(cores="lots"),
        lambda ex, sp: ex.pop("capacity"),
        lambda ex, sp: sp.update(metadata={"labels": {"a": "b"}}),
        lambda ex, sp: sp["spec"]["devices"].update(config=[{"opaque": {}}]),
        lambda ex, sp: sp["spec"]["devices"].update(constraints=[{}]),
        lambda ex, sp: sp["spec"]["devices"]["requests"].append({"name": "more"}),
        lambda ex, sp: sp["spec"].update(extra=1),
    ],
)
def test_template_mismatches(change: Any) -> None:
    body = template_body(ClaimShape(4, 30), "ns", S)
    stored = _stored(body)
    spec = stored["spec"]
    change(spec["spec"]["devices"]["requests"][0]["exactly"], spec)
    assert not template_matches(body, stored)


@pytest.mark.parametrize("stored", [None, {}, {"spec": None}, {"spec": {"spec": []}}, "x",
                                    {"spec": {"spec": {"devices": {"requests": "x"}}}}])
def test_template_matches_garbage(stored: Any) -> None:
    assert not template_matches(template_body(ClaimShape(1, 1), "ns", S), stored)


# ---------------------------------------------------------------- properties

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=30,
)
# Mostly well-formed, so that most examples are translated, not refused.
_good_amount = st.one_of(st.integers(0, 100).map(str),
                         st.sampled_from(["0", "4", "30", "100", "200", 300, 7]))
_bad_amount = st.one_of(st.integers(-5, 400), st.sampled_from(["1k", "2.5", "", "1e2", "-1"]),
                        st.none(), _json)
_good_name = st.sampled_from(["a", "b", "c", "d", "main", "side", "x" * 63, "c" * 54])


def _one_in(n: int) -> st.SearchStrategy[bool]:
    # False first: hypothesis leans to the first element.
    return st.sampled_from([False] * (n - 1) + [True])


@st.composite
def _resources(draw: st.DrawFn) -> Any:
    if draw(_one_in(16)):
        return draw(_json)

    def amount() -> Any:
        return draw(_bad_amount) if draw(_one_in(12)) else draw(_good_amount)

    keys = draw(st.lists(st.sampled_from([MEM, CORE, "cpu"]), unique=True, max_size=3))
    limits = {k: amount() for k in keys}
    mode = draw(st.sampled_from(["both", "limits", "requests", "differ", "none"]))
    res: dict[str, Any] = {}
    if mode in ("both", "limits", "differ"):
        res["limits"] = limits
    if mode in ("both", "requests"):
        res["requests"] = dict(limits)
    if mode == "differ":
        res["requests"] = {k: amount() for k in keys}
    if draw(_one_in(4)):
        res["claims"] = draw(st.one_of(st.none(), st.just([{"name": "theirs"}]), _json))
    return res


@st.composite
def _container(draw: st.DrawFn) -> Any:
    name = draw(st.text(max_size=6)) if draw(_one_in(16)) else draw(_good_name)
    c = {"name": name, "resources": draw(_resources())}
    if draw(st.booleans()):
        c["restartPolicy"] = "Always"
    return draw(_json) if draw(_one_in(16)) else c


def _named(c: Any) -> Any:
    return c.get("name") if isinstance(c, dict) else id(c)


@st.composite
def _pods(draw: st.DrawFn) -> Any:
    spec: dict[str, Any] = {"containers": draw(st.lists(_container(), min_size=1, max_size=4,
                                                         unique_by=_named))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(_container(), max_size=3, unique_by=_named))
    if draw(st.booleans()):
        spec["resourceClaims"] = draw(st.one_of(
            st.none(), st.just([]), st.just([{"name": "theirs", "resourceClaimName": "x"}]),
            st.just([{"name": "gpu-share-a", "resourceClaimTemplateName": "t"}]), _json))
    p = {"apiVersion": "v1", "kind": "Pod", "spec": spec}
    return draw(_json) if draw(_one_in(32)) else p


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pods())
def test_any_pod_translates_or_is_refused_and_the_patch_does_what_it_says(p: Any) -> None:
    before = json.dumps(p, sort_keys=True)
    try:
        t = translate_pod(p, "ns", S)
    except ClaimRequestError as e:
        assert 0 < len(str(e)) <= 300
        return
    assert json.dumps(p, sort_keys=True) == before  # the input is not changed
    if t.already_done:
        assert not t.changed
        return
    out = apply_patch(p, t.patch)  # raises PatchError when a path is wrong
    assert json.dumps(out, allow_nan=False)
    if not t.patch:
        return
    assert not has_vcuda(out)
    spec = out["spec"]
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    asking = {c.claim for c in t.claims}
    ours = [e for e in spec.get("resourceClaims") or []
            if isinstance(e, dict) and str(e.get("name", "")).startswith("gpu-share-")]
    assert sorted(e["name"] for e in ours) == sorted(asking) and len(ours) == len(t.claims)
    names = {b["metadata"]["name"] for b in t.templates}
    assert {e["resourceClaimTemplateName"] for e in ours} == names
    for c in containers:
        have = (c.get("resources") or {}).get("claims")
        mine = [x for x in (have if isinstance(have, list) else [])
                if isinstance(x, dict) and str(x.get("name", "")).startswith("gpu-share-")]
        assert len(mine) == (1 if claim_name(str(c.get("name", ""))) in asking else 0)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_arbitrary_json_never_raises_anything_else(p: Any) -> None:
    try:
        t = translate_pod(p, "ns", S)
    except ClaimRequestError as e:
        assert 0 < len(str(e)) <= 300
        return
    assert not t.changed or isinstance(p, dict)


def test_patch_applier_is_strict() -> None:
    with pytest.raises(PatchError):
        apply_patch({"a": {}}, [{"op": "remove", "path": "/a/b"}])
    with pytest.raises(PatchError):
        apply_patch({"a": {}}, [{"op": "add", "path": "/x/y", "value": 1}])


# ---------------------------------------------------------------- marked for the extender

MARKED = TranslationSettings(ResourceNames(MEM, CORE), 1024, mark_for_extender=True)


def test_marked_pod_keeps_its_vcuda_keys_at_zero() -> None:
    p = pod(ctr("main", "4", "30"), ctr("side"))
    out = apply_patch(p, translate_pod(p, "ns", MARKED).patch)
    res = out["spec"]["containers"][0]["resources"]
    assert res["limits"] == {"cpu": "1", MEM: "0", CORE: "0"}
    assert res["requests"] == {"cpu": "1", MEM: "0", CORE: "0"}
    assert res["claims"] == [{"name": "gpu-share-main"}]
    assert out["spec"]["containers"][1] == p["spec"]["containers"][1]
    # Called again after a later webhook changed the pod: left alone.
    assert translate_pod(out, "ns", MARKED).already_done


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from([0, 10, 30, 99, 100, 200])),
                min_size=1, max_size=3))
def test_the_extender_reads_back_what_the_pod_asked(asks: list[tuple[int, int]]) -> None:
    from gpu_share.sharing.placement.pod_request import parse_pod_request

    p = pod(*(ctr(f"c{i}", str(m), str(c)) for i, (m, c) in enumerate(asks)))
    try:
        t = translate_pod(p, "ns", MARKED)
    except ClaimRequestError:
        return  # refused shapes (e.g. memory with whole devices) never reach a scheduler
    out = apply_patch(p, t.patch)
    before = parse_pod_request(p, MEM, CORE, placement=False)
    after = parse_pod_request(out, MEM, CORE, placement=False, claims=True)
    assert after.asking == before.asking
    assert after.from_claims == bool(before.asking)
    # Without reading claims the marked pod asks nothing of the node (a 0 amount).
    assert not parse_pod_request(out, MEM, CORE, placement=False).uses_ours
