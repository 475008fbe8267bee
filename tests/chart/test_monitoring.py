"""monitoring.* (#17): the PrometheusRule and the Grafana dashboard ConfigMap, off by
default, rendered on demand with helm 3 and helm 4. What the alerts do is tested by
promtool (tests/observability/test_promtool.py)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.chart.conftest import (
    CHART,
    KUBE_MINORS,
    NAMESPACE,
    RELEASE,
    by_kind,
    k8s_validator,
    one,
    render,
    render_error,
)

FN = f"{RELEASE}-gpu-share"
RULE = "monitoring.prometheusRule.enabled=true"
DASH = "monitoring.dashboard.enabled=true"
AGENT_ALERTS = {
    "GpuShareDeviceUnhealthy",
    "GpuShareAgentNotRegistered",
    "GpuShareAgentDown",
    "GpuShareAllocationFailures",
    "GpuShareDegradedIdentity",
    "GpuShareIdentityAmbiguous",
    "GpuShareLedgerQuarantined",
    "GpuShareLedgerWriteFailures",
}
EXTENDER_ALERTS = {"GpuShareExtenderErrors", "GpuShareExtenderSlow"}


def _alerts(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    rule = one(objs, "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_off_by_default(helm: str) -> None:
    objs = render(helm)
    assert not by_kind(objs, "PrometheusRule")
    names = [o["metadata"]["name"] for o in by_kind(objs, "ConfigMap")]
    assert not [n for n in names if n.endswith("-dashboard")]


def test_values_are_appended_at_the_end_of_values_yaml() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert list(values)[-1] == "monitoring"
    assert values["monitoring"]["prometheusRule"]["enabled"] is False
    assert values["monitoring"]["dashboard"]["enabled"] is False


def test_prometheus_rule_has_the_agent_alerts(helm: str) -> None:
    objs = render(helm, sets=[RULE])
    rule = one(objs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == FN and rule["metadata"]["namespace"] == NAMESPACE
    alerts = _alerts(objs)
    assert set(alerts) == AGENT_ALERTS  # no scheduler: no extender alerts
    for name, alert in alerts.items():
        assert alert["labels"]["severity"] in {"warning", "critical"}, name
        assert {"summary", "description", "runbook"} <= set(alert["annotations"]), name
        # Grafana-style $labels survive helm's own templating.
        assert "{{ $labels." in alert["annotations"]["summary"], name
    assert alerts["GpuShareDeviceUnhealthy"]["expr"] == (
        f'gpu_share_device_healthy{{namespace="{NAMESPACE}"}} == 0'
    )
    assert alerts["GpuShareDeviceUnhealthy"]["for"] == "5m"
    assert alerts["GpuShareAgentNotRegistered"]["for"] == "10m"
    assert f'job=~"{FN}-.+-metrics"' in alerts["GpuShareAgentDown"]["expr"]
    # Counter alerts fire on the window's events, without a pending period.
    for name in ("GpuShareAllocationFailures", "GpuShareLedgerQuarantined"):
        assert "for" not in alerts[name]


def test_extender_alerts_come_with_the_scheduler(helm: str) -> None:
    objs = render(helm, sets=[RULE, "scheduler.enabled=true", "scheduler.name=gpus",
                              "json:monitoring.prometheusRule.extenderLatencySeconds=2.5"])
    alerts = _alerts(objs)
    assert set(alerts) == AGENT_ALERTS | EXTENDER_ALERTS
    assert 'profile="gpus"' in alerts["GpuShareExtenderErrors"]["expr"]
    assert alerts["GpuShareExtenderSlow"]["expr"].rstrip().endswith("> 2.5")


def test_selector_labels_and_durations_are_values(helm: str) -> None:
    objs = render(helm, sets=[
        RULE,
        "monitoring.prometheusRule.agentSelector=cluster=\"prod\"\\,namespace=\"gs\"",
        "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
        "monitoring.prometheusRule.additionalAlertLabels.team=ml",
        "monitoring.prometheusRule.for.deviceUnhealthy=2m",
    ])
    rule = one(objs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = _alerts(objs)
    unhealthy = alerts["GpuShareDeviceUnhealthy"]
    assert unhealthy["expr"] == 'gpu_share_device_healthy{cluster="prod",namespace="gs"} == 0'
    assert unhealthy["for"] == "2m"
    assert all(a["labels"]["team"] == "ml" for a in alerts.values())


def test_schema_refuses_bad_monitoring_values(helm: str) -> None:
    assert "deviceUnhealthy" in render_error(
        helm, sets=[RULE, "monitoring.prometheusRule.for.deviceUnhealthy=soon"]
    )
    assert "agentSelector" in render_error(
        helm, sets=[RULE, "monitoring.prometheusRule.agentSelector={x=\"y\"}"]
    )
    assert "nope" in render_error(helm, sets=["monitoring.nope=true"])


def test_dashboard_configmap_carries_the_json(helm: str) -> None:
    objs = render(helm, sets=[DASH])
    cm = one(objs, "ConfigMap", "-dashboard")
    assert cm["metadata"]["name"] == f"{FN}-dashboard"
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    text = cm["data"]["gpu-share.json"]
    assert json.loads(text) == json.loads((CHART / "dashboards" / "gpu-share.json").read_text())
    for minor in (KUBE_MINORS[0], KUBE_MINORS[-1]):
        errors = list(k8s_validator(minor, "v1", "ConfigMap").iter_errors(cm))
        assert not errors, errors[:3]


def test_dashboard_namespace_labels_and_annotations(helm: str) -> None:
    objs = render(helm, sets=[
        DASH,
        "monitoring.dashboard.namespace=monitoring",
        "monitoring.dashboard.annotations.grafana_folder=GPU",
        "monitoring.dashboard.labels.grafana_dashboard=yes",
    ])
    cm = one(objs, "ConfigMap", "-dashboard")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "yes"
