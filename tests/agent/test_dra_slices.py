"""agent.dra.slices: the node's ResourceSlice follows the inventory, survives failures
(logged, counted, retried with backoff) and is removed on a clean exit."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from gpu_share.agent.dra.slices import DRA_SLICES_LOOP, KUBE_OP, DraSliceLoop
from gpu_share.agent.feed import ChangeFeed
from gpu_share.agent.node_agent import NodeAgent
from gpu_share.cli.plugin_main import PrometheusAgentMetrics
from gpu_share.devices.base import Device
from gpu_share.devices.dummy import DummyBackend, write_faults
from gpu_share.errors import KubeAccessError
from gpu_share.observability.loops import Backoff, LoopSupervisor
from gpu_share.observability.metrics import Metrics
from gpu_share.sharing.dra.slices import SliceContent, slice_content
from gpu_share.sharing.inventory import Inventory
from testkit.harness.wait import poll
from tests.agent.served_agent import agent_config

FAST = Backoff(0.01, 0.05)
DRIVER = "gpu-share.vendor.com"


class Sink:
    """Records what would be published; ``failures`` calls raise first."""

    def __init__(self, failures: int = 0) -> None:
        self.published: list[SliceContent] = []
        self.failures = failures
        self.removed = 0
        self.remove_fails = False
        self.lock = threading.Lock()

    def publish(self, content: SliceContent) -> object:
        with self.lock:
            if self.failures > 0:
                self.failures -= 1
                raise KubeAccessError("API server unreachable")
            self.published.append(content)
        return None

    def remove_all(self) -> int:
        if self.remove_fails:
            raise KubeAccessError("gone")
        self.removed += 1
        return 1

    def devices(self) -> list[list[str]]:
        with self.lock:
            return [[d["name"] for d in c.devices] for c in self.published]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def inventory(*unhealthy: int) -> Inventory:
    devices = [Device(uuid=f"GPU-{i}", index=i, minor=i, memory_mib=4096, model="T4",
                      healthy=i not in unhealthy) for i in range(2)]
    return Inventory.from_devices(devices, 1024)


def loop_over(holder: list[Inventory], sink: Sink, **kw: Any) -> DraSliceLoop:
    return DraSliceLoop(sink, lambda: content_of(holder[0], "node-a", "550"), **kw)


def content_of(inv: Inventory, node: str, driver_version: str) -> SliceContent:
    return slice_content(inv, node_name=node, driver=DRIVER, driver_version=driver_version)


def test_publishes_on_change_and_on_resync_only() -> None:
    holder, sink, clock = [inventory()], Sink(), Clock()
    loop = loop_over(holder, sink, resync_s=60.0, clock=clock,
                     wait_for_change=lambda seen, timeout: seen)
    loop.step()
    loop.step()
    assert sink.devices() == [["gpu-0", "gpu-1"]]  # the second pass: nothing new
    holder[0] = inventory(1)
    loop.step()
    assert sink.devices()[-1] == ["gpu-0"]
    clock.t = 61.0  # resync: published although nothing changed
    loop.step()
    assert len(sink.published) == 3 and sink.published[-1].digest == sink.published[-2].digest
    loop.step()
    assert len(sink.published) == 3


def test_a_failed_publish_raises_is_reported_and_stays_due() -> None:
    holder, sink = [inventory()], Sink(failures=1)
    errors: list[str] = []
    loop = loop_over(holder, sink, on_error=errors.append,
                     wait_for_change=lambda seen, timeout: seen)
    with pytest.raises(KubeAccessError):
        loop.step()
    assert errors == [KUBE_OP] and sink.published == []
    loop.step()  # the same content is still due
    assert sink.devices() == [["gpu-0", "gpu-1"]]


def test_a_broken_error_hook_does_not_break_the_loop() -> None:
    def hook(_op: str) -> None:
        raise RuntimeError("metric broke")

    sink = Sink(failures=1)
    loop = loop_over([inventory()], sink, on_error=hook, wait_for_change=lambda s, t: s)
    with pytest.raises(KubeAccessError):
        loop.step()
    loop.step()
    assert len(sink.published) == 1


def test_supervised_loop_retries_with_backoff_and_counts_failures() -> None:
    metrics = Metrics()
    pm = PrometheusAgentMetrics(metrics)
    supervisor = LoopSupervisor(on_error=pm.loop_error, backoff=FAST)
    sink = Sink(failures=3)
    feed = ChangeFeed()
    holder = [inventory()]
    loop = loop_over(holder, sink, on_error=pm.kube_error, wait_for_change=feed.wait_for_change)
    thread = loop.start(supervisor)
    try:
        assert poll(lambda: len(sink.published) == 1, 5)
        assert metrics.registry.get_sample_value(
            "gpu_share_loop_errors_total", {"loop": DRA_SLICES_LOOP}) == 3
        assert metrics.registry.get_sample_value(
            "gpu_share_kube_errors_total", {"op": KUBE_OP}) == 3
        holder[0] = inventory(0)
        feed.bump()
        assert poll(lambda: sink.devices()[-1] == ["gpu-1"], 5)
        assert supervisor.alive()
    finally:
        assert loop.stop(remove=True, timeout_s=5)
    assert not thread.is_alive()
    assert sink.removed == 1


def test_stop_without_remove_keeps_the_slice_and_a_failed_remove_does_not_raise() -> None:
    sink = Sink()
    loop = loop_over([inventory()], sink)
    loop.start(LoopSupervisor(backoff=FAST))
    assert loop.stop(remove=False)
    assert sink.removed == 0
    sink.remove_fails = True
    errors: list[str] = []
    loop2 = loop_over([inventory()], sink, on_error=errors.append)
    assert loop2.stop(remove=True) is False
    assert errors == [KUBE_OP]


def test_changed_wakes_a_loop_without_a_feed() -> None:
    holder, sink = [inventory()], Sink()
    loop = loop_over(holder, sink)
    loop.start(LoopSupervisor(backoff=FAST))
    try:
        assert poll(lambda: len(sink.published) == 1, 5)
        holder[0] = inventory(0, 1)
        loop.changed()
        assert poll(lambda: sink.devices()[-1:] == [[]], 5)
    finally:
        loop.stop(remove=False)


def test_follows_a_real_agents_health(workdir: Path) -> None:
    """The agent's engine inventory and change feed drive the slice: a device fault
    removes the device from the slice, recovery brings it back."""
    cfg = agent_config(workdir, memory_mib=4096)
    backend = DummyBackend(cfg.dummy, cfg.node_name, check_interval_s=0.02)
    backend.start()
    agent = NodeAgent(cfg, backend, pod_resources=None, pods=None, publisher=None)
    agent.start()
    sink = Sink()
    loop = DraSliceLoop(
        sink, lambda: content_of(agent._engine().inventory, cfg.node_name, "dummy"),
        wait_for_change=agent.feed.wait_for_change,
    )
    loop.start(agent.loops)
    try:
        assert poll(lambda: sink.devices()[-1:] == [["gpu-0", "gpu-1"]], 5)
        write_faults(cfg.dummy.fault_file, [0])
        assert poll(lambda: sink.devices()[-1:] == [["gpu-1"]], 5)
        write_faults(cfg.dummy.fault_file, [])
        assert poll(lambda: sink.devices()[-1:] == [["gpu-0", "gpu-1"]], 5)
        assert len(sink.published) == 3  # one write per change, none in between
    finally:
        loop.stop(remove=True)
        agent.stop()
    assert sink.removed == 1


def test_a_registration_rechecks_the_slice_at_its_delays_even_when_unchanged() -> None:
    """A kubelet that starts deletes its node's slices, possibly after the driver
    registered again (story 11e): each registration schedules checks that publish the
    unchanged content (the publisher writes only what is missing or differs)."""
    holder, sink, clock = [inventory()], Sink(), Clock()
    loop = loop_over(holder, sink, resync_s=1000.0, clock=clock,
                     wait_for_change=lambda seen, timeout: seen)
    loop.step()
    assert len(sink.published) == 1
    loop.recheck(after_s=(0.0, 5.0))
    loop.step()  # the check due now
    assert len(sink.published) == 2
    loop.step()  # the next one is not due yet
    assert len(sink.published) == 2
    clock.t = 5.0
    loop.step()
    loop.step()
    assert len(sink.published) == 3  # done once, then nothing is pending


def test_a_failed_recheck_stays_due() -> None:
    holder, sink, clock = [inventory()], Sink(), Clock()
    loop = loop_over(holder, sink, resync_s=1000.0, clock=clock,
                     wait_for_change=lambda seen, timeout: seen)
    loop.step()
    loop.recheck(after_s=(0.0,))
    sink.failures = 1
    with pytest.raises(KubeAccessError):
        loop.step()
    loop.step()
    assert len(sink.published) == 2
