"""L1: kube/claim_templates.py against a loopback fake API server (tests/kube)."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kube_fakes import Call, fake_rest, status_obj, stop_fake_servers

from gpu_share.cli import webhook_main as cli
from gpu_share.errors import KubeAccessError
from gpu_share.kube.claim_templates import (
    WEBHOOK_RULES,
    WEBHOOK_TIMEOUTS,
    ClaimTemplates,
    OptInNamespaces,
    TemplateConflict,
    namespace_path,
    templates_path,
)
from gpu_share.kube.rest import ApiError, KubeTimeouts
from gpu_share.sharing.dra.claim_translation import ClaimShape, template_body
from tests.webhook.test_review import S

BODY = template_body(ClaimShape(4, 30), "team-a", S)
PATH = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates"


@pytest.fixture(autouse=True)
def _stop() -> Iterator[None]:
    yield
    stop_fake_servers()


def stored(body: dict[str, Any] = BODY) -> dict[str, Any]:
    got = copy.deepcopy(body)
    got["metadata"]["uid"] = "u1"
    caps = got["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]
    caps["memory"] = "4Gi"  # the API server's canonical form of 4096Mi
    return got


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_paths() -> None:
    assert templates_path("team-a") == PATH
    assert templates_path("team-a", "x/y") == PATH + "/x%2Fy"


def test_created_then_cached_until_the_ttl() -> None:
    api, fake = fake_rest(lambda c: (201, c.body))
    clock = Clock()
    t = ClaimTemplates(api, cache_ttl_s=30, clock=clock)
    assert t.ensure(BODY) == "created"
    assert [(c.method, c.path) for c in fake.calls] == [("POST", PATH)]
    assert fake.calls[0].body == BODY
    assert t.ensure(BODY) == "cached" and len(fake.calls) == 1
    clock.now = 30.0
    assert t.ensure(BODY) == "created" and len(fake.calls) == 2
    t.forget("team-a", "gpu-share-m4-c30")
    assert t.ensure(BODY) == "created" and len(fake.calls) == 3


def test_an_existing_same_template_is_fine() -> None:
    def handler(c: Call) -> tuple[int, Any]:
        if c.method == "POST":
            return 409, status_obj(409, "AlreadyExists", "exists")
        return 200, stored()

    api, fake = fake_rest(handler)
    t = ClaimTemplates(api)
    assert t.ensure(BODY) == "exists"
    assert [(c.method, c.path) for c in fake.calls] == [
        ("POST", PATH), ("GET", PATH + "/gpu-share-m4-c30")]


def test_an_existing_other_template_is_refused() -> None:
    other = stored()
    other["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "true"}}]

    def handler(c: Call) -> tuple[int, Any]:
        if c.method == "POST":
            return 409, status_obj(409, "AlreadyExists", "exists")
        return 200, other

    api, _ = fake_rest(handler)
    t = ClaimTemplates(api)
    with pytest.raises(TemplateConflict, match="asks something other"):
        t.ensure(BODY)
    with pytest.raises(TemplateConflict):  # not remembered as fine
        t.ensure(BODY)


def test_deleted_between_create_and_get() -> None:
    def handler(c: Call) -> tuple[int, Any]:
        if c.method == "POST":
            return 409, status_obj(409, "AlreadyExists", "exists")
        return 404, status_obj(404)

    api, _ = fake_rest(handler)
    with pytest.raises(KubeAccessError, match="retry") as e:
        ClaimTemplates(api).ensure(BODY)
    assert not isinstance(e.value, TemplateConflict)


def test_other_errors_propagate() -> None:
    api, _ = fake_rest(lambda c: (403, status_obj(403, "Forbidden", "no")))
    with pytest.raises(ApiError) as e:
        ClaimTemplates(api).ensure(BODY)
    assert e.value.status == 403


def test_the_deadline_is_checked_before_each_call() -> None:
    api, fake = fake_rest(lambda c: (201, c.body))
    clock = Clock()
    clock.now = 10.0
    with pytest.raises(KubeAccessError, match="no time left"):
        ClaimTemplates(api, clock=clock).ensure_all([BODY], deadline=10.0)
    assert fake.calls == []


def test_calls_are_bounded_by_short_timeouts() -> None:
    def slow(c: Call) -> tuple[int, Any]:
        time.sleep(1.5)
        return 201, c.body

    api, _ = fake_rest(slow)
    t = ClaimTemplates(api, timeouts=KubeTimeouts(connect=0.5, read=0.3))
    start = time.monotonic()
    with pytest.raises(KubeAccessError):
        t.ensure(BODY)
    assert time.monotonic() - start < 1.2
    default = ClaimTemplates(api)
    assert default._api.timeouts == WEBHOOK_TIMEOUTS
    # The last call starts before the budget ends and ends before timeoutSeconds (5).
    budget = cli.parse_args([]).api_budget_seconds
    assert budget + WEBHOOK_TIMEOUTS.connect + WEBHOOK_TIMEOUTS.read < 5


def test_the_cache_is_bounded() -> None:
    api, _ = fake_rest(lambda c: (201, c.body))
    t = ClaimTemplates(api, max_cached=2)
    bodies = [template_body(ClaimShape(i, 1), "team-a", S) for i in range(3)]
    for b in bodies:
        t.ensure(b)
    assert len(t._seen) == 2 and ("team-a", "gpu-share-m0-c1") not in t._seen


def test_every_call_is_in_the_webhook_rules() -> None:
    def handler(c: Call) -> tuple[int, Any]:
        if c.method == "POST":
            return 409, status_obj(409, "AlreadyExists", "exists")
        return 200, stored() if c.path.startswith("/apis/") else _ns(None)

    api, fake = fake_rest(handler)
    ClaimTemplates(api).ensure(BODY)
    OptInNamespaces(api, *LABEL).opted_in("team-a")
    verbs = {"POST": "create", "GET": "get"}
    used = {
        ("resource.k8s.io", c.path.split("/")[6], verbs[c.method])
        if c.path.startswith("/apis/") else ("", c.path.split("/")[3], verbs[c.method])
        for c in fake.calls
    }
    granted = {(g, r, v) for g, r, vs in WEBHOOK_RULES for v in vs}
    assert used == granted


# ---------------------------------------------------------------- namespace opt-in

LABEL = ("gpu-share.vendor.com/dra", "enabled")


def _ns(labels: dict[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "team-a", "uid": "n1"}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def test_namespace_path() -> None:
    assert namespace_path("team-a") == "/api/v1/namespaces/team-a"
    assert namespace_path("a/b") == "/api/v1/namespaces/a%2Fb"


def test_a_labelled_namespace_is_opted_in_and_remembered_until_the_ttl() -> None:
    api, fake = fake_rest(lambda c: (200, _ns({LABEL[0]: LABEL[1], "x": "y"})))
    clock = Clock()
    gate = OptInNamespaces(api, *LABEL, cache_ttl_s=30, clock=clock)
    assert gate.opted_in("team-a") and gate.opted_in("team-a")
    assert [(c.method, c.path) for c in fake.calls] == [("GET", "/api/v1/namespaces/team-a")]
    clock.now = 30.0
    assert gate.opted_in("team-a") and len(fake.calls) == 2


@pytest.mark.parametrize(
    "answer",
    [
        (200, _ns(None)),
        (200, _ns({LABEL[0]: "disabled"})),
        (200, _ns({"other": LABEL[1]})),
        (200, {"metadata": {"labels": ["not", "a", "map"]}}),
        (200, ["not a namespace"]),
        (404, status_obj(404, "NotFound", "no")),
    ],
)
def test_anything_else_is_not_opted_in_and_asked_again_after_a_few_seconds(
    answer: tuple[int, Any],
) -> None:
    api, fake = fake_rest(lambda c: answer)
    clock = Clock()
    gate = OptInNamespaces(api, *LABEL, no_ttl_s=5, clock=clock)
    assert gate.opted_in("team-a") is False and gate.opted_in("team-a") is False
    assert len(fake.calls) == 1  # a "no" is remembered briefly ...
    clock.now = 5.0
    assert gate.opted_in("team-a") is False and len(fake.calls) == 2  # ... then asked again


def test_forged_reviews_for_many_namespaces_cost_a_bounded_number_of_reads() -> None:
    """Reviews naming 1,000 unlabelled namespaces in one second: at most the burst is
    read, the rest refused without an API call; the budget refills with time."""
    api, fake = fake_rest(lambda c: (200, _ns(None)))
    clock = Clock()
    gate = OptInNamespaces(api, *LABEL, reads_per_s=20, read_burst=40, clock=clock)
    refused = 0
    for i in range(1000):
        try:
            assert gate.opted_in(f"ns-{i}") is False
        except KubeAccessError:
            refused += 1
    assert len(fake.calls) == 40 and refused == 960
    clock.now = 1.0  # a second later: 20 more reads
    for i in range(1000, 1100):
        with contextlib.suppress(KubeAccessError):
            gate.opted_in(f"ns-{i}")
    assert len(fake.calls) == 60


def test_namespace_errors_and_the_deadline() -> None:
    api, fake = fake_rest(lambda c: (403, status_obj(403, "Forbidden", "no")))
    gate = OptInNamespaces(api, *LABEL, clock=lambda: 5.0)
    with pytest.raises(ApiError):
        gate.opted_in("team-a")
    with pytest.raises(KubeAccessError, match="no time left"):
        gate.opted_in("team-a", deadline=5.0)
    assert len(fake.calls) == 1
