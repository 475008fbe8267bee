"""promtool (hack/build-promtool.sh, from the Prometheus Go module) on what we ship:
`promtool check metrics` on live /metrics scrapes of the agent and of the extender (its
separate metrics listener); the chart's PrometheusRule through `promtool check rules` and
the unit tests of every alert in tests/observability/rules/*.yaml (`promtool test
rules`); every query of the Grafana dashboard through promtool's PromQL parser (as
recording rules).

promtool is built before pytest by `make test`; without it these tests skip loudly, and
fail where GPU_SHARE_REQUIRE_CLUSTER=1 (the CI machines that build the cluster binaries
build promtool too)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from gpu_share.cli import extender_main
from gpu_share.extender.http import make_server
from gpu_share.observability.http import READY_METRIC, start_http
from gpu_share.observability.metrics import ExtenderMetrics, Metrics, _Table
from testkit.harness.env import REQUIRE_CLUSTER
from testkit.harness.wait import poll
from testkit.kubelet_stub import FakePodResources, KubeletStub
from tests.agent.served_agent import kill_if_running, scratch_dir, spawn_agent
from tests.chart.conftest import CHART, NAMESPACE, RELEASE, helm_path, one, render
from tests.extender.test_http import (
    FakeBinder,
    FakeView,
    fgd_extender,
    kpod,
    post_raw,
)

REPO = Path(__file__).resolve().parents[2]
RULE_TESTS = sorted((Path(__file__).parent / "rules").glob("*.yaml"))
RULES_FILE = "gpu-share-rules.yaml"  # what the unit tests' rule_files name
DASHBOARD = CHART / "dashboards" / "gpu-share.json"
RULES_ON = ["monitoring.prometheusRule.enabled=true", "scheduler.enabled=true"]
PROMTOOL_TIMEOUT_S = 120


@functools.cache
def _promtool() -> tuple[str | None, str]:
    """(path, "") or (None, why): $GPU_SHARE_PROMTOOL, else the cached build (no build
    here: a cold one takes minutes, `make test` does it before pytest)."""
    given = os.environ.get("GPU_SHARE_PROMTOOL")
    if given:
        return (given, "") if os.access(given, os.X_OK) else (None, f"{given} is not executable")
    proc = subprocess.run(
        ["bash", str(REPO / "hack" / "build-promtool.sh"), "--print"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    found = re.search(r"^promtool=(\S+)$", proc.stdout, flags=re.MULTILINE)
    if proc.returncode != 0 or not found:
        return None, "promtool is not built (run hack/build-promtool.sh)"
    return found.group(1), ""


@pytest.fixture
def promtool() -> str:
    path, why = _promtool()
    if path is None:
        if REQUIRE_CLUSTER:
            pytest.fail(f"promtool is required here (GPU_SHARE_REQUIRE_CLUSTER=1) but {why}",
                        pytrace=False)
        bar = "!" * 78
        sys.stderr.write(f"\n{bar}\n!!! SKIPPING promtool tests: {why}\n{bar}\n")
        pytest.skip(f"promtool tests skipped: {why}")
    return path


def run_promtool(promtool: str, *args: str, stdin: bytes | None = None,
                 cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [promtool, *args], input=stdin, capture_output=True, cwd=cwd,
        timeout=PROMTOOL_TIMEOUT_S, check=False,
    )


def check_metrics(promtool: str, body: bytes) -> None:
    proc = run_promtool(promtool, "check", "metrics", stdin=body)
    out = (proc.stdout + proc.stderr).decode(errors="replace")
    assert proc.returncode == 0 and not out.strip(), out


# ---- /metrics ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        body: bytes = r.read()
        return body


@contextlib.contextmanager
def live_agent() -> Iterator[tuple[str, KubeletStub]]:
    """gpu-share-plugin as a process (dummy backend) registered with a kubelet stub; yields
    its /metrics URL once /readyz answers 200."""
    with scratch_dir("gsp-") as d:
        kubelet = KubeletStub(d / "dp").start()
        pr = FakePodResources(d / "pr.sock").start()
        port = _free_port()
        proc = spawn_agent(d, "--metrics-port", str(port))
        try:
            assert kubelet.wait_for_registrations(2, timeout_s=30), proc.stdout
            base = f"http://127.0.0.1:{port}"

            def ready() -> bool:
                with contextlib.suppress(OSError), \
                        urllib.request.urlopen(f"{base}/readyz", timeout=2) as r:
                    return bool(r.status == 200)
                return False

            assert poll(ready, 20)
            yield f"{base}/metrics", kubelet
        finally:
            kill_if_running(proc)
            pr.stop()
            kubelet.stop()


def test_live_agent_metrics_pass_promtool_check_metrics(promtool: str) -> None:
    with live_agent() as (url, kubelet):
        mem = kubelet.plugin("gpu-share-vcuda-memory.sock").watch()
        ids = [x.id for x in mem.wait_for_list(lambda ds: len(ds) > 0, 10)]
        # A kubelet's calls: a preferred set, an Allocate, one refused (unknown id), so
        # the scrape has histograms, allocations and failures with their labels.
        mem.preferred_allocation(ids, [], 2)
        with contextlib.suppress(grpc.RpcError):
            mem.allocate(ids[:2])
        with contextlib.suppress(grpc.RpcError):
            mem.allocate(["no-such-device"])
        mem.close()
        deadline = time.monotonic() + 10
        body = _get(url)
        while b"gpu_share_allocation_failures_total{" not in body and time.monotonic() < deadline:
            time.sleep(0.1)
            body = _get(url)
    text = body.decode()
    for wanted in (f"{READY_METRIC} 1.0", "gpu_share_allocate_seconds_bucket{",
                   "gpu_share_preferred_allocation_seconds_count{",
                   "gpu_share_allocation_failures_total{", "gpu_share_device_units{",
                   'gpu_share_memory_unit_bytes{unit="in-use"} '):
        assert wanted in text, (wanted, text)
    check_metrics(promtool, body)


def give_every_family_a_series(table: _Table) -> None:
    """One series in each family of ``table`` (labels "<name>-x"): observed once if it
    is a histogram, else incremented."""
    for _, row, family in table.families():
        series: Any = family
        if row.labels:
            series = family.labels(*(f"{n}-x" for n in row.labels))
        if hasattr(series, "observe"):
            series.observe(0.003)
        else:
            series.inc()


def test_every_agent_family_with_series_passes_promtool(promtool: str) -> None:
    """Each family of Metrics with a series (what a live scrape may not have reached:
    ledger quarantine, loop errors, ...), served by the agent's endpoint."""
    m = Metrics()
    give_every_family_a_series(m)
    handle = start_http(m.registry, bind_address="127.0.0.1", port=0, readiness=lambda: False)
    try:
        body = _get(f"http://127.0.0.1:{handle.port}/metrics")
    finally:
        handle.stop()
    assert f"\n{READY_METRIC} 0.0\n" in body.decode()
    check_metrics(promtool, body)


