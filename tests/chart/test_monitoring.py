"""monitoring.*: the PrometheusRule and the Grafana dashboard ConfigMap, off by
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
    "GpuShareEnforcementUnavailable",
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
    # The extender's own metrics, not kube-scheduler's (which the chart does not scrape).
    errors, slow = alerts["GpuShareExtenderErrors"]["expr"], alerts["GpuShareExtenderSlow"]["expr"]
    assert "gpu_share_extender_requests_total{" in errors and "scheduler_" not in errors
    assert f'namespace="{NAMESPACE}"' in errors
    assert "gpu_share_extender_request_duration_seconds_bucket{" in slow
    assert slow.rstrip().endswith("> 2.5")


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


# ---- the extender's metrics listener and its PodMonitor ----------------------------------

SCHED = "scheduler.enabled=true"
SERVICE = "scheduler.extender.mode=service"
PODMON = "scheduler.extender.metrics.podMonitor.enabled=true"
ON = "scheduler.extender.metrics.port=9402"


def _extender_container(objs: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    name = f"{FN}-scheduler" if mode == "sidecar" else f"{FN}-extender"
    (dep,) = [o for o in by_kind(objs, "Deployment") if o["metadata"]["name"] == name]
    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"]
    return c


def test_extender_serves_metrics_on_a_named_port_in_both_modes(helm: str) -> None:
    for mode, sets in (("sidecar", [SCHED, ON]), ("service", [SCHED, SERVICE, ON])):
        c = _extender_container(render(helm, sets=sets), mode)
        assert "--metrics-port=9402" in c["args"] and "--metrics-bind=$(POD_IP)" in c["args"]
        assert {"name": "metrics", "containerPort": 9402} in c["ports"], mode
        # The scheduler's API keeps its own listener: loopback (sidecar) or mTLS (service).
        listen = [a for a in c["args"] if a.startswith("--listen=")]
        assert listen == (["--listen=127.0.0.1:8888"] if mode == "sidecar"
                          else ["--listen=0.0.0.0:8888"]), mode
        if mode == "service":
            assert "--client-ca-file=/etc/gpu-share-extender-tls/ca.crt" in c["args"]


def test_extender_metrics_port_and_bind_are_values_and_zero_is_off(helm: str) -> None:
    c = _extender_container(render(helm, sets=[
        SCHED, "scheduler.extender.metrics.port=9555",
        "scheduler.extender.metrics.bindAddress=127.0.0.1"]), "sidecar")
    assert "--metrics-port=9555" in c["args"] and "--metrics-bind=127.0.0.1" in c["args"]
    # on by default (9402, the pod's address); 0 is off: the sidecar then exposes nothing
    on = _extender_container(render(helm, sets=[SCHED]), "sidecar")
    assert "--metrics-port=9402" in on["args"]
    assert [p["name"] for p in on["ports"]] == ["metrics"]
    off = _extender_container(render(helm, sets=[SCHED, "scheduler.extender.metrics.port=0"]),
                              "sidecar")
    assert not [a for a in off["args"] if a.startswith("--metrics-")]
    assert "ports" not in off
    svc = _extender_container(render(helm, sets=[SCHED, SERVICE,
                                                 "scheduler.extender.metrics.port=0"]), "service")
    assert [p["name"] for p in svc["ports"]] == ["https"]
    svc = _extender_container(render(helm, sets=[SCHED, SERVICE]), "service")
    assert [p["name"] for p in svc["ports"]] == ["https", "metrics"]


def test_pod_monitor_is_off_by_default_and_selects_the_extender_pods(helm: str) -> None:
    assert not by_kind(render(helm, sets=[SCHED, ON]), "PodMonitor")
    assert not by_kind(render(helm, sets=[PODMON, ON]), "PodMonitor")  # no scheduler: none
    for mode, sets, component in (("sidecar", [SCHED, PODMON, ON], "scheduler"),
                                  ("service", [SCHED, SERVICE, PODMON, ON], "extender")):
        objs = render(helm, sets=[*sets, "scheduler.extender.metrics.podMonitor.labels.release=kps",
                                  "scheduler.extender.metrics.podMonitor.interval=15s"])
        pm = one(objs, "PodMonitor")
        assert pm["apiVersion"] == "monitoring.coreos.com/v1"
        assert pm["metadata"]["name"] == f"{FN}-extender", mode
        assert pm["metadata"]["namespace"] == NAMESPACE
        assert pm["metadata"]["labels"]["release"] == "kps"
        assert pm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        assert pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == component
        (ep,) = pm["spec"]["podMetricsEndpoints"]
        assert ep == {"port": "metrics", "path": "/metrics", "interval": "15s",
                      "scrapeTimeout": "10s"}
        # the selected pods carry the port it names
        assert "metrics" in [p["name"] for p in _extender_container(objs, mode)["ports"]]


def test_pod_monitor_needs_the_metrics_port(helm: str) -> None:
    err = render_error(helm, sets=[SCHED, PODMON, "scheduler.extender.metrics.port=0"])
    assert "scheduler.extender.metrics.port" in err
    assert "port" in render_error(helm, sets=[SCHED, "scheduler.extender.metrics.port=70000"])
