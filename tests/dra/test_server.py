"""L2: the two unix sockets of the DRA plugin: modes, stale and foreign files, bounded
stop with a call in flight, bounded concurrency, sockets served again after deletion."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from gpu_share.dra import sockets
from gpu_share.dra.server import DraPluginServer, DraServeOptions
from gpu_share.dra.sockets import DraServeError
from testkit.harness.wait import poll
from tests.dra.conftest import DRIVER, FAST, FakePreparer, Kubelet

UID = "0b6c2a9e-5f1d-4c1e-9a57-3f7e2d1c0a01"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)



def _server(sock_dir: Path, preparer: FakePreparer, **options: float) -> DraPluginServer:
    return DraPluginServer(
        DRIVER,
        preparer,
        plugin_dir=sock_dir / "plugins" / DRIVER,
        registration_dir=sock_dir / "plugins_registry",
        options=DraServeOptions(**{**FAST.__dict__, **options}),
    )


@pytest.fixture
def listener() -> Iterator[Callable[[Path], socket.socket]]:
    """Live foreign unix listeners put at a path in one step (rename over whatever is
    there, so a polling watcher never sees the path empty), closed at the end."""
    opened: list[socket.socket] = []

    def listen(path: Path) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        temp = path.with_name(".foreign")
        s.bind(str(temp))
        s.listen()
        os.replace(temp, path)
        opened.append(s)
        return s

    yield listen
    for s in opened:
        s.close()


def test_sockets_are_owner_only_and_no_temporary_is_left(plugin: DraPluginServer) -> None:
    assert stat.S_ISSOCK(plugin.dra_socket.lstat().st_mode)
    assert stat.S_ISSOCK(plugin.registration_socket.lstat().st_mode)
    assert _mode(plugin.dra_socket) == 0o600
    assert _mode(plugin.registration_socket) == 0o600
    assert _mode(plugin.plugin_dir) == 0o700
    assert [p.name for p in plugin.plugin_dir.iterdir()] == ["dra.sock"]
    assert [p.name for p in plugin.registration_dir.iterdir()] == [f"{DRIVER}-reg.sock"]


def test_own_plugin_dir_is_tightened(sock_dir: Path, preparer: FakePreparer) -> None:
    plugin_dir = sock_dir / "plugins" / DRIVER
    plugin_dir.mkdir(parents=True, mode=0o755)
    plugin_dir.chmod(0o755)
    server = _server(sock_dir, preparer)
    server.start()
    try:
        assert _mode(plugin_dir) == 0o700
    finally:
        server.stop()


def test_stop_removes_both_sockets_and_is_idempotent(plugin: DraPluginServer) -> None:
    plugin.stop()
    plugin.stop()
    assert not plugin.dra_socket.exists() and not plugin.registration_socket.exists()
    assert not plugin.running
    with pytest.raises(RuntimeError):
        plugin.start()


def test_stale_files_are_replaced(sock_dir: Path, preparer: FakePreparer) -> None:
    server = _server(sock_dir, preparer)
    server.plugin_dir.mkdir(parents=True)
    server.registration_dir.mkdir(parents=True)
    # A socket nobody listens on any more (a killed agent) and a plain file.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(server.dra_socket))
    dead.close()
    server.registration_socket.write_text("leftover")
    server.start()
    try:
        kubelet = Kubelet(server.registration_socket)
        assert kubelet.get_info().name == DRIVER
        assert kubelet.prepare("v1", server.dra_socket, [("ns", "c", UID)]).claims[UID].error == ""
        kubelet.close()
    finally:
        server.stop()


@pytest.mark.parametrize("which", ["dra", "registration"])
def test_a_live_foreign_socket_is_not_taken_over(
    which: str,
    sock_dir: Path,
    preparer: FakePreparer,
    listener: Callable[[Path], socket.socket],
) -> None:
    server = _server(sock_dir, preparer)
    server.plugin_dir.mkdir(parents=True)
    server.registration_dir.mkdir(parents=True)
    path = server.dra_socket if which == "dra" else server.registration_socket
    listener(path)
    before = sockets.socket_identity(path)
    with pytest.raises(DraServeError) as err:
        server.start()
    assert err.value.reason == sockets.SOCKET_IN_USE
    assert sockets.socket_identity(path) == before
    server.stop()
    assert sockets.socket_identity(path) == before
    assert not server.dra_socket.exists() or which == "dra"


def test_socket_path_too_long_is_named(sock_dir: Path, preparer: FakePreparer) -> None:
    server = DraPluginServer(
        DRIVER, preparer, plugin_dir=sock_dir / ("d" * 120), registration_dir=sock_dir / "r"
    )
    with pytest.raises(DraServeError) as err:
        server.start()
    assert err.value.reason == sockets.SOCKET_PATH_TOO_LONG
    server.stop()


def test_stop_within_five_seconds_with_a_call_in_flight(
    plugin: DraPluginServer, kubelet: Kubelet, preparer: FakePreparer
) -> None:
    preparer.block = True
    outcome: dict[str, object] = {}

    def call() -> None:
        try:
            outcome["response"] = kubelet.prepare("v1", plugin.dra_socket, [("ns", "c", UID)],
                                                  timeout=30)
        except grpc.RpcError as exc:
            outcome["code"] = exc.code()

    caller = threading.Thread(target=call)
    caller.start()
    assert preparer.entered.wait(5)
    started = time.monotonic()
    plugin.stop()
    took = time.monotonic() - started
    assert took < 5.0, took
    caller.join(5)
    assert not caller.is_alive()
    assert outcome.get("code") in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
    assert not plugin.dra_socket.exists() and not plugin.registration_socket.exists()
    preparer.release.set()


def test_calls_beyond_the_bound_are_refused(sock_dir: Path, preparer: FakePreparer) -> None:
    preparer.block = True
    server = _server(sock_dir, preparer, max_workers=1, max_concurrent_rpcs=2)
    server.start()
    kubelet = Kubelet(server.registration_socket)
    stub = kubelet.dra("v1", server.dra_socket)
    from gpu_share.dra.proto import dra_v1_pb2 as v1

    request = v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace="n", name="c", uid=UID)])
    try:
        first = stub.NodePrepareResources.future(request, timeout=20)
        assert preparer.entered.wait(5)
        second = stub.NodePrepareResources.future(request, timeout=20)
        time.sleep(0.2)  # queued behind the first (one worker)
        with pytest.raises(grpc.RpcError) as err:
            stub.NodePrepareResources(request, timeout=5)
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        preparer.release.set()
        assert first.result().claims[UID].error == ""
        assert second.result().claims[UID].error == ""
    finally:
        preparer.release.set()
        kubelet.close()
        server.stop()


def test_deleted_registration_socket_is_served_again(
    plugin: DraPluginServer, kubelet: Kubelet
) -> None:
    kubelet.register()
    old = sockets.socket_identity(plugin.registration_socket)
    plugin.registration_socket.unlink()
    assert poll(lambda: plugin.registration_socket.exists())
    assert sockets.socket_identity(plugin.registration_socket) != old
    assert _mode(plugin.registration_socket) == 0o600
    # The kubelet sees a new socket and registers again.
    since = time.monotonic()
    fresh = Kubelet(plugin.registration_socket)
    try:
        assert fresh.get_info().name == DRIVER
        fresh.notify(True)
        assert plugin.registration.wait_outcome(5, after=since) is not None
    finally:
        fresh.close()
    assert plugin.restarts == 1
    assert [p.name for p in plugin.registration_dir.iterdir()] == [f"{DRIVER}-reg.sock"]


def test_registration_socket_replaced_by_a_file_is_served_again(
    plugin: DraPluginServer,
) -> None:
    plugin.registration_socket.unlink()
    plugin.registration_socket.write_text("not a socket")
    assert poll(plugin.registration_socket.is_socket)  # False while it is missing
    kubelet = Kubelet(plugin.registration_socket)
    try:
        assert kubelet.get_info().name == DRIVER
    finally:
        kubelet.close()


def test_deleted_dra_socket_is_served_again(
    plugin: DraPluginServer, kubelet: Kubelet
) -> None:
    plugin.dra_socket.unlink()
    assert poll(lambda: plugin.dra_socket.exists())
    fresh = Kubelet(plugin.registration_socket)
    try:
        assert fresh.prepare("v1beta1", plugin.dra_socket, [("ns", "c", UID)]).claims[UID]
    finally:
        fresh.close()
    assert plugin.restarts == 1


def test_stop_leaves_a_foreign_socket_at_our_path_alone(
    sock_dir: Path, preparer: FakePreparer, listener: Callable[[Path], socket.socket]
) -> None:
    # No watcher restart (long poll): someone else's socket took our public path.
    server = _server(sock_dir, preparer, watch_poll_s=60.0)
    server.start()
    server.registration_socket.unlink()
    listener(server.registration_socket)
    theirs = sockets.socket_identity(server.registration_socket)
    server.stop()
    assert sockets.socket_identity(server.registration_socket) == theirs


def test_foreign_socket_at_the_path_is_not_taken_over_by_the_watcher(
    plugin: DraPluginServer, listener: Callable[[Path], socket.socket]
) -> None:
    listener(plugin.registration_socket)
    theirs = sockets.socket_identity(plugin.registration_socket)
    time.sleep(0.3)  # several polls
    assert sockets.socket_identity(plugin.registration_socket) == theirs
    assert plugin.restarts == 0
