"""L2: the kubelet's plugin watcher registers the driver over the real registration
socket: GetInfo, then NotifyRegistrationStatus (success and failure)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gpu_share.dra.guard import MAX_STATUS_MESSAGE
from gpu_share.dra.server import DraPluginServer
from tests.dra.conftest import DRIVER, FAST, FakePreparer, Kubelet


def test_get_info_names_the_driver_the_endpoint_and_both_versions(
    plugin: DraPluginServer, kubelet: Kubelet
) -> None:
    assert plugin.registration_socket.name == f"{DRIVER}-reg.sock"
    info = kubelet.get_info()
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(plugin.dra_socket.absolute())
    assert info.endpoint.endswith(f"/{DRIVER}/dra.sock")
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert plugin.registration.info_calls == 1
    assert plugin.registration.outcome is None


def test_registered_then_the_endpoint_answers(
    plugin: DraPluginServer, kubelet: Kubelet, failures: list[str]
) -> None:
    info = kubelet.get_info()
    kubelet.notify(True)
    outcome = plugin.registration.outcome
    assert outcome is not None and outcome.registered and outcome.error == ""
    assert plugin.registration.registered
    assert failures == []
    # The kubelet dials what GetInfo named.
    response = kubelet.prepare("v1", info.endpoint, [("ns", "c", "u-1")])
    assert list(response.claims) == ["u-1"]


def test_refused_registration_is_recorded_and_reported_bounded(
    plugin: DraPluginServer, kubelet: Kubelet, failures: list[str]
) -> None:
    kubelet.get_info()
    kubelet.notify(False, "version mismatch " + "x" * 50_000)
    outcome = plugin.registration.outcome
    assert outcome is not None and not outcome.registered
    assert outcome.error.startswith("version mismatch")
    assert len(outcome.error) <= MAX_STATUS_MESSAGE
    assert failures == [outcome.error]
    assert not plugin.registration.registered
    # A later success replaces it.
    kubelet.notify(True)
    assert plugin.registration.registered and len(failures) == 1


def test_refusal_without_reason_still_says_something(
    plugin: DraPluginServer, kubelet: Kubelet, failures: list[str]
) -> None:
    kubelet.notify(False)
    assert failures == ["the kubelet gave no reason"]


def test_a_failing_hook_does_not_fail_the_call(sock_dir: Path) -> None:
    def boom(error: str) -> None:
        raise RuntimeError("hook broke")

    server = DraPluginServer(
        DRIVER,
        FakePreparer(),
        plugin_dir=sock_dir / "p",
        registration_dir=sock_dir / "r",
        options=FAST,
        on_registration_failure=boom,
    )
    server.start()
    kubelet = Kubelet(server.registration_socket)
    try:
        kubelet.notify(False, "nope")  # answers OK although the hook raised
        outcome = server.registration.outcome
        assert outcome is not None and outcome.error == "nope"
    finally:
        kubelet.close()
        server.stop()


def test_undecodable_registration_status_is_invalid_argument(
    plugin: DraPluginServer, kubelet: Kubelet
) -> None:
    call = kubelet.channel(plugin.registration_socket).unary_unary(
        "/pluginregistration.Registration/NotifyRegistrationStatus"
    )
    with pytest.raises(grpc.RpcError) as err:
        call(b"\x12\x02\xff\xfe", timeout=5)  # error = invalid UTF-8
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert plugin.registration.outcome is None


def test_each_successful_registration_calls_on_registered_and_a_raising_hook_is_contained(
    sock_dir: Path,
) -> None:
    """The agent rechecks its ResourceSlice on every registration (a starting kubelet
    wipes the node's slices); the hook must not turn into an error for the kubelet."""
    calls: list[int] = []

    def hook() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("hook broke")

    server = DraPluginServer(
        DRIVER, FakePreparer(), plugin_dir=sock_dir / "p", registration_dir=sock_dir / "r",
        options=FAST, on_registered=hook,
    )
    server.start()
    kubelet = Kubelet(server.registration_socket)
    try:
        kubelet.notify(True)
        kubelet.notify(False, "refused")  # not a registration
        kubelet.notify(True)  # the hook raises: the call still answers OK
        kubelet.notify(True)
        assert len(calls) == 3 and server.registration.registered
    finally:
        kubelet.close()
        server.stop()
