"""Background loops are supervised: a failing pass is logged (rate-limited), counted in
``gpu_share_loop_errors_total{loop}``, and the loop goes on; a loop that stops beating
makes ``/healthz`` answer 503 naming it."""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpu_share.agent.node_agent import NodeAgent
from gpu_share.agent.publisher import BackgroundPublisher
from gpu_share.cli.plugin_main import PrometheusAgentMetrics
from gpu_share.config.model import AgentConfig
from gpu_share.devices.base import HealthEvent
from gpu_share.devices.dummy import DummyBackend, write_faults
from gpu_share.observability.http import start_http
from gpu_share.observability.loops import Backoff, LoopStalledError, LoopSupervisor
from gpu_share.observability.metrics import Metrics
from gpu_share.sharing.ids import parse_unit_id
from gpu_share.sharing.model import ResourceKind
from testkit.harness.wait import poll
from tests.agent.served_agent import agent_config

FAST = Backoff(0.01, 0.05)


def _cfg(d: Path) -> AgentConfig:
    return agent_config(d, memory_mib=4096)


def _errors(metrics: Metrics, loop: str) -> float:
    value = metrics.registry.get_sample_value("gpu_share_loop_errors_total", {"loop": loop})
    return value or 0.0


def _unhealthy_devices(agent: NodeAgent) -> set[int]:
    """Device indexes whose memory units are advertised unhealthy."""
    index = {d.uuid: d.index for d in agent.backend.devices()}
    return {
        index[parse_unit_id(d.id).device]
        for d in agent.calls.advertised(ResourceKind.MEMORY)
        if not d.healthy
    }


def test_nested_array_fault_file_does_not_kill_the_health_loop(workdir: Path) -> None:
    """The issue's reproducer: a fault file of 100000 '[' made json raise RecursionError,
    which killed the health thread; the device then never recovered."""
    cfg = _cfg(workdir)
    backend = DummyBackend(cfg.dummy, cfg.node_name, check_interval_s=0.02)
    backend.start()
    metrics = Metrics()
    agent = NodeAgent(cfg, backend, pod_resources=None, pods=None, publisher=None,
                      metrics=PrometheusAgentMetrics(metrics))
    agent.start()
    try:
        write_faults(cfg.dummy.fault_file, [0])
        assert poll(lambda: _unhealthy_devices(agent) == {0}, 5)
        Path(cfg.dummy.fault_file).write_text("[" * 100_000)
        assert poll(lambda: backend.fault_file_error is not None, 5)
        assert "not valid JSON" in (backend.fault_file_error or "")
        # The previous fault state is kept, and the loop still beats.
        time.sleep(0.3)
        assert _unhealthy_devices(agent) == {0}
        assert agent.loops.alive()
        assert all(t.is_alive() for t in agent._threads)
        # Fixed file: applied, both ways.
        write_faults(cfg.dummy.fault_file, [1])
        assert poll(lambda: _unhealthy_devices(agent) == {1}, 5)
        write_faults(cfg.dummy.fault_file, [])
        assert poll(lambda: _unhealthy_devices(agent) == set(), 5)
    finally:
        agent.stop()


class _Exploding:
    """poll_health raises (RecursionError, not a GpuShareError) a few times."""

    def __init__(self, inner: DummyBackend, failures: int) -> None:
        self._inner = inner
        self.failures = failures
        self.name = inner.name

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def poll_health(self, timeout_s: float) -> list[HealthEvent]:
        if self.failures > 0:
            self.failures -= 1
            raise RecursionError("maximum recursion depth exceeded")
        return self._inner.poll_health(timeout_s)


def test_a_raising_loop_is_restarted_and_counted(workdir: Path) -> None:
    cfg = _cfg(workdir)
    inner = DummyBackend(cfg.dummy, cfg.node_name, check_interval_s=0.02)
    inner.start()
    backend = _Exploding(inner, failures=3)
    metrics = Metrics()
    am = PrometheusAgentMetrics(metrics)
    agent = NodeAgent(cfg, backend, pod_resources=None, pods=None, publisher=None,  # type: ignore[arg-type]
                      metrics=am, loops=LoopSupervisor(on_error=am.loop_error, backoff=FAST))
    agent.start()
    try:
        assert poll(lambda: _errors(metrics, "health") == 3, 5)
        # Still polling after the failures: a fault written now is applied.
        write_faults(cfg.dummy.fault_file, [1])
        assert poll(lambda: _unhealthy_devices(agent) == {1}, 5)
        assert _errors(metrics, "health") == 3
    finally:
        agent.stop()


