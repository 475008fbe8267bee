"""helm lint/template of the default values and every values-examples file, with helm 3
and helm 4, and every rendered object against the strict Kubernetes schemas."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_share.config.model import AgentConfig
from tests.chart.conftest import (
    CHART,
    EXAMPLES,
    KUBE_MINORS,
    RELEASE,
    by_kind,
    helm_path,
    k8s_validator,
    one,
    render,
    render_error,
)

# (id, values files): the default values plus each example.
CASES = [("default", ()), *[(p.stem, (p,)) for p in EXAMPLES]]
CASE_IDS = [c[0] for c in CASES]
# Kinds from CRDs the Kubernetes schemas do not know.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def test_every_example_starts_with_when_to_use_it() -> None:
    assert len(EXAMPLES) >= 7
    for path in EXAMPLES:
        first = path.read_text().splitlines()[0]
        assert first.startswith("# Use when:"), f"{path.name}: {first!r}"


@pytest.mark.parametrize(("case", "values"), CASES, ids=CASE_IDS)
def test_lint_strict(helm: str, case: str, values: tuple[Path, ...]) -> None:
    args = [helm, "lint", "--strict", str(CHART)]
    for v in values:
        args += ["-f", str(v)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _without_generated(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The render minus what is random per render: generated Secret data (decision key,
    extender and webhook certificates), the pod annotations hashing them and the webhook
    configurations' caBundle."""
    out = copy.deepcopy(objs)
    for obj in out:
        if obj["kind"] == "Secret":
            obj["data"] = sorted(obj["data"])
        ann = obj.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations", {})
        for key in ("checksum/extender-tls", "checksum/decision-key", "checksum/tls"):
            ann.pop(key, None)
        for hook in obj.get("webhooks", []):
            hook.get("clientConfig", {}).pop("caBundle", None)
    # The same objects; helm 3 and 4 order kinds they do not know (DeviceClass) apart.
    return sorted(out, key=lambda o: (o["kind"], o["metadata"]["name"]))


@pytest.mark.parametrize(("case", "values"), CASES, ids=CASE_IDS)
def test_helm3_and_helm4_render_the_same(case: str, values: tuple[Path, ...]) -> None:
    assert _without_generated(render(helm_path(3), values)) == _without_generated(
        render(helm_path(4), values)
    )


@pytest.mark.parametrize("minor", KUBE_MINORS)
@pytest.mark.parametrize(("case", "values"), CASES, ids=CASE_IDS)
def test_objects_match_kubernetes_schema(minor: str, case: str, values: tuple[Path, ...]) -> None:
    # Same render for every minor except the admission policies (1.30+; below, rendering
    # needs the explicit opt-out). An example that says "Needs: Kubernetes 1.NN+" (DRA)
    # is refused by the chart below that, as test_dra_example_needs_1_34 shows.
    needs = _needs_minor(values)
    if needs and tuple(map(int, minor.split("."))) < needs:
        pytest.skip(f"{case} needs Kubernetes {needs[0]}.{needs[1]}+")
    sets = ["admissionPolicy.allowUnprotected=true"] if minor == "1.29" else []
    objs = render(helm_path(4), values, sets=sets, kube=f"{minor}.0", vap=True)
    kinds = set()
    for obj in objs:
        kinds.add(obj["kind"])
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            continue
        validator = k8s_validator(minor, obj["apiVersion"], obj["kind"])
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        assert not errors, (
            f"{obj['kind']}/{obj['metadata']['name']} invalid on {minor}: "
            + "; ".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5])
        )
    assert {"DaemonSet", "ConfigMap", "ServiceAccount", "ClusterRole", "Service", "Pod"} <= kinds
    assert ("ValidatingAdmissionPolicy" in kinds) == (minor != "1.29")


def _needs_minor(values: tuple[Path, ...]) -> tuple[int, int] | None:
    for v in values:
        m = re.search(r"Needs: Kubernetes (\d+)\.(\d+)\+", v.read_text())
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def test_dra_example_needs_1_34() -> None:
    dra = [p for p in EXAMPLES if p.stem == "dra"]
    assert _needs_minor(tuple(dra)) == (1, 34)
    assert "DRA mode needs Kubernetes 1.34+" in render_error(helm_path(4), dra, kube="1.33.0")
    kinds = {o["kind"] for o in render(helm_path(4), dra, kube="1.34.0")}
    assert {"DeviceClass", "MutatingWebhookConfiguration"} <= kinds


