"""The decision key rolls the pods that read it, and the scheduler's host-network values.

Every pod that reads the extender's decision key at start (the scheduler pod with its
sidecar extender, the service-mode extender, every agent DaemonSet) carries
``checksum/decision-key``: the SHA-256 of the key as its Secret holds it. Rotating the
key (delete the chart's Secret, `helm upgrade`) changes it, so they roll; an upgrade that
keeps the key keeps it. `helm template` cannot `lookup`: a copy of the chart reads the
"stored" Secret from a value instead, through the same helper.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import (
    CHART,
    HELM_TIMEOUT_S,
    KUBE_MINORS,
    NAMESPACE,
    RELEASE,
    by_kind,
    helm_path,
    k8s_validator,
    one,
    render,
)

SIDECAR = ["scheduler.enabled=true"]
SERVICE = [*SIDECAR, "scheduler.extender.mode=service"]
ANNOTATION = "checksum/decision-key"
LOOKUP = (
    '{{- lookup "v1" "Secret" .Release.Namespace (include "gpu-share.decisionKeySecret" .)'
    " | default dict | toJson -}}"
)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _sums(objs: list[dict[str, Any]]) -> dict[str, str | None]:
    """Pod template name -> its checksum/decision-key (None: none)."""
    return {
        f"{o['kind']}/{o['metadata']['name']}":
            o["spec"]["template"]["metadata"].get("annotations", {}).get(ANNOTATION)
        for o in objs if o["kind"] in ("Deployment", "DaemonSet")
    }


def _key(objs: list[dict[str, Any]]) -> str:
    return str(one(objs, "Secret", "decision-key")["data"]["key"])


@pytest.mark.parametrize("sets", [SIDECAR, SERVICE], ids=["sidecar", "service"])
def test_every_reader_of_the_key_carries_its_checksum(helm: str, sets: list[str]) -> None:
    objs = render(helm, sets=[*sets, "json:nodePools=" + json.dumps([
        {"name": "a", "nodeSelector": {"pool": "a"}},
        {"name": "b", "nodeSelector": {"pool": "b"}}])])
    want = _sha(_key(objs))  # one random key per render, the same in every template
    sums = _sums(objs)
    readers = {"DaemonSet/gs-gpu-share-a", "DaemonSet/gs-gpu-share-b",
               "Deployment/gs-gpu-share-scheduler" if sets == SIDECAR
               else "Deployment/gs-gpu-share-extender"}
    assert {k for k, v in sums.items() if v} == readers
    assert {sums[k] for k in readers} == {want}
    assert len(base64.b64decode(_key(objs))) == 48


def test_no_scheduler_no_key_and_no_checksum(helm: str) -> None:
    objs = render(helm)
    assert not [s for s in by_kind(objs, "Secret") if "decision-key" in s["metadata"]["name"]]
    assert set(_sums(objs).values()) == {None}


# ---------------------------------------------------------------- with a stored Secret


@functools.cache
def _lookup_chart(tmp_root: str) -> Path:
    copy = Path(tmp_root) / "gpu-share"
    shutil.copytree(CHART, copy)
    helpers = copy / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    assert text.count(LOOKUP) == 1, "the decision key's lookup moved: update this test"
    helpers.write_text(text.replace(LOOKUP, "{{- .Values.storedDecisionKey | toJson -}}"))
    schema = json.loads((copy / "values.schema.json").read_text())
    schema["properties"]["storedDecisionKey"] = {"type": "object"}
    (copy / "values.schema.json").write_text(json.dumps(schema))
    return copy


def _with_stored(tmp: Path, stored: dict[str, Any], *sets: str) -> list[dict[str, Any]]:
    values = tmp / "stored.json"
    values.write_text(json.dumps({"storedDecisionKey": stored}))
    args = [helm_path(4), "template", RELEASE, str(_lookup_chart(str(tmp))), "--namespace",
            NAMESPACE, "--kube-version", "1.34.0", "-f", str(values)]
    for s in (*SIDECAR, *sets):
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=HELM_TIMEOUT_S,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _stored(key: str) -> dict[str, Any]:
    return {"data": {"key": base64.b64encode(key.encode()).decode()}}


def test_the_checksum_changes_with_the_key_and_only_with_it(tmp_path: Path) -> None:
    k1, k2 = _stored("k" * 48), _stored("r" * 48)
    first = _with_stored(tmp_path, k1)
    assert _key(first) == k1["data"]["key"]  # kept across upgrades
    sums = _sums(first)
    assert set(sums.values()) == {_sha(k1["data"]["key"])}
    # Upgrades that keep the key (other values change): the same checksum.
    again = _with_stored(tmp_path, k1, "scheduler.extenderWeight=3",
                         "agentConfig.logging.level=debug")
    assert _sums(again) == sums
    # Another key: every reader's checksum changes.
    other = _sums(_with_stored(tmp_path, k2))
    assert other.keys() == sums.keys() and not set(other.values()) & set(sums.values())
    # The Secret deleted (lookup finds nothing): a new key, a new checksum.
    fresh = _with_stored(tmp_path, {})
    assert _key(fresh) != k1["data"]["key"]
    assert set(_sums(fresh).values()) == {_sha(_key(fresh))}
    # A Secret without its key is replaced too.
    assert _key(_with_stored(tmp_path, {"data": {}})) != k1["data"]["key"]


def test_an_existing_secret_is_hashed_where_it_can_be_read(tmp_path: Path) -> None:
    mine = "scheduler.decisionKey.existingSecret=my-key"
    k1, k2 = _stored("k" * 48), _stored("r" * 48)
    objs = _with_stored(tmp_path, k1, mine)
    assert not [s for s in by_kind(objs, "Secret") if "decision-key" in s["metadata"]["name"]]
    assert set(_sums(objs).values()) == {_sha(k1["data"]["key"])}
    assert set(_sums(_with_stored(tmp_path, k2, mine)).values()) == {_sha(k2["data"]["key"])}
    # Not readable (helm template, or not created yet): a constant, nothing generated.
    plain = render(helm_path(4), sets=[*SIDECAR, mine])
    assert set(v for v in _sums(plain).values() if v) == {_sha("")}


# ---------------------------------------------------------------- host network


HOST = [
    *SIDECAR,
    "scheduler.hostNetwork=true",
    "scheduler.securePort=10359",
    "json:scheduler.strategy=" + json.dumps({"type": "Recreate"}),
    "json:scheduler.extraEnv=" + json.dumps([
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]),
]


def test_the_scheduler_runs_in_the_host_network_where_asked(helm: str) -> None:
    """What story 13 needs on the local cluster (no kube-proxy, the API server on the
    node's loopback, the cluster's own scheduler on 10259)."""
    dep = one(render(helm, sets=HOST), "Deployment", "scheduler")
    spec = dep["spec"]["template"]["spec"]
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    sched, ext = spec["containers"]
    env = [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
           {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert sched["env"] == env and ext["env"] == [pod_ip, *env]
    assert "--secure-port=10359" in sched["command"]
    assert sched["livenessProbe"]["httpGet"]["port"] == 10359


def test_the_scheduler_defaults_are_the_pod_network(helm: str) -> None:
    dep = one(render(helm, sets=SIDECAR), "Deployment", "scheduler")
    spec = dep["spec"]["template"]["spec"]
    assert "strategy" not in dep["spec"] and "hostNetwork" not in spec
    assert "env" not in spec["containers"][0]
    assert [e["name"] for e in spec["containers"][1]["env"]] == ["POD_IP"]
    assert "--secure-port=10259" in spec["containers"][0]["command"]
    # service mode: the extender's own Deployment does not take the scheduler's env.
    ext = one(render(helm, sets=[*SERVICE, *HOST[1:]]), "Deployment", "extender")
    assert [e["name"] for e in ext["spec"]["template"]["spec"]["containers"][0]["env"]] == [
        "POD_IP"
    ]


@pytest.mark.parametrize("minor", [KUBE_MINORS[1], KUBE_MINORS[-1]])  # VAP: 1.30+
def test_host_network_render_is_valid_kubernetes(minor: str) -> None:
    for obj in render(helm_path(4), sets=HOST, kube=f"{minor}.0"):
        errors = list(k8s_validator(minor, obj["apiVersion"], obj["kind"]).iter_errors(obj))
        assert errors == [], (obj["kind"], obj["metadata"]["name"], errors[:1])