def test_promtool_check_metrics_does_lint(promtool: str) -> None:
    """The check is not a no-op: a non-base unit is reported."""
    bad = b"# HELP x_milliseconds d\n# TYPE x_milliseconds gauge\nx_milliseconds 1\n"
    proc = run_promtool(promtool, "check", "metrics", stdin=bad)
    assert proc.returncode != 0 and b"base unit" in proc.stdout + proc.stderr


def test_live_extender_metrics_pass_promtool_check_metrics(promtool: str) -> None:
    """The extender answering the scheduler (fake view and binder), its metrics served
    by the CLI's own listener (--metrics-port), scraped after filter/prioritize/bind,
    a refused body and an unknown route."""
    metrics = ExtenderMetrics()
    ext = fgd_extender(FakeView(), FakeBinder(), on_bind=metrics.observe_bind)
    server = make_server(ext, "127.0.0.1", 0, metrics=metrics)
    thread = server.start()
    args = extender_main.parse_args(
        ["--metrics-port", str(_free_port()), "--metrics-bind", "127.0.0.1"])

    class View:
        loops = None

        @staticmethod
        def stats() -> tuple[int, int, dict[str, int], dict[str, int]]:
            return 2, 5, {"nodes": 1, "pods": 3}, {"nodes": 0, "pods": 2}

    metrics.registry.collectors.append(lambda: metrics.set_view(*View.stats()))
    metrics.observe_untrusted("BadSignature")
    listener = extender_main._metrics_listener(args, metrics, View())  # type: ignore[arg-type]
    assert listener is not None
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        pod = json.dumps({"Pod": kpod(4, 30), "NodeNames": ["a", "b", "zz"]}).encode()
        assert post_raw(url + "/filter", pod)[0] == 200
        assert post_raw(url + "/prioritize", pod)[0] == 200
        bind = {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-1", "Node": "b"}
        assert post_raw(url + "/bind", json.dumps(bind).encode()) == (200, {"Error": ""})
        assert post_raw(url + "/filter", b"{nope")[0] == 400
        assert post_raw(url + "/nope", b"{}")[0] == 404
        body = _get(f"http://127.0.0.1:{listener.port}/metrics")
    finally:
        listener.stop()
        server.shutdown()
        server.server_close()
        thread.join(5)
    text = body.decode()
    for wanted in ('gpu_share_extender_requests_total{outcome="refused",verb="filter"} 1.0',
                   'gpu_share_extender_requests_total{outcome="refused",verb="other"} 1.0',
                   'gpu_share_extender_binds_total{outcome="bound"} 1.0',
                   'gpu_share_extender_filter_nodes_total{result="failed"} 1.0',
                   'gpu_share_extender_request_duration_seconds_count{verb="bind"} 1.0',
                   "gpu_share_extender_view_pods 5.0",
                   'gpu_share_extender_view_watch_errors_total{watch="pods"} 2.0',
                   'gpu_share_extender_untrusted_annotations_total{reason="BadSignature"} 1.0'):
        assert wanted in text, (wanted, text)
    check_metrics(promtool, body)


def test_every_extender_family_with_series_passes_promtool(promtool: str) -> None:
    m = ExtenderMetrics()
    give_every_family_a_series(m)
    handle = start_http(m.registry, bind_address="127.0.0.1", port=0)
    try:
        body = _get(f"http://127.0.0.1:{handle.port}/metrics")
    finally:
        handle.stop()
    check_metrics(promtool, body)


# ---- the PrometheusRule -------------------------------------------------------------


def rendered_rules(helm_major: int = 3) -> dict[str, Any]:
    objs = render(helm_path(helm_major), sets=RULES_ON)
    rule = one(objs, "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def alerts_of(rules: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.parametrize("major", [3, 4], ids=lambda m: f"helm{m}")
def test_rendered_rules_pass_promtool_check_rules(promtool: str, tmp_path: Path,
                                                  major: int) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rendered_rules(major)))
    proc = run_promtool(promtool, "check", "rules", str(path))
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()
    assert b"SUCCESS: 11 rules found" in proc.stdout


