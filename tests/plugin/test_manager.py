"""Registration and the kubelet-restart dance, with the kubelet stub on real sockets."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from gpu_share.errors import KubeAccessError
from gpu_share.plugin.manager import PluginManager
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp
from gpu_share.plugin.registration import RegistrationPolicy, register_with_retry
from testkit.fake_handler import FakeHandler
from testkit.harness.wait import poll
from testkit.kubelet_stub import KubeletStub, fast_plugin_settings

FAST = fast_plugin_settings()


def _run(manager: PluginManager) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=manager.run_until, args=(stop,), daemon=True)
    thread.start()
    return stop, thread


def _finish(stop: threading.Event, thread: threading.Thread) -> None:
    stop.set()
    thread.join(10)
    assert not thread.is_alive()


@pytest.fixture
def registered(kubelet: KubeletStub, manager: PluginManager) -> PluginManager:
    """``manager`` started, its plugin registered once."""
    manager.start()
    kubelet.wait_for_registrations(1)
    return manager


def test_registration_fields(kubelet: KubeletStub, manager: PluginManager) -> None:
    manager.start()
    (req,) = kubelet.wait_for_registrations(1)
    assert req.version == "v1beta1"
    assert req.endpoint == "gpu-share-vcuda-memory.sock"
    assert req.resource_name == "vendor.com/vcuda-memory"
    assert req.options.get_preferred_allocation_available is True
    assert req.options.pre_start_required is False
    # The endpoint named is really served in the kubelet's dir.
    client = kubelet.plugin(req.endpoint).watch()
    assert [d.id for d in client.wait_for_list()] == ["dev-0", "dev-1", "dev-2", "dev-3"]


def test_two_resources_register_separately(sock_dir: Path, kubelet: KubeletStub) -> None:
    mem = FakeHandler()
    core = FakeHandler(
        resource_name="vendor.com/vcuda-core",
        endpoint="gpu-share-vcuda-core.sock",
        preferred_allocation_available=False,
        pre_start_required=True,
    )
    mgr = PluginManager([mem, core], sock_dir, FAST)
    try:
        mgr.start()
        reqs = kubelet.wait_for_registrations(2)
        assert {(r.resource_name, r.endpoint, r.options.pre_start_required) for r in reqs} == {
            ("vendor.com/vcuda-memory", "gpu-share-vcuda-memory.sock", False),
            ("vendor.com/vcuda-core", "gpu-share-vcuda-core.sock", True),
        }
    finally:
        mgr.stop()


def test_registration_waits_for_a_late_kubelet(sock_dir: Path, manager: PluginManager) -> None:
    kubelet = KubeletStub(sock_dir)
    started = threading.Event()

    def start_late() -> None:
        # Only once the manager's first attempts have failed.
        started.wait(5)
        kubelet.start()

    threading.Thread(target=start_late, daemon=True).start()
    result: list[BaseException | None] = []

    def run_start() -> None:
        try:
            manager.start()
            result.append(None)
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=run_start, daemon=True)
    t.start()
    try:
        assert poll(lambda: (sock_dir / "gpu-share-vcuda-memory.sock").exists())
        assert not (sock_dir / "kubelet.sock").exists()
        started.set()
        t.join(10)
        assert result == [None]
        assert len(kubelet.wait_for_registrations(1)) == 1
    finally:
        kubelet.stop()


def test_registration_gives_up_with_clear_error(sock_dir: Path, handler: FakeHandler) -> None:
    policy = RegistrationPolicy(
        max_attempts=3, max_total_s=5, initial_backoff_s=0.01, max_backoff_s=0.02, jitter_s=0
    )
    mgr = PluginManager([handler], sock_dir, replace(FAST, registration=policy))
    try:
        with pytest.raises(KubeAccessError) as info:
            mgr.start()
        err = info.value
        assert err.reason == "KubeletRegistrationFailed"
        assert "vendor.com/vcuda-memory" in err.message
        assert "3 attempt(s)" in err.message
        assert "kubelet.sock" in err.message
    finally:
        mgr.stop()


def test_kubelet_rejection_is_reported(kubelet: KubeletStub, sock_dir: Path) -> None:
    kubelet.register_error = (grpc.StatusCode.UNKNOWN, "resource name taken")
    policy = RegistrationPolicy(
        max_attempts=2, max_total_s=5, initial_backoff_s=0.01, max_backoff_s=0.02, jitter_s=0
    )
    handler = FakeHandler()
    mgr = PluginManager([handler], sock_dir, replace(FAST, registration=policy))
    try:
        with pytest.raises(KubeAccessError, match="resource name taken"):
            mgr.start()
        assert len(kubelet.registrations) == 2
    finally:
        mgr.stop()


def test_registration_stops_when_aborted(sock_dir: Path, handler: FakeHandler) -> None:
    abort = threading.Event()
    abort.set()
    with pytest.raises(KubeAccessError, match="stopped"):
        register_with_retry(
            sock_dir / "kubelet.sock",
            sock_dir / "none.sock",
            dp.RegisterRequest(resource_name="r", endpoint="none.sock"),
            RegistrationPolicy(max_attempts=1000, max_total_s=60, call_timeout_s=0.1),
            abort=abort,
        )


def test_reregisters_after_kubelet_restart_with_old_server_stopped_first(
    kubelet: KubeletStub, registered: PluginManager
) -> None:
    plugin = registered.plugins[0]
    old = plugin.server
    assert old is not None
    client = kubelet.plugin(plugin.handler.endpoint).watch()
    client.wait_for_list()
    old_was_stopped: list[bool] = []
    kubelet.on_register = lambda _req: old_was_stopped.append(old.stopped)
    stop, thread = _run(registered)
    try:
        kubelet.restart()  # deletes our socket too, new kubelet.sock
        regs = kubelet.wait_for_registrations(2)
        assert len(regs) == 2 and regs[1].endpoint == regs[0].endpoint
        assert old_was_stopped and all(old_was_stopped)
        assert client.watch_ended.wait(5)  # old stream was closed by the old server
        assert plugin.generation == 2
        fresh = kubelet.plugin(regs[1].endpoint).watch()
        assert len(fresh.wait_for_list()) == 4
    finally:
        _finish(stop, thread)


def test_kubelet_sock_recreated_without_deleting_ours(
    kubelet: KubeletStub, registered: PluginManager
) -> None:
    stop, thread = _run(registered)
    try:
        kubelet.restart(delete_sockets=False)
        kubelet.wait_for_registrations(2)
        assert registered.plugins[0].generation == 2
    finally:
        _finish(stop, thread)


def test_reserves_and_reregisters_after_own_socket_deleted(
    kubelet: KubeletStub, registered: PluginManager
) -> None:
    plugin = registered.plugins[0]
    old = plugin.server
    stop, thread = _run(registered)
    try:
        plugin.socket_path.unlink()
        kubelet.wait_for_registrations(2)
        assert old is not None and old.stopped
        assert plugin.socket_path.is_socket()
        assert len(kubelet.plugin(plugin.handler.endpoint).watch().wait_for_list()) == 4
    finally:
        _finish(stop, thread)


def test_no_spurious_reregistration_when_nothing_changes(
    kubelet: KubeletStub, registered: PluginManager
) -> None:
    for _ in range(10):
        registered.reconcile()
    assert len(kubelet.registrations) == 1
    assert registered.plugins[0].generation == 1


def test_stop_removes_sockets_and_is_idempotent(
    kubelet: KubeletStub, registered: PluginManager, sock_dir: Path
) -> None:
    sock = sock_dir / "gpu-share-vcuda-memory.sock"
    assert sock.is_socket()
    stop, thread = _run(registered)
    registered.stop()
    thread.join(10)
    assert not thread.is_alive()  # run_until returns after stop()
    assert not sock.exists()
    assert (sock_dir / "kubelet.sock").exists()  # never touch the kubelet's
    registered.stop()
    stop.set()


def test_run_until_returns_on_event_and_cleans_up(
    kubelet: KubeletStub, manager: PluginManager, sock_dir: Path
) -> None:
    manager.start()
    stop, thread = _run(manager)
    _finish(stop, thread)
    assert not (sock_dir / "gpu-share-vcuda-memory.sock").exists()


def test_endpoints_must_be_distinct(sock_dir: Path) -> None:
    with pytest.raises(ValueError, match="share one endpoint"):
        PluginManager([FakeHandler(), FakeHandler()], sock_dir, FAST)
    with pytest.raises(ValueError, match="kubelet"):
        PluginManager([FakeHandler(endpoint="kubelet.sock")], sock_dir, FAST)
