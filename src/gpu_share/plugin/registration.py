"""Register a device plugin with the kubelet (``Registration.Register`` on kubelet.sock).

The kubelet dials our socket as soon as it accepts the registration, so we register
only once our own server answers, probed with GetDevicePluginOptions over the socket.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    stop_when_event_set,
    wait_exponential,
    wait_random,
)

from gpu_share.errors import KubeAccessError
from gpu_share.plugin import wire
from gpu_share.plugin.handler import ResourceHandler
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET_NAME = "kubelet.sock"
REGISTRATION_FAILED = "KubeletRegistrationFailed"


@dataclass(frozen=True)
class RegistrationPolicy:
    """Retry bounds for one registration (probe + Register)."""

    max_attempts: int = 12
    max_total_s: float = 30.0
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    jitter_s: float = 0.2
    call_timeout_s: float = 2.0


def unix_target(path: str | os.PathLike[str]) -> str:
    return f"unix://{os.path.abspath(path)}"


def register_request(handler: ResourceHandler, endpoint: str | None = None) -> dp.RegisterRequest:
    return dp.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint if endpoint is not None else handler.endpoint,
        resource_name=handler.resource_name,
        options=wire.plugin_options(handler),
    )


def probe_plugin(socket_path: str | os.PathLike[str], timeout_s: float) -> dp.DevicePluginOptions:
    """Ask our own server for its options over its socket; raises ``grpc.RpcError``."""
    with grpc.insecure_channel(unix_target(socket_path)) as channel:
        stub = dp_grpc.DevicePluginStub(channel)
        options: dp.DevicePluginOptions = stub.GetDevicePluginOptions(
            dp.Empty(), timeout=timeout_s, wait_for_ready=True
        )
        return options


def register_once(
    kubelet_socket: str | os.PathLike[str], request: dp.RegisterRequest, timeout_s: float
) -> None:
    """One Register call; raises ``grpc.RpcError``."""
    with grpc.insecure_channel(unix_target(kubelet_socket)) as channel:
        stub = dp_grpc.RegistrationStub(channel)
        stub.Register(request, timeout=timeout_s)


class _PluginGone(Exception):
    """Our socket vanished mid-registration: serve again before registering."""


def register_with_retry(
    kubelet_socket: str | os.PathLike[str],
    plugin_socket: str | os.PathLike[str],
    request: dp.RegisterRequest,
    policy: RegistrationPolicy | None = None,
    *,
    abort: threading.Event | None = None,
    still_serving: Callable[[], bool] | None = None,
) -> None:
    """Probe ``plugin_socket`` then register, retrying with exponential backoff and
    jitter within ``policy``'s bounds.

    Raises ``KubeAccessError`` (reason ``KubeletRegistrationFailed``) naming the last
    failure once the bounds are spent, ``abort`` is set, or ``still_serving()`` says
    our server is gone.
    """
    policy = policy or RegistrationPolicy()
    stop = stop_after_attempt(policy.max_attempts) | stop_after_delay(policy.max_total_s)
    if abort is not None:
        stop = stop | stop_when_event_set(abort)

    def sleep(seconds: float) -> None:
        if abort is not None:
            abort.wait(seconds)
        else:
            time.sleep(seconds)

    def before_sleep(state: object) -> None:
        outcome = getattr(state, "outcome", None)
        exc = outcome.exception() if outcome is not None else None
        log.info("registering %s: %s; retrying", request.resource_name, _describe(exc))

    attempts = 0
    started = time.monotonic()
    try:
        for attempt in Retrying(
            stop=stop,
            wait=wait_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s)
            + wait_random(0, policy.jitter_s),
            retry=retry_if_exception_type((grpc.RpcError, OSError)),
            sleep=sleep,
            before_sleep=before_sleep,
            reraise=True,
        ):
            with attempt:
                attempts += 1
                if still_serving is not None and not still_serving():
                    raise _PluginGone(f"our socket {plugin_socket} is gone")
                probe_plugin(plugin_socket, policy.call_timeout_s)
                register_once(kubelet_socket, request, policy.call_timeout_s)
    except Exception as exc:
        why = "stopped" if abort is not None and abort.is_set() else _describe(exc)
        raise KubeAccessError(
            f"could not register {request.resource_name} (endpoint {request.endpoint}) with "
            f"the kubelet at {kubelet_socket} after {attempts} attempt(s) in "
            f"{time.monotonic() - started:.1f}s: {why}",
            reason=REGISTRATION_FAILED,
        ) from exc
    log.info(
        "registered %s with the kubelet (endpoint %s)", request.resource_name, request.endpoint
    )


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        name = code.name if code is not None else "UNKNOWN"
        return f"{name}: {details}"
    return f"{type(exc).__name__}: {exc}" if exc is not None else "unknown error"
