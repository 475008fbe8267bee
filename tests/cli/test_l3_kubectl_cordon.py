"""L3: ``kubectl gpu-share cordon`` / ``uncordon`` against a real kube-apiserver + etcd
(tests/kube/conftest.py), with the chart's annotations policy (as ``helm template``
renders it) in force and real service-account tokens:

- an operator bound to the chart's cordon ClusterRole cordons and uncordons a device;
  the annotation names the operator as the API server knows it (SelfSubjectReview);
- a tenant that RBAC lets patch nodes is refused by the policy (cordon, uncordon, a
  hand-written value), and so is an operator writing a value naming someone else, an
  oversized value, or a reserved gpu-share annotation;
- ``resourceNames`` in the ClusterRole narrow the cordon right to named devices.

Without the policy's cordon checks the tenant's writes go through: these tests fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_fakes import ApiServer, bind_cluster_role
from kubernetes import client as k8s

from gpu_share.cli import kubectl_plugin as kp
from gpu_share.sharing.annotations import inventory_key
from gpu_share.sharing.cordon import Cordon, cordon_key, parse_cordon
from testkit.harness.wait import until
from testkit.kube_admin import admin_apis, admin_client, allowed
from tests.chart.conftest import CHART, NAMESPACE, RELEASE, helm_path
from tests.cli.objects import DOMAIN, node_obj

pytestmark = pytest.mark.apiserver

POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def rendered() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The annotations policy with its binding, and the cordon ClusterRole."""
    args = [helm_path(4), "template", RELEASE, os.environ.get("GPU_SHARE_L3_CHART") or
            str(CHART), "--namespace", NAMESPACE, "--kube-version", "1.34.0"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    objs = [d for d in yaml.safe_load_all(out) if d]
    policy = [o for o in objs if o["kind"] in POLICY_KINDS
              and o["metadata"]["name"].endswith("-annotations")]
    (role,) = [o for o in objs if o["kind"] == "ClusterRole"
               and o["metadata"]["name"].endswith("-cordon")]
    assert len(policy) == 2
    return policy, role


@dataclass
class Env:
    node: str
    ns: str
    kubeconfig: str
    admin: Any  # CoreV1Api
    apis: dict[str, Any]  # context -> CoreV1Api

    def uuid(self, i: int) -> str:
        return f"GPU-{self.node}-{i}"

    def key(self, i: int) -> str:
        return cordon_key(DOMAIN, self.uuid(i))

    def annotations(self) -> dict[str, str]:
        return dict(self.admin.read_node(self.node).metadata.annotations or {})

    def user(self, who: str) -> str:
        return f"system:serviceaccount:{self.ns}:{who}"


def _refused(call: Callable[[], Any]) -> str:
    with pytest.raises(k8s.ApiException) as ei:
        call()
    assert ei.value.status == 403, (ei.value.status, ei.value.body)
    msg = str(json.loads(ei.value.body)["message"])
    assert "ValidatingAdmissionPolicy" in msg, msg
    return msg


@pytest.fixture(scope="module")
def env(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    policy, role = rendered()
    apis = admin_apis(apiserver.kubeconfig)
    admin, rbac, adm = apis.core, apis.rbac, apis.admission
    tag = uuid.uuid4().hex[:6]
    ns, node = f"cordon-{tag}", f"cordon-node-{tag}"
    admin.create_namespace({"metadata": {"name": ns}})
    body = node_obj(node, [(16, 0, 0, True), (16, 4, 20, True)])
    body.pop("status")
    admin.create_node(body)
    roles = {
        # The chart's role, as rendered.
        "operator": role["rules"],
        # Cordon only device 0 (resourceNames: the device uuid).
        "narrow": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
                   {"apiGroups": [f"gpu-share.{DOMAIN}"], "resources": ["devices"],
                    "verbs": ["cordon"], "resourceNames": [f"GPU-{node}-0"]}],
        # RBAC lets the tenant patch nodes: only the policy can refuse it.
        "tenant": [{"apiGroups": [""], "resources": ["nodes"],
                    "verbs": ["get", "list", "patch", "update"]}],
    }
    kc = yaml.safe_load(Path(apiserver.kubeconfig).read_text())
    cluster = kc["contexts"][0]["context"]["cluster"]
    for who, rules in roles.items():
        admin.create_namespaced_service_account(ns, {"metadata": {"name": who}})
        bind_cluster_role(rbac, f"cordon-{who}-{tag}", rules, ns, who)
        tr = admin.create_namespaced_service_account_token(
            who, ns, {"spec": {"expirationSeconds": 3600}})
        kc["users"].append({"name": who, "user": {"token": tr.status.token}})
        kc["contexts"].append({"name": who, "context": {"cluster": cluster, "user": who}})
    path = tmp_path_factory.mktemp("cordon") / "kubeconfig"
    path.write_text(yaml.safe_dump(kc))
    apis = {who: k8s.CoreV1Api(admin_client(str(path), context=who)) for who in roles}
    e = Env(node, ns, str(path), admin, apis)
    created: list[dict[str, Any]] = []
    try:
        for kind in POLICY_KINDS:
            for obj in policy:
                if obj["kind"] == kind:
                    (adm.create_validating_admission_policy if kind == POLICY_KINDS[0]
                     else adm.create_validating_admission_policy_binding)(obj)
                    created.append(obj)
        probe = {"metadata": {"annotations": {e.key(0): Cordon(e.user("tenant"), "").encode()}}}

        def tenant_refused() -> bool:
            try:
                apis["tenant"].patch_node(node, probe)
            except k8s.ApiException as ex:
                return ex.status == 403 and "ValidatingAdmissionPolicy" in str(ex.body)
            admin.patch_node(node, {"metadata": {"annotations": {e.key(0): None}}})
            return False

        until(tenant_refused, what="the policy in force (and RBAC for the tenant)")
        # ... and the operator's grant has reached the authorizer.
        until(lambda: kp.main(_args(e, "operator", "uncordon", node, "0")) == 0,
              what="operator RBAC")
        yield e
    finally:
        for obj in reversed(created):
            name = obj["metadata"]["name"]
            with contextlib.suppress(k8s.ApiException):
                if obj["kind"] == POLICY_KINDS[1]:
                    adm.delete_validating_admission_policy_binding(name)
                else:
                    adm.delete_validating_admission_policy(name)
        # Other L3 modules write gpu-share annotations as admin: wait until nobody refuses.
        probe_key = {"metadata": {"annotations": {inventory_key(DOMAIN): "{}"}}}
        until(lambda: allowed(lambda: admin.patch_node(node, probe_key)),
              what="the policy removed")
        admin.delete_node(node)
        for who in roles:
            rbac.delete_cluster_role_binding(f"cordon-{who}-{tag}")
            rbac.delete_cluster_role(f"cordon-{who}-{tag}")
        admin.delete_namespace(ns)


def _args(e: Env, who: str, *rest: str) -> list[str]:
    return ["--kubeconfig", e.kubeconfig, "--context", who, "--domain", DOMAIN, *rest]


def test_operator_cordons_and_uncordons(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    assert kp.main(_args(env, "operator", "cordon", env.node, "gpu-1",
                         "--reason", "ECC errors, RMA 1234")) == 0
    out = capsys.readouterr().out
    assert f"node/{env.node} gpu 1 ({env.uuid(1)}) cordoned" in out
    c = parse_cordon(env.annotations()[env.key(1)])
    assert (c.by, c.reason) == (env.user("operator"), "ECC errors, RMA 1234") and c.at
    # The same again changes nothing; `nodes` shows who and why.
    assert kp.main(_args(env, "operator", "cordon", env.node, env.uuid(1),
                         "--reason", "ECC errors, RMA 1234")) == 0
    assert "already cordoned" in capsys.readouterr().out
    assert kp.main(_args(env, "operator", "nodes", env.node, "-o", "json")) == 0
    doc = json.loads(capsys.readouterr().out)
    dev = doc["items"][0]["devices"][1]
    assert dev["cordon"]["by"] == env.user("operator")
    assert dev["cordoned"] is False  # no agent here to honour it
    assert kp.main(_args(env, "operator", "uncordon", env.node, "1")) == 0
    assert "uncordoned" in capsys.readouterr().out
    assert env.key(1) not in env.annotations()
    assert kp.main(_args(env, "operator", "uncordon", env.node, "1")) == 0
    assert "already uncordoned" in capsys.readouterr().out


def test_tenant_cannot_cordon_or_uncordon(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    assert kp.main(_args(env, "tenant", "cordon", env.node, "0", "--reason", "mine")) == 1
    err = capsys.readouterr().err
    assert "may not cordon or uncordon GPUs" in err and env.user("tenant") in err
    tenant = env.apis["tenant"]
    own = Cordon(env.user("tenant"), "x").encode()
    _refused(lambda: tenant.patch_node(env.node, {"metadata": {"annotations": {env.key(0): own}}}))
    # Nor lift an operator's cordon.
    assert kp.main(_args(env, "operator", "cordon", env.node, "0", "--reason", "maint")) == 0
    assert kp.main(_args(env, "tenant", "uncordon", env.node, "0")) == 1
    _refused(lambda: tenant.patch_node(env.node, {"metadata": {"annotations": {env.key(0): None}}}))
    assert env.key(0) in env.annotations()
    assert kp.main(_args(env, "operator", "uncordon", env.node, "0")) == 0
    capsys.readouterr()


def test_the_value_must_name_its_writer(env: Env) -> None:
    op = env.apis["operator"]

    def write(value: str) -> Any:
        return op.patch_node(env.node, {"metadata": {"annotations": {env.key(0): value}}})

    msg = _refused(lambda: write(Cordon("alice", "framed").encode()))
    assert "must name its writer" in msg
    _refused(lambda: write(Cordon(env.user("operator"), "x" * 1100).encode()))
    _refused(lambda: write('{"reason":"x","by":"' + env.user("operator") + '"}'))
    write(Cordon(env.user("operator"), "by hand").encode())
    op.patch_node(env.node, {"metadata": {"annotations": {env.key(0): None}}})
    # The cordon right is no licence for the agent's own annotations.
    msg = _refused(lambda: op.patch_node(
        env.node, {"metadata": {"annotations": {inventory_key(DOMAIN): "{}"}}}))
    assert "is reserved for the gpu-share agent" in msg


def test_resource_names_narrow_the_right_to_devices(env: Env) -> None:
    assert kp.main(_args(env, "narrow", "cordon", env.node, "0")) == 0
    assert kp.main(_args(env, "narrow", "cordon", env.node, "1")) == 1
    assert env.key(0) in env.annotations() and env.key(1) not in env.annotations()
    assert kp.main(_args(env, "narrow", "uncordon", env.node, "0")) == 0


def test_unknown_device_and_node_are_clear_errors(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kp.main(_args(env, "operator", "cordon", env.node, "7")) == 1
    err = capsys.readouterr().err
    assert "has no device '7'" in err and env.uuid(1) in err
    assert kp.main(_args(env, "operator", "cordon", "no-such-node", "0")) == 1
    assert 'node "no-such-node" not found' in capsys.readouterr().err