def test_admission_policies_render_from_1_30_even_offline() -> None:
    """Item 13: the policies no longer depend on the API list, which offline renders
    (`helm template` without --api-versions, GitOps tools) never carry: the old gate
    dropped them silently there."""
    helm = helm_path(4)
    for vap in (True, False):
        kinds = [o["kind"] for o in render(helm, kube="1.30.0", vap=vap)]
        assert kinds.count("ValidatingAdmissionPolicy") == 3, vap
        assert kinds.count("ValidatingAdmissionPolicyBinding") == 3, vap
    off = render(helm, sets=["admissionPolicy.enabled=false"], kube="1.34.0", vap=True)
    assert not by_kind(off, "ValidatingAdmissionPolicy")
    assert not by_kind(off, "ValidatingAdmissionPolicyBinding")


def test_admission_policy_scopes_writes_to_the_own_node() -> None:
    objs = render(helm_path(4))
    vap = one(objs, "ValidatingAdmissionPolicy", "-own-node")
    policy = vap["spec"]
    binding = one(objs, "ValidatingAdmissionPolicyBinding", "-own-node")["spec"]
    assert binding["validationActions"] == ["Deny"]
    assert binding["policyName"] == vap["metadata"]["name"]
    rules = policy["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["nodes", "pods"],
        }
    ]
    sa = by_kind(objs, "ServiceAccount")[0]["metadata"]
    assert (
        f'"system:serviceaccount:{sa["namespace"]}:{sa["name"]}"'
        in policy["matchConditions"][0]["expression"]
    )
    text = str(policy)
    assert "authentication.kubernetes.io/node-name" in text
    assert "object.metadata.name == variables.nodeName" in text
    assert "oldObject.spec.nodeName == variables.nodeName" in text


def test_service_monitor_only_when_enabled() -> None:
    helm = helm_path(4)
    assert not by_kind(render(helm), "ServiceMonitor")
    objs = render(helm, sets=["metrics.serviceMonitor.enabled=true"])
    (monitor,) = by_kind(objs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    selector = monitor["spec"]["selector"]["matchLabels"]
    for svc in by_kind(objs, "Service"):
        assert selector.items() <= svc["metadata"]["labels"].items()
    assert RELEASE in monitor["metadata"]["name"]



def test_scheduler_enabled_mounts_the_decision_key_into_the_agent(helm: str) -> None:
    """The agent follows the extender only with the key: mounted and named in config."""
    docs = render(helm, ["values-examples/dummy-npu.yaml"], ["scheduler.enabled=true"])
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    assert mounts["decision-key"]["mountPath"] == "/etc/gpu-share-decision"
    assert vols["decision-key"]["secret"]["secretName"].endswith("-decision-key")
    cms = [d for d in docs if d["kind"] == "ConfigMap"
           and d["metadata"]["labels"].get("app.kubernetes.io/component") == "agent"]
    assert cms
    for cm in cms:
        cfg = AgentConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
        assert cfg.placement.decision_key_file == "/etc/gpu-share-decision/key"


def _scheduler_config(helm: str, sets: list[str]) -> dict[str, Any]:
    docs = render(helm, ["values-examples/dummy-npu.yaml"], ["scheduler.enabled=true", *sets])
    cm = one(docs, "ConfigMap", "-scheduler")
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return cfg


def test_scheduler_samples_nodes_adaptively_unless_told_otherwise(helm: str) -> None:
    assert _scheduler_config(helm, [])["percentageOfNodesToScore"] == 0
    sampled = _scheduler_config(helm, ["scheduler.percentageOfNodesToScore=20"])
    assert sampled["percentageOfNodesToScore"] == 20
    assert _scheduler_config(helm, ["scheduler.percentageOfNodesToScore=100"])[
        "percentageOfNodesToScore"] == 100
    err = render_error(helm, ["values-examples/dummy-npu.yaml"],
                       ["scheduler.enabled=true", "scheduler.percentageOfNodesToScore=101"])
    assert "percentageOfNodesToScore" in err
