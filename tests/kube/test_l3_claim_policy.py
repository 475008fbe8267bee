"""L3: the chart's claims policy (DRA on), as rendered, on a real kube-apiserver + etcd:
a ResourceClaim or ResourceClaimTemplate configuring our driver may name apiVersion, kind,
a mode other than "none" and a memoryLimit quantity; "none", a memoryLimit that is no
quantity and any other field are refused; other drivers' config is not ours to judge."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kube_fakes import ApiServer
from kubernetes import client as k8s

from testkit.kube_admin import admin_client
from tests.kube.policies import rendered_policy

pytestmark = pytest.mark.apiserver

DRIVER = "gpu-share.vendor.com"
POLICY = "l3-claims"


def _policy() -> list[dict[str, Any]]:
    return rendered_policy("-claims", POLICY, "agentConfig.dra.enabled=true",
                           f"agentConfig.dra.driverName={DRIVER}")


def _claim(name: str, params: Any, driver: str = DRIVER) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {
                "requests": [{"name": "slice", "exactly": {"deviceClassName": "gpu-share"}}],
                "config": [{"requests": ["slice"],
                            "opaque": {"driver": driver, "parameters": params}}]}}}


def _template(name: str, params: Any) -> dict[str, Any]:
    claim = _claim(name, params)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name}, "spec": {"spec": claim["spec"]}}


class Api:
    def __init__(self, api_client: k8s.ApiClient, ns: str) -> None:
        self.custom = k8s.CustomObjectsApi(api_client)
        self.ns = ns

    def create(self, body: dict[str, Any]) -> None:
        plural = "resourceclaims" if body["kind"] == "ResourceClaim" else "resourceclaimtemplates"
        self.custom.create_namespaced_custom_object("resource.k8s.io", "v1", self.ns, plural,
                                                    body)


def _refusal(call: Callable[[], Any]) -> str | None:
    """The policy's message when it refuses, None when created."""
    try:
        call()
    except k8s.ApiException as e:
        if e.status in (403, 422) and "ValidatingAdmissionPolicy" in str(e.body):
            return str(e.body)
        raise
    return None


@pytest.fixture(scope="module")
def api(apiserver: ApiServer) -> Iterator[Api]:
    client = admin_client(apiserver.kubeconfig)
    core = k8s.CoreV1Api(client)
    adm = k8s.AdmissionregistrationV1Api(client)
    ns = f"claims-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    policy, binding = sorted(_policy(), key=lambda o: o["kind"])
    adm.create_validating_admission_policy(policy)
    adm.create_validating_admission_policy_binding(binding)
    a = Api(client, ns)
    try:
        deadline = time.monotonic() + 30
        while _refusal(lambda: a.create(_claim(f"probe-{uuid.uuid4().hex[:6]}",
                                               {"enforcement": "none"}))) is None:
            assert time.monotonic() < deadline, "the claims policy never came into force"
            time.sleep(0.2)
        yield a
    finally:
        adm.delete_validating_admission_policy_binding(POLICY)
        adm.delete_validating_admission_policy(POLICY)
        core.delete_namespace(ns)


@pytest.mark.parametrize("make", [_claim, _template])
def test_a_tenant_may_not_switch_enforcement_off(api: Api, make: Any) -> None:
    for params in ({"enforcement": "none"},
                   {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "SliceConfig",
                    "enforcement": "none"}):
        why = _refusal(lambda p=params: api.create(make(f"off-{uuid.uuid4().hex[:6]}", p)))
        assert why is not None and "switch gpu-share's enforcement off" in why


@pytest.mark.parametrize("make", [_claim, _template])
def test_other_fields_are_refused(api: Api, make: Any) -> None:
    why = _refusal(lambda: api.create(make(f"x-{uuid.uuid4().hex[:6]}",
                                           {"enforcement": "mps", "cores": "100"})))
    assert why is not None and "apiVersion, kind, enforcement and memoryLimit only" in why


@pytest.mark.parametrize("make", [_claim, _template])
def test_a_memory_limit_must_be_a_quantity(api: Api, make: Any) -> None:
    for bad in ("eight", 8192, ["8Gi"]):
        why = _refusal(lambda b=bad: api.create(make(f"m-{uuid.uuid4().hex[:6]}",
                                                     {"memoryLimit": b})))
        assert why is not None and "must be a quantity" in why, bad


@pytest.mark.parametrize("make", [_claim, _template])
def test_raising_or_naming_nothing_is_allowed(api: Api, make: Any) -> None:
    for params in ({"enforcement": "mps"}, {"enforcement": "hami-core"},
                   {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "SliceConfig"},
                   {"enforcement": "nvidia-memory-limits", "memoryLimit": "8Gi"}):
        assert _refusal(lambda p=params: api.create(
            make(f"ok-{uuid.uuid4().hex[:6]}", p))) is None


def test_another_drivers_config_is_not_judged(api: Api) -> None:
    assert _refusal(lambda: api.create(_claim(f"other-{uuid.uuid4().hex[:6]}",
                                              {"enforcement": "none", "x": 1},
                                              driver="gpu.example.com"))) is None
