"""Serving a device-plugin socket, over real unix sockets:
a path the OS cannot bind names its cause; a live server's socket is never taken over;
a stale one is replaced; a stopping server first sends every device unhealthy."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from gpu_share.agent.unixsock import SOCKET_IN_USE, SOCKET_PATH_TOO_LONG, socket_identity
from gpu_share.plugin.manager import PluginManager
from gpu_share.plugin.server import PluginServer, ServeError
from gpu_share.sharing.model import AdvertisedDevice
from testkit.fake_handler import FakeHandler
from testkit.harness.wait import poll
from testkit.kubelet_stub import PluginClient, fast_plugin_settings

FAST = fast_plugin_settings()


def _long_dir(base: Path) -> Path:
    d = base / ("d" * 50) / ("e" * 50)
    d.mkdir(parents=True)
    return d


def test_socket_path_over_the_limit_is_a_typed_error_naming_the_length(
    sock_dir: Path, handler: FakeHandler
) -> None:
    path = _long_dir(sock_dir) / handler.endpoint
    n = len(os.fsencode(path))
    srv = PluginServer(handler, path, FAST.serve)
    with pytest.raises(ServeError) as err:
        srv.start()
    assert err.value.reason == SOCKET_PATH_TOO_LONG
    assert f"socket path {path} is {n} bytes, the limit is 107" in str(err.value)
    assert not path.exists()
    srv.stop()  # nothing started: still clean


def test_manager_serve_raises_the_cause_for_a_long_dir(
    sock_dir: Path, handler: FakeHandler
) -> None:
    manager = PluginManager([handler], _long_dir(sock_dir), FAST)
    try:
        with pytest.raises(ServeError, match="the limit is 107"):
            manager.serve()
    finally:
        manager.stop()


def test_a_live_server_socket_is_never_taken_over(sock_dir: Path, handler: FakeHandler) -> None:
    path = sock_dir / handler.endpoint
    first = PluginServer(handler, path, FAST.serve)
    first.start()
    try:
        ident = socket_identity(path)
        second = PluginServer(FakeHandler(), path, FAST.serve)
        with pytest.raises(ServeError) as err:
            second.start()
        assert err.value.reason == SOCKET_IN_USE
        assert "another live process" in str(err.value)
        second.stop()
        assert socket_identity(path) == ident  # same file, still the first's
        client = PluginClient(path)
        try:
            assert client.options().get_preferred_allocation_available
        finally:
            client.close()
    finally:
        first.stop()


def test_a_stale_socket_is_replaced(sock_dir: Path, handler: FakeHandler) -> None:
    path = sock_dir / handler.endpoint
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))  # a socket file nobody listens on (a killed agent's)
    dead.close()
    assert path.is_socket()
    srv = PluginServer(handler, path, FAST.serve)
    srv.start()
    client = PluginClient(path)
    try:
        assert client.options().get_preferred_allocation_available
    finally:
        client.close()
        srv.stop()
    assert not path.exists()


def test_drain_sends_every_device_unhealthy_before_the_stream_ends(
    sock_dir: Path, handler: FakeHandler
) -> None:
    handler.devices = [AdvertisedDevice("a", True, 0), AdvertisedDevice("b", True, 1)]
    srv = PluginServer(handler, sock_dir / handler.endpoint, FAST.serve)
    srv.start()
    client = PluginClient(srv.socket_path).watch()
    try:
        client.wait_for_list(lambda ds: len(ds) == 2)
        assert srv.drain(2.0)
        # Handed to the transport when drain() returned; the client has it promptly.
        unhealthy = [AdvertisedDevice("a", False, 0), AdvertisedDevice("b", False, 1)]
        client.wait_for_list(lambda ds: ds == unhealthy)
        # A change now is not sent as healthy again.
        handler.set_devices([AdvertisedDevice("a", True, 0)])
        srv.stop()
        assert client.watch_ended.wait(5)
        assert client.lists[-1] == unhealthy
    finally:
        client.close()
        srv.stop()


def test_drain_with_no_stream_returns_at_once(sock_dir: Path, handler: FakeHandler) -> None:
    manager = PluginManager([handler], sock_dir, FAST)
    manager.serve()
    try:
        assert manager.drain(1.0)
    finally:
        manager.stop()
    assert poll(lambda: not (sock_dir / handler.endpoint).exists(), 2)
