"""The chart's scheduler block renders the extender wiring and exactly EXTENDER_RULES."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_share.kube.extender_rbac import EXTENDER_RULES

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpu-share"


def _helm() -> str:
    found = sorted(Path.home().glob(".cache/gpu-share/tools/helm-*/helm"))
    if not found:
        pytest.skip("no helm under ~/.cache/gpu-share/tools (hack/install-tools.sh)")
    return str(found[-1])


def render(*sets: str) -> list[dict[str, Any]]:
    args = [_helm(), "template", "t", str(CHART), "--namespace", "gs"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_disabled_by_default() -> None:
    assert not [
        d
        for d in render()
        if "scheduler" in d["metadata"]["name"] or "extender" in d["metadata"]["name"]
    ]


def test_scheduler_block() -> None:
    docs = render("scheduler.enabled=true")
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    cfg = yaml.safe_load(by[("ConfigMap", "t-gpu-share-scheduler")]["data"]["config.yaml"])
    assert cfg["profiles"][0]["schedulerName"] == "gpu-share-scheduler"
    ext = cfg["extenders"][0]
    # Default sidecar mode: the extender is a container of the scheduler pod, on loopback
    # (tests/chart/test_security.py covers both modes).
    assert ext["urlPrefix"] == "http://127.0.0.1:8888"
    assert ext["nodeCacheCapable"] is True and ext["bindVerb"] == "bind"
    assert [r["name"] for r in ext["managedResources"]] == [
        "vendor.com/vcuda-memory",
        "vendor.com/vcuda-core",
    ]
    sched = by[("Deployment", "t-gpu-share-scheduler")]["spec"]["template"]["spec"]
    assert sched["containers"][0]["image"] == "registry.k8s.io/kube-scheduler:v1.34.4"
    assert ("Secret", "t-gpu-share-decision-key") in by
    role = by[("ClusterRole", "t-gpu-share-gs-extender")]
    got = [(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in role["rules"]]
    assert got == list(EXTENDER_RULES)


def test_existing_secret_is_used() -> None:
    docs = render("scheduler.enabled=true", "scheduler.decisionKey.existingSecret=mine")
    assert not [d for d in docs if d["kind"] == "Secret"]
    sched = next(
        d
        for d in docs
        if d["metadata"]["name"] == "t-gpu-share-scheduler" and d["kind"] == "Deployment"
    )
    vols = {v["name"]: v for v in sched["spec"]["template"]["spec"]["volumes"]}
    assert vols["decision-key"]["secret"]["secretName"] == "mine"
