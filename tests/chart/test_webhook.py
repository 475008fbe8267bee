"""The DRA admission webhook in the chart (webhook.*): off by default, only with a DRA
pool, exactly WEBHOOK_RULES, the agents' unit/names/driver as its flags (parsed by
gpu-share-webhook itself), the webhook configuration the design asks for, a generated
certificate that the webhook's own TLS context serves to a client trusting the caBundle,
kept across upgrades (the lookup logic rendered with a given "old" Secret), and
cert-manager instead. L4: tests/e2e/test_12_dra_webhook.py (install, upgrade keeps the
certificate, a pod translated and running)."""

from __future__ import annotations

import base64
import functools
import json
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_share.cli.webhook_main import namespace_label_of, parse_args, settings_of
from gpu_share.kube.claim_templates import WEBHOOK_RULES
from gpu_share.sharing.model import ResourceNames
from gpu_share.webhook.tls import server_context
from tests.chart.conftest import (
    CHART,
    HELM_TIMEOUT_S,
    NAMESPACE,
    RELEASE,
    by_kind,
    helm_path,
    k8s_validator,
    one,
    render,
    render_error,
    tls_handshake,
)

DRA = "agentConfig.dra.enabled=true"
ON = [DRA, "webhook.enabled=true"]
FN = f"{RELEASE}-gpu-share"
NAME = f"{FN}-webhook"
SECRET = f"{NAME}-tls"
DRIVER = "gpu-share.vendor.com"
TLS_DIR = "/etc/gpu-share-webhook-tls"
WEBHOOK_KINDS = {
    "Deployment",
    "Service",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "PodDisruptionBudget",
    "Secret",
    "MutatingWebhookConfiguration",
    "NetworkPolicy",
}


def _mine(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o
        for o in objs
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "webhook"
    ]


def _pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objs, "Deployment", NAME)["spec"]["template"]["spec"]
    return spec


def _args(objs: list[dict[str, Any]]) -> list[str]:
    args: list[str] = _pod(objs)["containers"][0]["args"]
    return args


