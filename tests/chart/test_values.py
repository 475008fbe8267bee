"""What the rendered objects say, and how bad values fail."""

from __future__ import annotations

import importlib.util
import json
import sys
from enum import StrEnum
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel

from gpu_share.config import model
from gpu_share.config.model import AgentConfig
from gpu_share.kube.rbac import merged_rules
from tests.chart.conftest import (
    CHART,
    EXAMPLES,
    REPO,
    by_kind,
    helm_path,
    one,
    render,
    render_error,
)
from tests.chart.roles import agent_role, role_rules

NODE_POOLS = REPO / "values-examples" / "node-pools.yaml"
LOCAL = REPO / "values-examples" / "local-cluster.yaml"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())


def _config(objs: list[dict[str, Any]], pool: str) -> dict[str, Any]:
    cm = one(objs, "ConfigMap", f"-{pool}-config")
    parsed: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return parsed


def _agent(ds: dict[str, Any]) -> dict[str, Any]:
    containers = ds["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "agent")


# ---------------------------------------------------------------- schema mirrors the model


def _schema_enum(*path: str) -> set[str]:
    node = SCHEMA["definitions"]["agentConfig"]
    for key in path:
        node = node["properties"][key]
    if "items" in node:
        node = node["items"]
    return set(node["enum"])


@pytest.mark.parametrize(
    ("path", "python_values"),
    [
        (("backend",), set(model.BackendKind)),
        (("runtime", "enforcement"), set(model.EnforcementMode)),
        (("runtime", "deviceListStrategy"), set(model.DeviceListStrategy)),
        (("placement", "policy"), set(model.PlacementPolicyName)),
        (
            ("identity", "degradedMode"),
            set(get_args(model.IdentityConfig.model_fields["degraded_mode"].annotation)),
        ),
        (("logging", "level"), set(get_args(model.LoggingConfig.model_fields["level"].annotation))),
        (
            ("logging", "format"),
            set(get_args(model.LoggingConfig.model_fields["format"].annotation)),
        ),
    ],
    ids=lambda v: ".".join(v) if isinstance(v, tuple) else "",
)
def test_schema_enums_equal_python_enums(path: tuple[str, ...], python_values: set[Any]) -> None:
    as_str = {v.value if isinstance(v, StrEnum) else v for v in python_values}
    assert _schema_enum(*path) == as_str


def _chart_owned() -> frozenset[str]:
    """Keys of AgentConfig the chart sets itself (hostPaths, the Downward API) or pins:
    the one list, in hack/chart_values.py (the schema generator reads it too)."""
    spec = importlib.util.spec_from_file_location("chart_values", REPO / "hack" / "chart_values.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("chart_values", module)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return frozenset(module.CHART_OWNED)


CHART_OWNED = _chart_owned()


def _model_keys(cls: type[BaseModel], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, field in cls.model_fields.items():
        alias = field.alias or name
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            keys |= _model_keys(sub, f"{prefix}{alias}.")
        else:
            keys.add(f"{prefix}{alias}")
    return keys


def _schema_keys(node: dict[str, Any], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, sub in node["properties"].items():
        if sub.get("type") == "object" and "properties" in sub:
            keys |= _schema_keys(sub, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def test_schema_exposes_every_model_key_the_chart_does_not_own() -> None:
    model_keys = _model_keys(AgentConfig)
    schema_keys = _schema_keys(SCHEMA["definitions"]["agentConfig"])
    assert schema_keys == model_keys - CHART_OWNED


def test_values_yaml_agent_config_equals_model_defaults() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    defaults = AgentConfig().model_dump(mode="json", by_alias=True)
    for owned in CHART_OWNED:  # set by the chart, so not a value
        *parents, leaf = owned.split(".")
        parent = defaults
        for name in parents:
            parent = parent[name]
        parent.pop(leaf, None)
    for key, value in values["agentConfig"].items():
        if key == "dummy":
            value = {k: v for k, v in value.items() if k != "faultFile"}
            defaults[key].pop("faultFile")
        if key in ("kubelet", "metrics", "dra"):
            defaults[key] = {k: defaults[key][k] for k in value}
        assert value == defaults[key], key


# ---------------------------------------------------------------- rendered config files


@pytest.mark.parametrize(
    "values", [(), *[(p,) for p in EXAMPLES]], ids=["default", *[p.stem for p in EXAMPLES]]
)
def test_every_configmap_validates_as_agent_config(values: tuple[Any, ...]) -> None:
    objs = render(helm_path(4), values)
    cms = [
        cm
        for cm in by_kind(objs, "ConfigMap")
        if cm["metadata"]["labels"].get("app.kubernetes.io/component") == "agent"
    ]
    assert cms
    for cm in cms:
        cfg = AgentConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
        assert cfg.version == "v1"
        assert cfg.dummy.fault_file.startswith(cfg.state_dir + "/")


def test_host_paths_reach_config_and_mounts() -> None:
    objs = render(helm_path(4), [LOCAL])
    cfg = _config(objs, "local")
    assert cfg["kubelet"]["devicePluginDir"] == "/var/lib/kubelet/device-plugins"
    assert cfg["kubelet"]["podResourcesSocket"] == (
        "/var/lib/gpu-share-cluster/kubelet/pod-resources/kubelet.sock"
    )
    assert cfg["stateDir"] == "/var/lib/gpu-share-cluster/gpu-share-state"
    ds = one(objs, "DaemonSet")
    mounts = {m["name"]: m for m in _agent(ds)["volumeMounts"]}
    vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    for name, path, ro in [
        ("device-plugin", cfg["kubelet"]["devicePluginDir"], False),
        ("pod-resources", "/var/lib/gpu-share-cluster/kubelet/pod-resources", True),
        ("state", cfg["stateDir"], False),
    ]:
        assert mounts[name]["mountPath"] == path == vols[name]["hostPath"]["path"]
        assert mounts[name].get("readOnly", False) is ro
    assert vols["state"]["hostPath"]["type"] == "DirectoryOrCreate"
    assert "dev" not in vols  # dummy backend: no host /dev


# ---------------------------------------------------------------- node pools


def test_one_daemonset_and_configmap_per_pool_with_merged_settings() -> None:
    objs = render(helm_path(4), [NODE_POOLS])
    agents = [d for d in by_kind(objs, "DaemonSet") if "-mps" not in d["metadata"]["name"]]
    assert len(agents) == 3
    assert len(by_kind(objs, "ConfigMap")) == 3
    a100, t4, npu = (
        next(d for d in agents if d["metadata"]["name"].endswith(f"-{p}"))
        for p in ("a100", "t4", "npu-demo")
    )
    for ds, pool in ((a100, "a100"), (t4, "t4"), (npu, "npu-demo")):
        spec = ds["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {"gpu-share.vendor.com/pool": pool}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
            "tolerations"
        ]
        assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in spec["tolerations"]
        assert ds["spec"]["updateStrategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": 1},
        }
        cm_name = ds["metadata"]["name"] + "-config"
        assert {"name": "config", "configMap": {"name": cm_name}} in spec["volumes"]
    assert a100["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"
    assert npu["spec"]["template"]["spec"]["priorityClassName"] == "system-cluster-critical"
    assert _agent(a100)["resources"]["limits"]["memory"] == "384Mi"
    assert _agent(t4)["resources"]["limits"]["memory"] == "256Mi"  # poolDefaults

    a100_cfg, t4_cfg, npu_cfg = (_config(objs, p) for p in ("a100", "t4", "npu-demo"))
    assert (a100_cfg["runtime"]["enforcement"], a100_cfg["memoryUnitMiB"]) == ("mps", 1024)
    assert (t4_cfg["runtime"]["enforcement"], t4_cfg["memoryUnitMiB"]) == ("none", 256)
    assert t4_cfg["placement"]["policy"] == "spread"
    assert a100_cfg["placement"]["policy"] == "best-fit"
    assert npu_cfg["backend"] == "dummy"
    assert npu_cfg["failOnInitError"] is False  # false overrides true in the deep merge
    assert npu_cfg["dummy"] == {**a100_cfg["dummy"], "deviceCount": 2, "memoryMiB": 8192}
    # Defaults untouched by a pool's overrides survive the merge.
    assert t4_cfg["runtime"]["mps"] == a100_cfg["runtime"]["mps"]

    # MPS control daemon only for the nvml+mps pool.
    mps = [d for d in by_kind(objs, "DaemonSet") if d["metadata"]["name"].endswith("-mps")]
    assert [d["metadata"]["name"] for d in mps] == [a100["metadata"]["name"] + "-mps"]
    ctl = mps[0]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in ctl["containers"][0]["env"]}
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == a100_cfg["runtime"]["mps"]["pipeDir"]
    assert env["CUDA_MPS_LOG_DIRECTORY"] == a100_cfg["runtime"]["mps"]["logDir"]
    assert ctl["containers"][0]["command"] == ["nvidia-cuda-mps-control", "-f"]
    assert ctl["nodeSelector"] == a100["spec"]["template"]["spec"]["nodeSelector"]
    agent_mounts = {m["mountPath"] for m in _agent(a100)["volumeMounts"]}
    assert a100_cfg["runtime"]["mps"]["pipeDir"] in agent_mounts
    assert a100_cfg["runtime"]["mps"]["pipeDir"] not in {
        m["mountPath"] for m in _agent(t4)["volumeMounts"]
    }


def test_pool_false_overrides_a_true_default() -> None:
    objs = render(
        helm_path(4),
        [LOCAL],
        sets=[
            'json:nodePools=[{"name":"a","nodeSelector":{"x":"1"},"hostNetwork":false},'
            '{"name":"b","nodeSelector":{"x":"2"}}]'
        ],
    )
    a, b = one(objs, "DaemonSet", "-a"), one(objs, "DaemonSet", "-b")
    assert "hostNetwork" not in a["spec"]["template"]["spec"]
    assert b["spec"]["template"]["spec"]["hostNetwork"] is True


def test_local_cluster_values() -> None:
    objs = render(helm_path(4), [LOCAL])
    ds = one(objs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    agent = _agent(ds)
    assert agent["image"] == "localhost/gpu-share:dev"
    assert agent["imagePullPolicy"] == "Never"
    env = {e["name"]: e for e in agent["env"]}
    assert env["KUBERNETES_SERVICE_HOST"]["value"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"]["value"] == "6443"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    assert _config(objs, "local")["backend"] == "dummy"
    # helm test: a host-network pod on the pool's nodes probing the loopback.
    (test_pod,) = by_kind(objs, "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert test_pod["spec"]["hostNetwork"] is True
    assert test_pod["spec"]["nodeSelector"] == spec["nodeSelector"]
    assert test_pod["spec"]["containers"][0]["command"] == [
        "gpu-share",
        "probe",
        "http://127.0.0.1:9400/readyz",
    ]


def test_helm_test_uses_the_service_without_host_network() -> None:
    objs = render(helm_path(4), sets=["agentConfig.metrics.port=9500"])
    (test_pod,) = by_kind(objs, "Pod")
    svc = one(objs, "Service")
    assert svc["spec"]["ports"][0]["port"] == 9500
    url = test_pod["spec"]["containers"][0]["command"][-1]
    assert url == f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:9500/readyz"
    assert "hostNetwork" not in test_pod["spec"]
    assert (
        svc["spec"]["selector"].items()
        <= one(objs, "DaemonSet")["spec"]["template"]["metadata"]["labels"].items()
    )


# ---------------------------------------------------------------- RBAC + security


def test_cluster_role_equals_agent_rules() -> None:
    objs = render(helm_path(4))
    role = agent_role(objs)
    assert role_rules(role) == merged_rules()
    (binding,) = by_kind(objs, "ClusterRoleBinding")
    sa = one(objs, "ServiceAccount")["metadata"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
    ]
    assert one(objs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == sa["name"]


@pytest.mark.parametrize(
    "values", [(), *[(p,) for p in EXAMPLES]], ids=["default", *[p.stem for p in EXAMPLES]]
)
def test_pods_are_hardened(values: tuple[Any, ...]) -> None:
    objs = render(helm_path(4), values)
    pods = [d["spec"]["template"]["spec"] for d in by_kind(objs, "DaemonSet")]
    pods += [p["spec"] for p in by_kind(objs, "Pod")]
    for spec in pods:
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["readOnlyRootFilesystem"] is True
            assert not sc.get("privileged", False)
    for p in by_kind(objs, "Pod"):
        assert p["spec"]["securityContext"]["runAsNonRoot"] is True


def test_privileged_only_when_asked() -> None:
    objs = render(helm_path(4), sets=["poolDefaults.privileged=true"])
    sc = _agent(one(objs, "DaemonSet"))["securityContext"]
    assert sc["privileged"] is True
    assert "allowPrivilegeEscalation" not in sc  # the API rejects false with privileged


def test_nvml_pool_mounts_host_dev_read_only() -> None:
    objs = render(helm_path(4))
    ds = one(objs, "DaemonSet")
    agent = _agent(ds)
    assert {"name": "dev", "mountPath": "/dev", "readOnly": True} in agent["volumeMounts"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert not agent["terminationMessagePath"].startswith("/dev/")


# ---------------------------------------------------------------- rollout + image


def test_checksum_annotation_follows_the_config() -> None:
    helm = helm_path(4)

    def checksums(*sets: str) -> dict[str, str]:
        return {
            d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"][
                "checksum/config"
            ]
            for d in by_kind(render(helm, [NODE_POOLS], sets=sets), "DaemonSet")
            if not d["metadata"]["name"].endswith("-mps")
        }

    base = checksums()
    assert len(set(base.values())) == 3
    changed = checksums("agentConfig.logging.level=debug")
    assert all(changed[k] != base[k] for k in base)  # chart-wide change rolls every pool
    same = checksums("poolDefaults.podAnnotations.x=y")
    assert same == base  # not a config change


def test_digest_wins_over_tag() -> None:
    digest = "sha256:" + "a" * 64
    objs = render(helm_path(4), sets=["image.tag=1.2.3", f"image.digest={digest}"])
    assert _agent(one(objs, "DaemonSet"))["image"] == f"ghcr.io/gpu-share/gpu-share@{digest}"
    objs = render(helm_path(4), sets=["image.tag=1.2.3"])
    assert _agent(one(objs, "DaemonSet"))["image"] == "ghcr.io/gpu-share/gpu-share:1.2.3"
    objs = render(helm_path(4))
    assert _agent(one(objs, "DaemonSet"))["image"].endswith(":0.1.0")  # appVersion


# ---------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["agentConfig.memoryUnitMB=512"], ["agentConfig", "memoryUnitMB"]),
        (
            ['json:nodePools=[{"name":"a","nodeSelector":{"x":"1"},"tolerashuns":[]}]'],
            ["tolerashuns"],
        ),
        (["agentConfig.backend=cuda"], ["agentConfig", "backend", "nvml"]),
        (["agentConfig.runtime.enforcement=strict"], ["enforcement", "hami-core"]),
        (['json:agentConfig.runtime.deviceListStrategy=["env"]'], ["deviceListStrategy"]),
        (["agentConfig.memoryUnitMiB=-1"], ["agentConfig", "memoryUnitMiB", "1"]),
        (["agentConfig.dummy.deviceCount=65"], ["deviceCount", "64"]),
    ],
    ids=[
        "unknown-key",
        "unknown-pool-key",
        "backend-enum",
        "enforcement-enum",
        "strategy-enum",
        "negative-unit",
        "too-many-dummies",
    ],
)
def test_bad_values_fail_naming_the_key(helm: str, sets: list[str], expected: list[str]) -> None:
    err = render_error(helm, sets=sets)
    assert "values don't meet the specifications of the schema" in err
    for text in expected:
        assert text in err, err


@pytest.mark.parametrize(
    ("pools", "expected"),
    [
        (
            [{"name": "a", "nodeSelector": {"x": "1"}}, {"name": "a", "nodeSelector": {"x": "2"}}],
            'duplicate pool name "a"',
        ),
        (
            [{"name": "a", "nodeSelector": {"x": "1"}}, {"name": "b", "nodeSelector": {"x": "1"}}],
            'nodePools "a" and "b" have identical nodeSelectors {"x":"1"}',
        ),
        (
            [
                {"name": "a", "nodeSelector": {"x": "1"}},
                {"name": "b", "nodeSelector": {"x": "1", "y": "2"}},
            ],
            'nodePools "a" and "b" overlap: every node matching "b"\'s nodeSelector',
        ),
    ],
    ids=["duplicate-name", "identical-selectors", "contained-selector"],
)
def test_pool_mistakes_fail_with_a_clear_message(
    helm: str, pools: list[dict[str, Any]], expected: str
) -> None:
    err = render_error(helm, sets=[f"json:nodePools={json.dumps(pools)}"])
    assert expected in err, err


def test_contained_selector_is_fine_when_affinity_tells_pools_apart() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "y", "operator": "DoesNotExist"}]}
                ]
            }
        }
    }
    pools = [
        {"name": "a", "nodeSelector": {"x": "1"}, "affinity": affinity},
        {"name": "b", "nodeSelector": {"x": "1", "y": "2"}},
    ]
    objs = render(helm_path(4), sets=[f"json:nodePools={json.dumps(pools)}"])
    assert len(by_kind(objs, "DaemonSet")) == 2


def test_fault_file_outside_state_dir_fails() -> None:
    err = render_error(helm_path(4), sets=["agentConfig.dummy.faultFile=/tmp/faults.json"])
    expected = 'agentConfig.dummy.faultFile "/tmp/faults.json" must lie inside hostPaths.stateDir'
    assert expected in err, err
