"""DRA mode in the chart: per pool agentConfig.dra.enabled; a DeviceClass per driver,
the ResourceSlice/ResourceClaim RBAC, the kubelet plugin dirs, the own-node policy over
ResourceSlices. Nothing of it without a DRA pool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_share.config.model import AgentConfig
from gpu_share.kube.rbac import merged_rules
from tests.chart.conftest import by_kind, helm_path, k8s_validator, one, render, render_error
from tests.chart.roles import agent_role, role_rules

DRA_ON = "agentConfig.dra.enabled=true"
DRIVER = "gpu-share.vendor.com"


def _agents(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d
        for d in by_kind(objs, "DaemonSet")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "agent"
    }


def _mounts(ds: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = ds["spec"]["template"]["spec"]
    ctr = next(c for c in pod["containers"] if c["name"] == "agent")
    return {m["name"]: m for m in ctr["volumeMounts"]}, {v["name"]: v for v in pod["volumes"]}


def _config(objs: list[dict[str, Any]], pool: str) -> AgentConfig:
    cm = one(objs, "ConfigMap", f"-{pool}-config")
    return AgentConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))


def _role(objs: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    return role_rules(agent_role(objs))


def _pools_file(tmp_path: Path, pools: list[dict[str, Any]], **extra: Any) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(json.dumps({"nodePools": pools, **extra}))
    return path


# ---------------------------------------------------------------- off by default


def test_nothing_of_dra_without_a_dra_pool() -> None:
    objs = render(helm_path(4))
    assert not by_kind(objs, "DeviceClass")
    assert _role(objs) == merged_rules()
    # Claims are read in every mode (those a DRA pool left); slices are DRA's alone.
    assert not [r for g, r in _role(objs) if g == "resource.k8s.io" and r != "resourceclaims"]
    (ds,) = _agents(objs).values()
    mounts, _ = _mounts(ds)
    # The driver's plugin dir and the registration dir: a DRA pool switched back leaves
    # its checkpoint there, and the agent serves the kubelet those claims' unprepare
    # (agent/dra/leftovers.py).
    assert mounts["kubelet-plugin"]["mountPath"] == f"/var/lib/kubelet/plugins/{DRIVER}"
    assert mounts["kubelet-plugins-registry"]["mountPath"] == "/var/lib/kubelet/plugins_registry"
    policy = one(objs, "ValidatingAdmissionPolicy", "-own-node")["spec"]
    assert "resourceslices" not in json.dumps(policy)
    cfg = _config(objs, "default")
    assert not cfg.dra.enabled
    # The chart-owned dirs are rendered even so (the config agrees with the mounts when a
    # pool is switched on).
    assert cfg.dra.plugin_dir == f"/var/lib/kubelet/plugins/{DRIVER}"
    assert cfg.dra.registration_dir == "/var/lib/kubelet/plugins_registry"
    assert cfg.dra.cdi_dir == "/var/run/cdi"


# ---------------------------------------------------------------- on


@pytest.mark.parametrize("major", [3, 4])
def test_device_class_selects_the_driver(major: int) -> None:
    objs = render(helm_path(major), sets=[DRA_ON])
    dc = one(objs, "DeviceClass")
    assert dc["apiVersion"] == "resource.k8s.io/v1"
    assert dc["metadata"]["name"] == DRIVER
    assert dc["spec"] == {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}


def test_rbac_adds_exactly_the_dra_rules() -> None:
    objs = render(helm_path(4), sets=[DRA_ON])
    role = _role(objs)
    assert role == merged_rules(dra=True)
    assert role[("resource.k8s.io", "resourceslices")] == {
        "get", "list", "watch", "create", "update", "delete"
    }
    assert role[("resource.k8s.io", "resourceclaims")] == {"get"}
    assert ("resource.k8s.io", "resourceclaims/status") not in role


def test_kubelet_plugin_dirs_reach_config_and_mounts() -> None:
    objs = render(helm_path(4), sets=[DRA_ON])
    cfg = _config(objs, "default")
    assert cfg.dra.enabled and cfg.dra.driver_name == DRIVER
    (ds,) = _agents(objs).values()
    mounts, vols = _mounts(ds)
    for name, path, kind in (
        ("kubelet-plugin", cfg.dra.plugin_dir, "DirectoryOrCreate"),
        ("kubelet-plugins-registry", cfg.dra.registration_dir, "Directory"),
    ):
        # Same path inside and outside: the registration names the socket by host path.
        assert mounts[name]["mountPath"] == path == vols[name]["hostPath"]["path"]
        assert not mounts[name].get("readOnly", False)
        assert vols[name]["hostPath"]["type"] == kind
    assert cfg.dra.plugin_dir == f"/var/lib/kubelet/plugins/{DRIVER}"
    # Claims' CDI specs go to the runtime's transient dir.
    assert mounts["cdi-dynamic"]["mountPath"] == cfg.dra.cdi_dir == "/var/run/cdi"
    assert vols["cdi-dynamic"]["hostPath"]["path"] == "/var/run/cdi"


def test_host_paths_and_driver_name_follow_values(tmp_path: Path) -> None:
    values = _pools_file(
        tmp_path,
        [{"name": "d", "nodeSelector": {"p": "d"},
          "agentConfig": {"dra": {"enabled": True, "driverName": "gpu.example.org"}}}],
        hostPaths={
            "kubeletPluginsDir": "/k/plugins",
            "kubeletPluginsRegistryDir": "/k/reg",
            "cdiSpecDir": "/run/cdi-x",
        },
    )  # fmt: skip
    objs = render(helm_path(4), values=[values])
    cfg = _config(objs, "d")
    assert cfg.dra.plugin_dir == "/k/plugins/gpu.example.org"
    assert cfg.dra.registration_dir == "/k/reg"
    mounts, vols = _mounts(next(iter(_agents(objs).values())))
    assert vols["kubelet-plugin"]["hostPath"]["path"] == "/k/plugins/gpu.example.org"
    assert mounts["kubelet-plugins-registry"]["mountPath"] == "/k/reg"
    assert vols["cdi-dynamic"]["hostPath"]["path"] == "/run/cdi-x"
    assert mounts["cdi-dynamic"]["mountPath"] == cfg.dra.cdi_dir
    assert one(objs, "DeviceClass")["metadata"]["name"] == "gpu.example.org"


def test_a_pool_is_either_device_plugin_or_dra(tmp_path: Path) -> None:
    values = _pools_file(
        tmp_path,
        [
            {"name": "dra", "nodeSelector": {"p": "dra"},
             "agentConfig": {"dra": {"enabled": True}}},
            {"name": "dp", "nodeSelector": {"p": "dp"}},
            {"name": "other", "nodeSelector": {"p": "other"},
             "agentConfig": {"dra": {"enabled": True, "driverName": "gpu.example.org"}}},
        ],
    )  # fmt: skip
    objs = render(helm_path(4), values=[values])
    agents = _agents(objs)
    for pool, dra in (("dra", True), ("dp", False), ("other", True)):
        (ds,) = [d for n, d in agents.items() if n.endswith(f"-{pool}")]
        mounts, _ = _mounts(ds)
        # Every pool: DRA's own dirs, or a device-plugin pool cleaning what DRA left.
        for mount in ("kubelet-plugin", "kubelet-plugins-registry", "cdi-dynamic"):
            assert mount in mounts, (pool, mount)
        assert _config(objs, pool).dra.enabled is dra
    assert sorted(d["metadata"]["name"] for d in by_kind(objs, "DeviceClass")) == [
        DRIVER, "gpu.example.org"
    ]
    policy = one(objs, "ValidatingAdmissionPolicy", "-own-node")["spec"]
    (check,) = [v for v in policy["validations"] if "resourceslices" in v["expression"]]
    assert f'object.spec.driver in ["{DRIVER}","gpu.example.org"]' in check["expression"]


def test_admission_policy_confines_slices_to_the_own_node() -> None:
    objs = render(helm_path(4), sets=[DRA_ON])
    policy = one(objs, "ValidatingAdmissionPolicy", "-own-node")["spec"]
    rules = policy["matchConstraints"]["resourceRules"]
    assert rules[0]["resources"] == ["nodes", "pods"]  # unchanged
    assert rules[1] == {
        "apiGroups": ["resource.k8s.io"],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE", "DELETE"],
        "resources": ["resourceslices"],
    }
    (check,) = [v for v in policy["validations"] if "resourceslices" in v["expression"]]
    expr = check["expression"]
    assert "object.spec.nodeName == variables.nodeName" in expr
    assert "oldObject.spec.nodeName == variables.nodeName" in expr
    assert f'object.spec.driver in ["{DRIVER}"]' in expr
    assert check["reason"] == "Forbidden"
    # The node-name claim check still comes first and covers slices too.
    assert policy["validations"][0]["expression"] == "variables.nodeName != ''"


@pytest.mark.parametrize("minor", ["1.34", "1.35"])
def test_dra_objects_match_kubernetes_schema(minor: str) -> None:
    objs = render(helm_path(4), sets=[DRA_ON], kube=f"{minor}.0")
    for obj in objs:
        validator = k8s_validator(minor, obj["apiVersion"], obj["kind"])
        errors = list(validator.iter_errors(obj))
        assert not errors, (obj["kind"], [e.message for e in errors[:3]])


def test_dra_needs_kubernetes_1_34() -> None:
    err = render_error(helm_path(4), sets=[DRA_ON], kube="1.33.0")
    assert "DRA mode needs Kubernetes 1.34+" in err


@pytest.mark.parametrize("name", ["Gpu.Example", "-x.example", "a" * 64, "x_y.example"])
def test_bad_driver_names_are_refused(name: str) -> None:
    err = render_error(helm_path(4), sets=[DRA_ON, f"agentConfig.dra.driverName={name}"])
    assert "driverName" in err


def test_unknown_dra_keys_and_chart_owned_dirs_are_refused() -> None:
    for key in ("pluginDir=/x", "cdiDir=/x", "registrationDir=/x", "bogus=1"):
        err = render_error(helm_path(4), sets=[f"agentConfig.dra.{key}"])
        assert "dra" in err, key


def test_notes_name_the_device_class(tmp_path: Path) -> None:
    from tests.chart.conftest import render_notes

    notes = render_notes(helm_path(4), tmp_path, sets=[DRA_ON])
    assert f"deviceClassName {DRIVER}" in notes
    assert "DRAConsumableCapacity" in notes
    assert "DRAConsumableCapacity" not in render_notes(helm_path(4), tmp_path)