def test_failures_are_logged_once_per_window_and_recovery_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sup = LoopSupervisor(backoff=FAST, log_every_s=60.0)
    stop = threading.Event()
    calls = {"n": 0}

    def step() -> None:
        calls["n"] += 1
        if calls["n"] <= 20:
            raise ValueError("x" * 10_000)  # long text: cut in the log line
        stop.set()

    with caplog.at_level(logging.INFO, logger="gpu_share.observability.loops"):
        sup.run("busy", step, max_age_s=10.0, stop=stop)
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in failed]
    assert len(failed[0].getMessage()) < 400
    assert failed[0].exc_info is None  # one line, no traceback storm
    assert any("recovered after 20 failure(s)" in r.getMessage() for r in caplog.records)


def test_stuck_loop_turns_healthz_503_naming_it() -> None:
    now = [1000.0]
    sup = LoopSupervisor(clock=lambda: now[0])
    sup.register("health", max_age_s=30.0)
    sup.register("reconcile", max_age_s=180.0)
    http = start_http(Metrics().registry, bind_address="127.0.0.1", port=0,
                      liveness=sup.check)
    url = f"http://127.0.0.1:{http.port}/healthz"
    try:
        assert _get(url) == (200, "ok")
        now[0] += 31.0
        sup.beat("reconcile")
        code, body = _get(url)
        assert code == 503
        assert "loop health has not beaten for 31s" in body and "reconcile" not in body
        sup.beat("health")
        assert _get(url) == (200, "ok")
    finally:
        http.stop()
    with pytest.raises(LoopStalledError):
        now[0] += 1000.0
        sup.check()


def test_agent_loops_beat_and_a_blocked_one_is_named(workdir: Path) -> None:
    """A health poll that never returns stops the health loop's heartbeat."""
    cfg = _cfg(workdir)
    inner = DummyBackend(cfg.dummy, cfg.node_name, check_interval_s=0.02)
    inner.start()
    release = threading.Event()

    class _Hanging(_Exploding):
        def poll_health(self, timeout_s: float) -> list[HealthEvent]:
            release.wait(10)
            return []

    now = [0.0]
    sup = LoopSupervisor(clock=lambda: now[0])
    agent = NodeAgent(cfg, _Hanging(inner, 0), pod_resources=None, pods=None,  # type: ignore[arg-type]
                      publisher=None, loops=sup)
    agent.start()
    try:
        assert sup.check()
        now[0] += 130.0  # past health's max age (2 polls + 120 s), within the others'
        assert poll(lambda: {n for n, _, _ in sup.stale()} == {"health"}, 5)
        with pytest.raises(LoopStalledError, match="loop health"):
            sup.check()
    finally:
        release.set()
        agent.stop()


class _Target:
    def __init__(self) -> None:
        self.node: list[Mapping[str, str | None]] = []

    def annotate_node(self, node_name: str, annotations: Mapping[str, str | None],
                      labels: Mapping[str, str | None] | None = None) -> None:
        self.node.append(annotations)

    def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        pass

    def pod_event(self, namespace: str, name: str, *, reason: str, message: str,
                  warning: bool) -> None:
        pass

    def node_event(self, node_name: str, *, reason: str, message: str, warning: bool) -> None:
        pass


def test_publisher_survives_a_raising_annotation_source_and_retries_it() -> None:
    target = _Target()
    fail = {"n": 2}

    def node_annotations() -> Mapping[str, str | None]:
        if fail["n"] > 0:
            fail["n"] -= 1
            raise RecursionError("deep")
        return {"k": "v"}

    errors: list[str] = []
    sup = LoopSupervisor(on_error=errors.append, backoff=FAST)
    pub = BackgroundPublisher(target, "node-a", node_annotations, lambda ns, n: None)
    pub.start(sup)
    try:
        pub.node_changed()
        assert poll(lambda: target.node == [{"k": "v"}], 5)  # the same change, retried
        assert errors == ["publisher", "publisher"]
    finally:
        pub.stop(2.0)
    assert pub._thread is not None and not pub._thread.is_alive()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status), resp.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()
