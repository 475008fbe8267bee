"""L1: webhook/review.py: AdmissionReview in, AdmissionReview (with the uid) out."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from gpu_share.errors import KubeAccessError
from gpu_share.kube.claim_templates import TemplateConflict
from gpu_share.kube.rest import ApiError
from gpu_share.sharing.dra.claim_translation import TranslationSettings
from gpu_share.sharing.model import ResourceNames
from gpu_share.webhook.review import INTERNAL_ERROR, MAX_DEPTH, Mutator
from testkit.jsonpatch import apply_patch

MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"
S = TranslationSettings(ResourceNames(MEM, CORE), 1024)
UID = "705ab4f5-6393-11e8-b7cc-42010a800002"
SECRET = "SECRET-7f3a"


class Ensure:
    def __init__(self, error: BaseException | None = None) -> None:
        self.calls: list[tuple[list[str], float]] = []
        self.error = error

    def __call__(self, bodies: Iterable[Mapping[str, Any]], deadline: float) -> None:
        self.calls.append(([b["metadata"]["name"] for b in bodies], deadline))
        if self.error is not None:
            raise self.error


def gpu_pod(mem: str = "4", cores: str = "30") -> dict[str, Any]:
    lim = {MEM: mem, CORE: cores}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "p-"},
            "spec": {"containers": [{"name": "main", "image": "x",
                                     "resources": {"limits": dict(lim), "requests": dict(lim)}}]}}


def review(obj: Any = None, **request: Any) -> dict[str, Any]:
    req: dict[str, Any] = {
        "uid": UID,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "namespace": "team-a",
        "operation": "CREATE",
        "userInfo": {"username": "u"},
        "object": gpu_pod() if obj is None else obj,
        "oldObject": None,
        "dryRun": False,
    }
    req.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def run(body: Any, ensure: Ensure | None = None) -> tuple[int, dict[str, Any], Ensure]:
    ensure = ensure or Ensure()
    m = Mutator(S, ensure, budget_s=2.0, clock=lambda: 100.0)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    code, answer = m.handle(raw)
    json.dumps(answer, allow_nan=False)
    return code, answer, ensure


def response(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    r: dict[str, Any] = answer["response"]
    assert r["uid"] == UID
    return r


def test_gpu_pod_is_patched_and_templates_ensured_first() -> None:
    code, answer, ensure = run(review())
    r = response(answer)
    assert code == 200 and r["allowed"] is True and r["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(r["patch"]))
    out = apply_patch(gpu_pod(), patch)
    assert out["spec"]["resourceClaims"] == [
        {"name": "gpu-share-main", "resourceClaimTemplateName": "gpu-share-m4-c30"}]
    assert ensure.calls == [(["gpu-share-m4-c30"], 102.0)]  # clock + budget


def test_templates_are_made_in_the_request_namespace() -> None:
    seen: list[str] = []

    def ensure(bodies: Iterable[Mapping[str, Any]], deadline: float) -> None:
        seen.extend(b["metadata"]["namespace"] for b in bodies)

    Mutator(S, ensure).handle(json.dumps(review(namespace="team-b")).encode())
    assert seen == ["team-b"]


def test_dry_run_makes_no_template() -> None:
    _, answer, ensure = run(review(dryRun=True))
    assert response(answer)["allowed"] and "patch" in response(answer)
    assert ensure.calls == []


@pytest.mark.parametrize(
    "request_change",
    [
        {"operation": "UPDATE"},
        {"operation": "DELETE"},
        {"kind": {"group": "", "version": "v1", "kind": "ConfigMap"}},
        {"resource": {"group": "", "version": "v1", "resource": "configmaps"}},
        {"subResource": "ephemeralcontainers"},
        {"kind": None},
    ],
)
def test_anything_but_a_pod_create_is_allowed_unchanged(request_change: dict[str, Any]) -> None:
    code, answer, ensure = run(review(**request_change))
    r = response(answer)
    assert code == 200 and r == {"uid": UID, "allowed": True}
    assert ensure.calls == []


def test_pod_without_vcuda_is_allowed_unchanged() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    _, answer, ensure = run(review(pod))
    assert response(answer) == {"uid": UID, "allowed": True} and ensure.calls == []


def _denied(answer: dict[str, Any], code: int) -> str:
    r = response(answer)
    assert r["allowed"] is False and "patch" not in r
    assert r["status"]["code"] == code and r["status"]["status"] == "Failure"
    message: str = r["status"]["message"]
    assert len(message) <= 300
    return message


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        (gpu_pod(cores="150"), "150 cores is more than one device but not a multiple of 100"),
        (gpu_pod(mem="-4"), "must be a whole number"),
        ({"spec": {"containers": "x"}}, "spec.containers: must be a list"),
        ([SECRET], "the pod must be an object"),
        (SECRET, "the pod must be an object"),
    ],
)
def test_invalid_pod_is_denied_400_with_the_reason(obj: Any, needle: str) -> None:
    code, answer, ensure = run(review(obj))
    assert code == 200
    message = _denied(answer, 400)
    assert message.startswith("gpu-share: ") and needle in message
    assert SECRET not in message
    assert ensure.calls == []


def test_pod_without_object_is_denied() -> None:
    body = review()
    del body["request"]["object"]
    _, answer, _ = run(body)
    assert "the pod must be an object" in _denied(answer, 400)


@pytest.mark.parametrize("ns", [None, "", "Bad_NS", "x" * 64, 7])
def test_bad_namespace_is_denied(ns: Any) -> None:
    _, answer, _ = run(review(namespace=ns))
    assert "request.namespace" in _denied(answer, 400)


def test_template_conflict_is_denied_409() -> None:
    err = TemplateConflict("resourceclaimtemplate team-a/gpu-share-m4-c30 exists and asks "
                           "something other than gpu-share's template of that name")
    _, answer, _ = run(review(), Ensure(err))
    assert "asks something other" in _denied(answer, 409)


@pytest.mark.parametrize("err", [KubeAccessError("API server unreachable: refused"),
                                 ApiError("create", 403, "forbidden"),
                                 ApiError("create", 500, "x" * 2000)])
def test_api_trouble_is_denied_503(err: KubeAccessError) -> None:
    _, answer, _ = run(review(), Ensure(err))
    assert "cannot ensure the ResourceClaimTemplates" in _denied(answer, 503)


def test_a_bug_is_a_denial_with_the_uid_not_an_http_500() -> None:
    _, answer, _ = run(review(), Ensure(RuntimeError(SECRET)))
    message = _denied(answer, 500)
    assert message == INTERNAL_ERROR and SECRET not in json.dumps(answer)


def _deep(levels: int) -> Any:
    value: Any = SECRET
    for _ in range(levels):
        value = [value]
    return value


def test_nesting_up_to_the_limit_is_read() -> None:
    # The envelope takes 3 levels (review, request, object).
    code, answer, _ = run(review(_deep(MAX_DEPTH - 3)))
    assert code == 200 and "the pod must be an object" in _denied(answer, 400)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\xff\xfe not utf-8",
        f"not json {SECRET}".encode(),
        f'{{"a": NaN, "s": "{SECRET}"}}'.encode(),
        b'{"a": Infinity}',
        f'["{SECRET}"]'.encode(),
        json.dumps(review(_deep(MAX_DEPTH))).encode(),  # a review, too deep inside
        ("[" * 100_000 + "]" * 100_000).encode(),  # past the C parser's own guard
        b"1" * 5000,  # over the int digit limit
        json.dumps({"kind": "AdmissionReview", "request": {"uid": UID}}).encode(),
        json.dumps({**review(), "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
        json.dumps({**review(), "kind": "Pod"}).encode(),
        json.dumps({**review(), "request": SECRET}).encode(),
        json.dumps(review(uid=None)).encode(),
        json.dumps(review(uid=7)).encode(),
        json.dumps(review(uid=SECRET + "\n")).encode(),
        json.dumps(review(uid=f"{SECRET} <b>")).encode(),
        json.dumps(review(uid="u" * 129)).encode(),
    ],
)
def test_malformed_bodies_answer_400_without_echo(body: bytes) -> None:
    code, answer, ensure = run(body)
    assert code == 400 and set(answer) == {"error"}
    assert SECRET not in answer["error"] and len(answer["error"]) <= 300
    assert ensure.calls == []


def test_the_uid_is_echoed_only_when_it_looks_like_one() -> None:
    code, answer, _ = run(review(uid="a.b:c-d_e"))
    assert code == 200 and answer["response"]["uid"] == "a.b:c-d_e"


# ---------------------------------------------------------------- namespace opt-in


class OptedIn:
    def __init__(self, answer: bool | BaseException) -> None:
        self.answer = answer
        self.calls: list[tuple[str, float]] = []

    def __call__(self, namespace: str, deadline: float) -> bool:
        self.calls.append((namespace, deadline))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def _gated(opted: OptedIn, body: dict[str, Any]) -> tuple[dict[str, Any], Ensure]:
    ensure = Ensure()
    m = Mutator(S, ensure, opted_in=opted, budget_s=2.0, clock=lambda: 100.0)
    _, answer = m.handle(json.dumps(body).encode())
    return answer, ensure


def test_a_namespace_that_has_not_opted_in_gets_no_template() -> None:
    """A review the API server's namespaceSelector would not send (someone else reached
    the port): denied, and nothing is created in that namespace."""
    opted = OptedIn(False)
    answer, ensure = _gated(opted, review(namespace="kube-public"))
    assert "not opted in" in _denied(answer, 403)
    assert ensure.calls == [] and opted.calls == [("kube-public", 102.0)]


def test_an_opted_in_namespace_is_translated() -> None:
    opted = OptedIn(True)
    answer, ensure = _gated(opted, review())
    assert response(answer)["allowed"] and ensure.calls == [(["gpu-share-m4-c30"], 102.0)]
    assert opted.calls == [("team-a", 102.0)]


def test_the_namespace_check_failing_is_503() -> None:
    answer, ensure = _gated(OptedIn(KubeAccessError("unreachable")), review())
    assert "cannot ensure" in _denied(answer, 503) and ensure.calls == []


def test_dry_runs_and_pods_without_vcuda_ask_nothing() -> None:
    opted = OptedIn(False)
    _gated(opted, review(dryRun=True))
    pod = gpu_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    _gated(opted, review(pod))
    assert opted.calls == []