def test_alert_unit_tests_pass(promtool: str, tmp_path: Path) -> None:
    """Annotations are left out of the copy the unit tests load (promtool compares them
    whole); `check rules` above parses their templates."""
    rules = rendered_rules()
    for rule in alerts_of(rules):
        rule.pop("annotations", None)
    (tmp_path / RULES_FILE).write_text(yaml.safe_dump(rules))
    for test in RULE_TESTS:
        (tmp_path / test.name).write_text(test.read_text())
    proc = run_promtool(promtool, "test", "rules", *(t.name for t in RULE_TESTS), cwd=tmp_path)
    out = (proc.stdout + proc.stderr).decode()
    assert proc.returncode == 0, out
    assert out.count("SUCCESS") == len(RULE_TESTS), out


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases: dict[str, set[bool]] = {}
    for path in RULE_TESTS:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == [RULES_FILE], path
        for group in doc["tests"]:
            for case in group["alert_rule_test"]:
                cases.setdefault(case["alertname"], set()).add(bool(case["exp_alerts"]))
    # No helm needed: the alert names as the template writes them.
    template = (CHART / "templates" / "prometheusrule.yaml").read_text()
    names = set(re.findall(r"- alert: (\w+)", template))
    assert len(names) == 11
    assert {n: cases.get(n, set()) for n in names} == {n: {True, False} for n in names}


