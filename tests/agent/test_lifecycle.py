"""Start/stop of the agent in-process: a stop during a start
step that cannot be interrupted returns at once; one agent per state dir; an aborted
start never writes the ledger."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from gpu_share.agent.instance_lock import LOCK_FILE, InstanceLock, InstanceLockError
from gpu_share.agent.node_agent import NodeAgent
from gpu_share.cli import plugin_main
from gpu_share.config.model import AgentConfig
from gpu_share.devices.dummy import DummyBackend
from gpu_share.sharing.model import PodResourcesView
from gpu_share.sharing.node.ledger import Ledger
from tests.agent.served_agent import agent_config


def _cfg(d: Path) -> AgentConfig:
    return agent_config(
        d,
        memory_mib=4096,
        poll_s=None,
        identity={"useApiServer": False},
        publish={"nodeAnnotation": False, "podAnnotation": False, "events": False},
        metrics={"port": 0, "bindAddress": "127.0.0.1"},
    )


def _run_in_thread(cfg: AgentConfig, stop: threading.Event) -> tuple[threading.Thread, list[int]]:
    code: list[int] = []
    t = threading.Thread(target=lambda: code.append(plugin_main.run(cfg, stop)), daemon=True)
    t.start()
    return t, code


def test_stop_during_a_backend_start_that_hangs_returns_at_once(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML init can hang; the agent must still answer SIGTERM."""
    entered, release = threading.Event(), threading.Event()

    def hanging_start(cfg: AgentConfig) -> DummyBackend:
        entered.set()
        release.wait(60)
        raise AssertionError("not reached in time")

    monkeypatch.setattr(plugin_main, "start_backend", hanging_start)
    stop = threading.Event()
    t, code = _run_in_thread(_cfg(workdir), stop)
    try:
        assert entered.wait(10)
        t0 = time.monotonic()
        stop.set()
        t.join(5.0)
        assert not t.is_alive() and code == [0]
        assert time.monotonic() - t0 < 2.0
        assert list((workdir / "dp").iterdir()) == []
    finally:
        release.set()


def test_stop_during_a_start_reconcile_that_hangs_returns_at_once(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PodResources may answer only after its timeout (up to 30 s)."""
    entered, release = threading.Event(), threading.Event()

    def hanging_list(self: object) -> PodResourcesView:
        entered.set()
        release.wait(60)
        return PodResourcesView(())

    monkeypatch.setattr(plugin_main.PodResourcesClient, "list", hanging_list)
    stop = threading.Event()
    t, code = _run_in_thread(_cfg(workdir), stop)
    try:
        assert entered.wait(10)
        stop.set()
        t.join(5.0)
        assert not t.is_alive() and code == [0]
        assert not (workdir / "state" / "ledger.json").exists()  # start never finished
    finally:
        release.set()


def test_instance_lock_is_exclusive_and_names_the_holder(workdir: Path) -> None:
    a, b = InstanceLock(workdir / "state"), InstanceLock(workdir / "state")
    a.acquire()
    try:
        with pytest.raises(InstanceLockError, match=f"pid {os.getpid()}") as err:
            b.acquire()
        assert err.value.reason == "AgentAlreadyRunning"
        assert LOCK_FILE in str(err.value)
    finally:
        a.release()
    b.acquire()  # free again once released
    b.release()


def test_run_refuses_a_locked_state_dir_before_touching_anything(workdir: Path) -> None:
    cfg = _cfg(workdir)
    state = workdir / "state"
    state.mkdir()
    ledger = state / "ledger.json"
    ledger.write_text(Ledger().to_json())
    stale = workdir / "dp" / "gpu-share-vcuda-memory.sock"
    stale.write_text("someone's")
    before = (ledger.read_bytes(), ledger.stat().st_ino, ledger.stat().st_mtime_ns)
    holder = InstanceLock(state)
    holder.acquire()
    try:
        t0 = time.monotonic()
        assert plugin_main.run(cfg, threading.Event()) == 1
        assert time.monotonic() - t0 < 5.0
    finally:
        holder.release()
    assert (ledger.read_bytes(), ledger.stat().st_ino, ledger.stat().st_mtime_ns) == before
    assert stale.read_text() == "someone's"  # not even a stale file was removed


class _BrokenPodResources:
    """Fails in an unexpected way (not a KubeAccessError), after the ledger was loaded."""

    def list(self) -> PodResourcesView:
        raise RuntimeError("boom")


def test_an_aborted_start_never_writes_the_ledger(workdir: Path) -> None:
    cfg = _cfg(workdir)
    state = workdir / "state"
    state.mkdir()
    ledger = state / "ledger.json"
    ledger.write_text(Ledger().to_json() + "\n")
    before = (ledger.read_bytes(), ledger.stat().st_ino, ledger.stat().st_mtime_ns)
    backend = DummyBackend(cfg.dummy, cfg.node_name)
    backend.start()
    agent = NodeAgent(cfg, backend, pod_resources=_BrokenPodResources(), pods=None,
                      publisher=None)
    with pytest.raises(RuntimeError, match="boom"):
        agent.start()
    agent.stop()
    assert (ledger.read_bytes(), ledger.stat().st_ino, ledger.stat().st_mtime_ns) == before


def test_stop_is_bounded_while_a_kubelet_call_holds_the_agent(workdir: Path) -> None:
    """A call stuck on PodResources holds the agent's lock; stop() leaves it be (the call
    writes the ledger itself) instead of waiting for it."""
    cfg = _cfg(workdir)
    backend = DummyBackend(cfg.dummy, cfg.node_name)
    backend.start()
    agent = NodeAgent(cfg, backend, pod_resources=None, pods=None, publisher=None)
    agent.start()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with agent._lock:
            held.set()
            release.wait(30)

    threading.Thread(target=hold, daemon=True).start()
    try:
        assert held.wait(5)
        t0 = time.monotonic()
        agent.stop(timeout_s=1.0)
        assert time.monotonic() - t0 < 2.0
    finally:
        release.set()
