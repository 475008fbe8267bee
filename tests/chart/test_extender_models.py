"""The chart's extender settings for heterogeneous fleets: the policy list mirrors
the code's, and the GPU-model label reaches the extender as a flag it accepts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_share.cli.extender_main import parse_args
from gpu_share.sharing.placement.cluster_policy import ClusterPolicyName
from gpu_share.sharing.placement.pod_models import DEFAULT_MODEL_LABEL
from tests.chart.conftest import CHART, helm_path, one, render, render_error

FN = "gs-gpu-share"
SCHED = ["scheduler.enabled=true"]


def _extender_args(objs: list[dict[str, Any]], mode: str) -> list[str]:
    dep = one(objs, "Deployment", f"{FN}-scheduler" if mode == "sidecar" else f"{FN}-extender")
    (ext,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"]
    return list(ext["args"])


def test_schema_policy_enum_equals_cluster_policies() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    ext = schema["properties"]["scheduler"]["properties"]["extender"]["properties"]
    assert set(ext["policy"]["enum"]) == {p.value for p in ClusterPolicyName}


@pytest.mark.parametrize("mode", ["sidecar", "service"])
def test_model_label_default_reaches_the_extender(mode: str) -> None:
    objs = render(helm_path(4), sets=[*SCHED, f"scheduler.extender.mode={mode}"])
    args = _extender_args(objs, mode)
    assert f"--model-label={DEFAULT_MODEL_LABEL}" in args, args
    assert parse_args(args).model_label == DEFAULT_MODEL_LABEL


@pytest.mark.parametrize("policy", ["dotprod", "clustering"])
def test_custom_model_label_and_baseline_policies_parse(policy: str) -> None:
    objs = render(
        helm_path(4),
        sets=[
            *SCHED,
            "scheduler.extender.modelLabel=example.com/accelerator-model",
            f"scheduler.extender.policy={policy}",
        ],
    )
    parsed = parse_args(_extender_args(objs, "sidecar"))
    assert parsed.model_label == "example.com/accelerator-model"
    assert parsed.policy == policy


@pytest.mark.parametrize("label", ["", "bad label", "a/b/c", "-lead.example/x"])
def test_invalid_model_label_is_refused_by_the_schema(label: str) -> None:
    err = render_error(helm_path(4), sets=[*SCHED, f"scheduler.extender.modelLabel={label}"])
    assert "modelLabel" in err, err