def _hook(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (hook,) = one(objs, "MutatingWebhookConfiguration")["webhooks"]
    return dict(hook)


def _secret(objs: list[dict[str, Any]]) -> dict[str, bytes]:
    s = one(objs, "Secret", SECRET)
    return {k: base64.b64decode(v) for k, v in s["data"].items()}


# ---------------------------------------------------------------- on / off


@pytest.mark.parametrize("sets", [[], [DRA]], ids=["default", "dra-pool"])
def test_off_by_default(sets: list[str]) -> None:
    objs = render(helm_path(4), sets=sets)
    assert not _mine(objs)
    assert not by_kind(objs, "MutatingWebhookConfiguration")


def test_needs_a_dra_pool(helm: str) -> None:
    err = render_error(helm, sets=["webhook.enabled=true"])
    assert "webhook.enabled" in err and "agentConfig.dra.enabled" in err, err


def test_dra_pools_must_agree(tmp_path: Path) -> None:
    pools = [
        {"name": "a", "nodeSelector": {"pool": "a"}, "agentConfig": {"dra": {"enabled": True}}},
        {
            "name": "b",
            "nodeSelector": {"pool": "b"},
            "agentConfig": {"dra": {"enabled": True}, "memoryUnitMiB": 512},
        },
    ]
    path = tmp_path / "v.yaml"
    path.write_text(json.dumps({"nodePools": pools, "webhook": {"enabled": True}}))
    err = render_error(helm_path(4), [path])
    assert "DRA pools differ" in err and "memoryUnitMiB" in err, err
    # A device-plugin pool with other settings next to them is fine.
    pools[1]["agentConfig"] = {"memoryUnitMiB": 512}
    fine = tmp_path / "fine.yaml"
    fine.write_text(json.dumps({"nodePools": pools, "webhook": {"enabled": True}}))
    assert "--memory-unit-mib=1024" in _args(render(helm_path(4), [fine]))


def test_renders_everything_with_both_helms(helm: str) -> None:
    objs = render(helm, sets=ON)
    assert {o["kind"] for o in _mine(objs)} == WEBHOOK_KINDS
    assert all(
        o["metadata"]["name"].startswith(NAME) or "-webhook" in o["metadata"]["name"]
        for o in _mine(objs)
    )
    assert not by_kind(objs, "Certificate") and not by_kind(objs, "Issuer")
    dep = one(objs, "Deployment", NAME)
    assert dep["spec"]["replicas"] == 2
    pdb = one(objs, "PodDisruptionBudget", NAME)["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("minor", ["1.34", "1.35"])
def test_objects_match_kubernetes_schema(minor: str) -> None:
    for sets in (ON, [*ON, "webhook.url=https://10.0.0.9:8443/mutate", "webhook.hostNetwork=true"]):
        for obj in _mine(render(helm_path(4), sets=sets, kube=f"{minor}.0")):
            errors = list(k8s_validator(minor, obj["apiVersion"], obj["kind"]).iter_errors(obj))
            assert not errors, f"{obj['kind']}: {[e.message for e in errors[:5]]}"


# ---------------------------------------------------------------- pod, flags, RBAC


def test_same_image_and_restricted_pod_security() -> None:
    objs = render(helm_path(4), sets=[*ON, "image.tag=v9", "imagePullSecrets[0].name=reg"])
    pod = _pod(objs)
    agent = one(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    (c,) = pod["containers"]
    assert c["image"] == agent["image"] == "ghcr.io/gpu-share/gpu-share:v9"
    assert c["command"] == ["gpu-share-webhook"]
    assert pod["imagePullSecrets"] == [{"name": "reg"}]
    assert pod["serviceAccountName"] == NAME
    assert pod["priorityClassName"] == "system-cluster-critical"
    # Restricted PodSecurity: non-root, no escalation, no capabilities, RuntimeDefault.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "hostNetwork" not in pod
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS"
        assert c[probe]["httpGet"]["port"] == "https"
    assert c["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    (mount,) = c["volumeMounts"]
    assert mount == {"name": "tls", "mountPath": TLS_DIR, "readOnly": True}
    assert pod["volumes"] == [{"name": "tls", "secret": {"secretName": SECRET}}]


def test_cluster_role_equals_webhook_rules() -> None:
    objs = render(helm_path(4), sets=ON)
    role = one(objs, "ClusterRole", "-webhook")
    got = [(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in role["rules"]]
    assert got == list(WEBHOOK_RULES)
    assert all(set(r) == {"apiGroups", "resources", "verbs"} for r in role["rules"])
    crb = one(objs, "ClusterRoleBinding", "-webhook")
    assert crb["roleRef"]["name"] == role["metadata"]["name"]
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    # The agent's role is not widened by the webhook.
    agent = one(objs, "ClusterRole", "-agent")
    assert "resourceclaimtemplates" not in json.dumps(agent["rules"])
    without = render(helm_path(4), sets=[*ON, "rbac.create=false"])
    assert not by_kind(_mine(without), "ClusterRole") and not by_kind(
        _mine(without), "ServiceAccount"
    )


@pytest.mark.parametrize(
    ("sets", "unit", "names", "driver"),
    [
        ([], 1024, ("vendor.com/vcuda-memory", "vendor.com/vcuda-core"), DRIVER),
        (
            [
                "agentConfig.memoryUnitMiB=256",
                "agentConfig.resources.domain=example.com",
                "agentConfig.resources.memoryName=gmem",
                "agentConfig.resources.coreName=gcore",
                "agentConfig.dra.driverName=gpu.example.com",
            ],
            256,
            ("example.com/gmem", "example.com/gcore"),
            "gpu.example.com",
        ),
    ],
    ids=["defaults", "custom"],
)
def test_flags_are_the_agents_settings(
    sets: list[str], unit: int, names: tuple[str, str], driver: str
) -> None:
    """The webhook translates with the agents' memoryUnitMiB, resource names and driver
    (as gpu-share-webhook itself parses the rendered flags); the configuration's name
    and matchConditions follow."""
    objs = render(helm_path(4), sets=[*ON, *sets])
    cfg = yaml.safe_load(one(objs, "ConfigMap", "-config")["data"]["config.yaml"])
    assert cfg["memoryUnitMiB"] == unit
    args = _args(objs)
    assert f"--memory-unit-mib={unit}" in args
    settings = settings_of(parse_args(args))
    assert settings.names == ResourceNames(*names)
    assert settings.memory_unit_mib == unit
    assert settings.device_class == driver == cfg["dra"]["driverName"]
    hook = _hook(objs)
    assert hook["name"] == f"claims.{driver}"
    expr = hook["matchConditions"][0]["expression"]
    assert all(expr.count(f'"{n}"') == 4 for n in names), expr
    assert one(objs, "DeviceClass")["metadata"]["name"] == driver


@pytest.mark.parametrize("label", [("gpu-share.vendor.com/dra", "enabled"), ("team/gpu", "yes")])
def test_the_webhook_checks_the_label_its_configuration_selects(label: tuple[str, str]
                                                                ) -> None:
    """The namespace label the webhook checks itself before creating templates is the
    one the configuration's namespaceSelector matches."""
    sets = [f"webhook.namespaceLabel.key={label[0]}", f"webhook.namespaceLabel.value={label[1]}"]
    objs = render(helm_path(4), sets=[*ON, *sets])
    assert namespace_label_of(parse_args(_args(objs))) == label
    assert _hook(objs)["namespaceSelector"]["matchLabels"] == {label[0]: label[1]}


# ---------------------------------------------------------------- webhook configuration


def test_webhook_configuration() -> None:
    objs = render(helm_path(4), sets=ON)
    hook = _hook(objs)
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["timeoutSeconds"] == 5
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["namespaceSelector"] == {
        "matchLabels": {"gpu-share.vendor.com/dra": "enabled"},
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": [NAMESPACE, "kube-system"],
            }
        ],
    }
    cond = hook["matchConditions"][0]["expression"]
    for part in ("object.spec.containers", "object.spec.initContainers", ".limits", ".requests"):
        assert part in cond
    svc = one(objs, "Service", NAME)
    assert hook["clientConfig"]["service"] == {
        "name": NAME,
        "namespace": NAMESPACE,
        "path": "/mutate",
        "port": 443,
    }
    assert svc["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]
    dep = one(objs, "Deployment", NAME)
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == _secret(objs)["ca.crt"]
    other = render(
        helm_path(4),
        sets=[*ON, "webhook.namespaceLabel.key=team/gpu", "webhook.namespaceLabel.value=dra"],
    )
    assert _hook(other)["namespaceSelector"]["matchLabels"] == {"team/gpu": "dra"}


def test_network_policy_opens_only_the_webhook_port() -> None:
    objs = render(helm_path(4), sets=[*ON, "webhook.port=9443"])
    np = one(objs, "NetworkPolicy", NAME)["spec"]
    assert (
        np["podSelector"]["matchLabels"]
        == (one(objs, "Deployment", NAME)["spec"]["selector"]["matchLabels"])
    )
    assert np["policyTypes"] == ["Ingress"]
    assert np["ingress"] == [{"ports": [{"port": 9443, "protocol": "TCP"}]}]
    assert "--port=9443" in _args(objs)
    peers = '[{"ipBlock":{"cidr":"10.1.0.0/24"}}]'
    limited = render(helm_path(4), sets=[*ON, f"json:webhook.networkPolicy.from={peers}"])
    assert one(limited, "NetworkPolicy", NAME)["spec"]["ingress"][0]["from"] == json.loads(peers)
    off = render(helm_path(4), sets=[*ON, "webhook.networkPolicy.enabled=false"])
    assert not by_kind(_mine(off), "NetworkPolicy")


# ---------------------------------------------------------------- TLS


def _handshake(sctx: ssl.SSLContext, ca: bytes, hostname: str) -> str:
    """One TLS connection over loopback, verified as the API server does (caBundle,
    server name); "ok" or the error."""
    return tls_handshake(sctx, ssl.create_default_context(cadata=ca.decode()), hostname)


def _serving(tmp: Path, objs: list[dict[str, Any]]) -> ssl.SSLContext:
    data = _secret(objs)
    for k in ("tls.crt", "tls.key"):
        (tmp / k).write_bytes(data[k])
    args = parse_args(_args(objs))
    assert args.tls_cert_file == f"{TLS_DIR}/tls.crt" and args.tls_key_file == f"{TLS_DIR}/tls.key"
    return server_context(str(tmp / "tls.crt"), str(tmp / "tls.key"))


def test_generated_certificate_serves_the_service_names(tmp_path: Path) -> None:
    objs = render(helm_path(3), sets=ON)
    ca = base64.b64decode(_hook(objs)["clientConfig"]["caBundle"])
    sctx = _serving(tmp_path, objs)
    # The API server dials <service>.<namespace>.svc.
    for host in (f"{NAME}.{NAMESPACE}.svc", f"{NAME}.{NAMESPACE}", NAME):
        assert _handshake(sctx, ca, host) == "ok", host
    assert _handshake(sctx, ca, "evil.example.com") != "ok"
    other = base64.b64decode(_hook(render(helm_path(4), sets=ON))["clientConfig"]["caBundle"])
    assert other != ca and _handshake(sctx, other, f"{NAME}.{NAMESPACE}.svc") != "ok"
    assert one(objs, "Secret", SECRET)["type"] == "kubernetes.io/tls"


def test_url_mode_calls_the_url_with_its_host_in_the_certificate(tmp_path: Path) -> None:
    url = "https://127.0.0.1:8443/mutate"
    objs = render(helm_path(4), sets=[*ON, f"webhook.url={url}", "webhook.hostNetwork=true"])
    cc = _hook(objs)["clientConfig"]
    assert cc["url"] == url and "service" not in cc
    assert _pod(objs)["hostNetwork"] is True
    strategy = one(objs, "Deployment", NAME)["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    sctx = _serving(tmp_path, objs)
    assert _handshake(sctx, base64.b64decode(cc["caBundle"]), "127.0.0.1") == "ok"
    names = json.loads(
        one(objs, "Secret", SECRET)["metadata"]["annotations"][
            "gpu-share.vendor.com/certificate-names"
        ]
    )
    assert names["ips"] == ["127.0.0.1"]
    dns = render(helm_path(4), sets=[*ON, "webhook.url=https://hook.example.com/mutate"])
    assert (
        "hook.example.com"
        in one(dns, "Secret", SECRET)["metadata"]["annotations"][
            "gpu-share.vendor.com/certificate-names"
        ]
    )
    bad = render_error(helm_path(4), sets=[*ON, "webhook.url=http://x/mutate"])
    assert "webhook.url" in bad or "webhook/url" in bad, bad


# `helm template` cannot `lookup`: a copy of the chart renders the same helper the webhook
# template calls with a given "old" Secret (as lookup would return it) into a ConfigMap.
_TLS_CM = """apiVersion: v1
kind: ConfigMap
metadata:
  name: tls-under-test
data:
{{- $old := .Values.oldSecret | default dict }}
  tls: {{ include "gpu-share.webhookTLS" (dict "root" . "old" $old) | quote }}
"""


@functools.cache
def _tls_chart(tmp_root: str) -> Path:
    copy = Path(tmp_root) / "gpu-share"
    shutil.copytree(CHART, copy)
    (copy / "templates" / "zz-tls-under-test.yaml").write_text(_TLS_CM)
    schema = json.loads((copy / "values.schema.json").read_text())
    schema["properties"]["oldSecret"] = {"type": "object"}
    (copy / "values.schema.json").write_text(json.dumps(schema))
    return copy


def _tls_with_old(tmp: Path, old: dict[str, Any] | None, *sets: str) -> dict[str, Any]:
    chart = _tls_chart(str(tmp))
    values = tmp / "old.json"
    values.write_text(json.dumps({"oldSecret": old} if old is not None else {}))
    args = [
        helm_path(4),
        "template",
        RELEASE,
        str(chart),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        "1.34.0",
        "-s",
        "templates/zz-tls-under-test.yaml",
        "-f",
        str(values),
        "--set",
        DRA,
        "--set",
        "webhook.enabled=true",
    ]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    (cm,) = [d for d in yaml.safe_load_all(proc.stdout) if d]
    out: dict[str, Any] = json.loads(cm["data"]["tls"])
    return out


def test_existing_secret_is_reused_on_upgrade(tmp_path: Path) -> None:
    """What the webhook template does with `lookup`'s answer: the stored Secret's data
    is kept when it is complete and made for the same names, else a new pair is made.
    (L4: story 12a upgrades the release and sees the same certificate and caBundle.)"""
    first = _tls_with_old(tmp_path, None)
    assert first["reused"] is False
    assert set(first["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    stored = {
        "metadata": {"annotations": {"gpu-share.vendor.com/certificate-names": first["names"]}},
        "data": first["data"],
    }
    again = _tls_with_old(tmp_path, stored)
    assert again["reused"] is True and again["data"] == first["data"]
    # Incomplete: regenerated.
    partial = {**stored, "data": {k: v for k, v in first["data"].items() if k != "tls.key"}}
    assert _tls_with_old(tmp_path, partial)["data"]["ca.crt"] != first["data"]["ca.crt"]
    # Made for other names (webhook.url set since): regenerated with the new names.
    moved = _tls_with_old(tmp_path, stored, "webhook.url=https://127.0.0.1:8443/mutate")
    assert moved["reused"] is False and moved["data"]["ca.crt"] != first["data"]["ca.crt"]
    assert "127.0.0.1" in moved["names"]
    # A Secret without our annotation (written by someone else) is not trusted either.
    foreign = {"data": first["data"]}
    assert _tls_with_old(tmp_path, foreign)["reused"] is False


# ---------------------------------------------------------------- cert-manager


def test_cert_manager_issues_and_injects_instead(helm: str) -> None:
    objs = render(helm, sets=[*ON, "webhook.certManager.enabled=true"])
    assert not by_kind(_mine(objs), "Secret")
    issuer = one(objs, "Issuer", NAME)
    assert issuer["apiVersion"] == "cert-manager.io/v1" and issuer["spec"] == {"selfSigned": {}}
    cert = one(objs, "Certificate", NAME)
    assert cert["apiVersion"] == "cert-manager.io/v1"
    assert cert["spec"]["secretName"] == SECRET == _pod(objs)["volumes"][0]["secret"]["secretName"]
    assert f"{NAME}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {"name": NAME, "kind": "Issuer", "group": "cert-manager.io"}
    mwc = one(objs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{NAME}"
    }
    assert "caBundle" not in mwc["webhooks"][0]["clientConfig"]
    # An existing issuer: no Issuer of ours.
    ref = '{"name":"corp-ca","kind":"ClusterIssuer","group":"cert-manager.io"}'
    own = render(
        helm,
        sets=[*ON, "webhook.certManager.enabled=true", f"json:webhook.certManager.issuerRef={ref}"],
    )
    assert not by_kind(own, "Issuer")
    assert one(own, "Certificate", NAME)["spec"]["issuerRef"] == json.loads(ref)


def test_with_the_scheduler_pods_are_marked_for_the_extender() -> None:
    """With scheduler.enabled the webhook keeps a translated pod's vcuda keys at 0 (so
    kube-scheduler asks the extender about it), the extender knows the DRA driver whose
    claims it reads at bind, and may read them."""
    plain = render(helm_path(4), sets=ON)
    assert "--mark-for-extender" not in _args(plain)
    objs = render(helm_path(4), sets=[*ON, "scheduler.enabled=true"])
    assert "--mark-for-extender" in _args(objs)
    a = parse_args(_args(objs))
    assert settings_of(a).mark_for_extender
    containers = [c for d in by_kind(objs, "Deployment")
                  for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"]
    assert containers and all(f"--dra-driver={DRIVER}" in c["args"] for c in containers)
    rules = [r for cr in by_kind(objs, "ClusterRole") if cr["metadata"]["name"].endswith(
        "-extender") for r in cr["rules"]]
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
            "verbs": ["get"]} in rules


def test_scheduler_feature_gates(helm: str) -> None:
    """DRA pods on 1.34/1.35 need the chart's kube-scheduler to have consumable capacity
    on (alpha there); the value is checked by the schema."""
    gate = "scheduler.featureGates=DRAConsumableCapacity=true"
    objs = render(helm_path(4), sets=[*ON, "scheduler.enabled=true", gate])
    sched = [c for d in by_kind(objs, "Deployment")
             for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "kube-scheduler"]
    assert sched and all("--feature-gates=DRAConsumableCapacity=true" in c["command"]
                         for c in sched)
    plain = render(helm_path(4), sets=[*ON, "scheduler.enabled=true"])
    assert not any(a.startswith("--feature-gates") for d in by_kind(plain, "Deployment")
                   for c in d["spec"]["template"]["spec"]["containers"]
                   for a in c.get("command", []))
    err = render_error(helm, sets=[*ON, "scheduler.enabled=true",
                                   "scheduler.featureGates=x; rm -rf /"])
    assert "featureGates" in err, err