def test_alerts_have_severity_summary_description_and_runbook() -> None:
    rules = alerts_of(rendered_rules())
    assert len(rules) == 11
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule


# ---- metric names: rules and dashboard against what the agent exports -----------------


def _exported_names() -> set[str]:
    """Every sample name of the two tables, each family given a series."""
    names = {READY_METRIC}
    for table in (Metrics(), ExtenderMetrics()):
        give_every_family_a_series(table)
        names.update(s.name for f in table.registry.collect() for s in f.samples)
    return names


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(gpu_share_\w+|scheduler_\w+)", expr))


def test_rules_and_dashboard_name_only_exported_metrics() -> None:
    """A renamed metric must be renamed here too (rules, dashboard)."""
    exprs = [r["expr"] for r in alerts_of(rendered_rules())]
    exprs += [e for _, e in dashboard_queries()]
    used = set().union(*map(_metric_names, exprs))
    # (scheduler_*: kube-scheduler's own, which nothing reads any more)
    assert used - _exported_names() == set()
    # and the dashboard shows each family of the agent and of the extender
    shown = set().union(*(_metric_names(e) for _, e in dashboard_queries()))
    families = {name for table in (Metrics(), ExtenderMetrics())
                for name, _, _ in table.families()} | {READY_METRIC}
    missing = {f for f in families if not any(n.startswith(f) for n in shown)}
    assert missing == set()


# ---- the dashboard ----------------------------------------------------------------------

# Grafana's own variables, replaced by what Grafana would put there.
BUILTIN_VARS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def _var_values(dash: dict[str, Any]) -> dict[str, str]:
    values = dict(BUILTIN_VARS)
    for var in dash["templating"]["list"]:
        # textbox/custom: their default; query variables: any value (All is ".*").
        values[var["name"]] = var["query"] if var["type"] in {"textbox", "custom"} else ".*"
    return values


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable, variables substituted."""
    dash = json.loads(DASHBOARD.read_text())
    values = _var_values(dash)

    def subst(expr: str) -> str:
        def one_var(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            assert name in values, f"unknown variable ${name} in {expr}"
            return values[name]

        return re.sub(r"\$\{(\w+)\}|\$(\w+)", one_var, expr)

    out = []
    for p in _panels(dash["panels"]):
        for t in p.get("targets", []):
            out.append((f"panel {p['id']} {p['title']!r} {t['refId']}", subst(t["expr"])))
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"]
            # label_values(<selector>, <label>) is Grafana's: its selector is PromQL.
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q)
            assert m, q
            out.append((f"variable {var['name']}", subst(m.group(1))))
    return out


def test_every_dashboard_query_parses(promtool: str, tmp_path: Path) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 30
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query:{i}", "expr": expr} for i, (_, expr) in enumerate(queries)
    ]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = run_promtool(promtool, "check", "rules", str(path))
    out = (proc.stdout + proc.stderr).decode()
    assert proc.returncode == 0, (out, queries)
    assert f"SUCCESS: {len(queries)} rules found" in out


def test_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    panels = list(_panels(dash["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    assert dash["uid"] == "gpu-share" and dash["templating"]["list"][0]["type"] == "datasource"
    for p in panels:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and all(t["datasource"]["uid"] == "${datasource}"
                                    for t in p["targets"]), p["title"]
        assert p.get("description"), p["title"]
    titles = " ".join(p["title"] for p in panels).lower()
    for topic in ("memory", "cores", "allocations", "failures", "latency", "health"):
        assert topic in titles, topic


def test_release_and_namespace_of_the_unit_tests() -> None:
    """The unit tests' series carry the namespace and job of the release they render."""
    assert (RELEASE, NAMESPACE) == ("gs", "gpu-share")
