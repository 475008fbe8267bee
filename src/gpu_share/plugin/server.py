"""One gRPC ``DevicePlugin`` server per extended resource, on a unix socket.

The servicer only maps protobuf to ``ResourceHandler`` calls and errors to status
codes; every decision is the handler's.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn, TypeVar

import grpc

from gpu_share.agent.unixsock import (
    SocketId,
    SocketServeError,
    claim_socket_path,
    socket_identity,
    unix_target,
)
from gpu_share.errors import GpuShareError, grpc_code_of
from gpu_share.plugin import wire
from gpu_share.plugin.handler import ResourceHandler
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from gpu_share.sharing.model import AdvertisedDevice

log = logging.getLogger(__name__)

T = TypeVar("T")
Q = TypeVar("Q")
R = TypeVar("R")

# Trailing-metadata key carrying the error's ``reason`` next to the status message.
REASON_METADATA_KEY = "gpu-share-reason"
# Status messages may quote what the caller sent: never more than this many characters.
MAX_STATUS_MESSAGE = 1024

# What the device-plugin servers raise when a socket cannot be served (reasons
# SocketPathTooLong, SocketInUse, SocketBindFailed).
ServeError = SocketServeError


def check_socket_path(path: Path) -> str:
    """The ``unix://`` target for ``path`` (``ServeError`` when too long to bind)."""
    return unix_target(path, "kubelet.devicePluginDir")


def _unhealthy(devices: Sequence[AdvertisedDevice]) -> list[AdvertisedDevice]:
    return [replace(d, healthy=False) for d in devices]


@dataclass(frozen=True)
class ServeOptions:
    # How often an open ListAndWatch stream notices a stopping server or a gone client.
    watch_poll_s: float = 0.5
    # Threads per server; each ListAndWatch stream holds one while open.
    max_workers: int = 16
    # Grace for in-flight unary calls when stopping.
    stop_grace_s: float = 0.5
    # The longest stop() waits for the server and its streams to end.
    stop_timeout_s: float = 5.0


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status code the kubelet sees for an error raised by a handler
    (``errors.REASONS`` and the error classes say which)."""
    if isinstance(exc, GpuShareError):
        return grpc.StatusCode[grpc_code_of(exc)]
    return grpc.StatusCode.INTERNAL


def _abort(context: grpc.ServicerContext, exc: Exception, call: str) -> NoReturn:
    code = status_for(exc)
    if isinstance(exc, GpuShareError):
        reason, message = exc.reason, exc.message
        log.warning("%s failed: %s (%s)", call, message, reason)
    else:
        reason, message = "Internal", f"{type(exc).__name__}: {exc}"
        log.exception("%s failed unexpectedly", call)
    if len(message) > MAX_STATUS_MESSAGE:
        message = message[: MAX_STATUS_MESSAGE - 3] + "..."
    context.set_trailing_metadata(((REASON_METADATA_KEY, reason),))
    context.abort(code, message)
    raise AssertionError("context.abort returned")  # it always raises


def _aborting(rpc: Callable[[T, Q, grpc.ServicerContext], R]
              ) -> Callable[[T, Q, grpc.ServicerContext], R]:
    """A unary call whose error aborts it with its status code and reason (``_abort``)."""

    @functools.wraps(rpc)
    def call(self: T, request: Q, context: grpc.ServicerContext) -> R:
        try:
            return rpc(self, request, context)
        except Exception as exc:
            _abort(context, exc, rpc.__name__)

    return call


class DevicePluginServicer(dp_grpc.DevicePluginServicer):
    def __init__(
        self, handler: ResourceHandler, stopping: threading.Event, watch_poll_s: float
    ) -> None:
        self._handler = handler
        self._stopping = stopping
        self._watch_poll_s = watch_poll_s
        self._streams = 0
        self._streams_cv = threading.Condition()
        # Going away: every stream sends its last list with all devices unhealthy.
        self._draining = threading.Event()
        self._undrained: set[int] = set()  # open streams that have not sent that list
        self._ids = itertools.count()

    @property
    def open_streams(self) -> int:
        with self._streams_cv:
            return self._streams

    def wait_streams_closed(self, timeout_s: float) -> bool:
        with self._streams_cv:
            return self._streams_cv.wait_for(lambda: self._streams == 0, timeout=timeout_s)

    def drain(self, timeout_s: float) -> bool:
        """Have every open stream send its devices as unhealthy (and only that from
        now on); True once each has handed it to the transport within ``timeout_s``."""
        self._draining.set()
        with self._streams_cv:
            return self._streams_cv.wait_for(lambda: not self._undrained, timeout=timeout_s)

    @contextlib.contextmanager
    def _stream(self) -> Iterator[int]:
        with self._streams_cv:
            self._streams += 1
            token = next(self._ids)
            self._undrained.add(token)
        try:
            yield token
        finally:
            with self._streams_cv:
                self._streams -= 1
                self._undrained.discard(token)
                self._streams_cv.notify_all()

    def _drained(self, token: int) -> None:
        with self._streams_cv:
            self._undrained.discard(token)
            self._streams_cv.notify_all()

    def GetDevicePluginOptions(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> dp.DevicePluginOptions:
        return wire.plugin_options(self._handler)

    def ListAndWatch(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> Iterator[dp.ListAndWatchResponse]:
        gone = threading.Event()
        context.add_callback(gone.set)  # client went away or the server cancelled us
        with self._stream() as token:
            try:
                # Read the version before the list so a change in between is resent.
                version = self._handler.wait_for_change(0, 0.0)
                last = self._handler.list_devices()
                yield wire.list_and_watch_response(last)
                while not (self._stopping.is_set() or gone.is_set()):
                    if self._draining.is_set():
                        # The last list the kubelet got, all unhealthy (no handler call:
                        # the agent may be busy); the generator resumes once gRPC has
                        # sent it.
                        yield wire.list_and_watch_response(_unhealthy(last))
                        self._drained(token)
                        while not (self._stopping.is_set() or gone.is_set()):
                            self._stopping.wait(self._watch_poll_s)
                        break
                    current = self._handler.wait_for_change(version, self._watch_poll_s)
                    if current != version and not (
                        self._stopping.is_set() or self._draining.is_set()
                    ):
                        version = current
                        last = self._handler.list_devices()
                        yield wire.list_and_watch_response(last)
            except Exception as exc:
                _abort(context, exc, "ListAndWatch")

    @_aborting
    def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> dp.PreferredAllocationResponse:
        return dp.PreferredAllocationResponse(
            container_responses=[wire.preferred_response(self._handler, req)
                                 for req in request.container_requests]
        )

    @_aborting
    def Allocate(
        self, request: dp.AllocateRequest, context: grpc.ServicerContext
    ) -> dp.AllocateResponse:
        return dp.AllocateResponse(
            container_responses=[
                wire.allocate_response(self._handler.allocate(list(req.devices_ids)))
                for req in request.container_requests
            ]
        )

    @_aborting
    def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> dp.PreStartContainerResponse:
        self._handler.pre_start(list(request.devices_ids))
        return dp.PreStartContainerResponse()


class PluginServer:
    """Serves one handler on ``socket_path``. Start once; ``stop()`` is idempotent."""

    def __init__(
        self,
        handler: ResourceHandler,
        socket_path: str | os.PathLike[str],
        options: ServeOptions | None = None,
    ) -> None:
        self.handler = handler
        self.socket_path = Path(socket_path)
        self.options = options or ServeOptions()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self._servicer = DevicePluginServicer(handler, self._stopping, self.options.watch_poll_s)
        self._identity: SocketId | None = None

    @property
    def identity(self) -> SocketId | None:
        """(device, inode, ctime) of the socket file this server created."""
        return self._identity

    @property
    def running(self) -> bool:
        return self._server is not None and not self._stopping.is_set()

    @property
    def stopped(self) -> bool:
        """True once ``stop()`` has finished (streams ended, socket removed)."""
        return self._stopped.is_set()

    @property
    def open_streams(self) -> int:
        return self._servicer.open_streams

    def start(self) -> None:
        """Serve; raises ``ServeError`` naming the cause when the socket cannot be
        bound (path too long, another live server on it, refused by the OS)."""
        with self._lock:
            if self._server is not None or self._stopping.is_set():
                raise RuntimeError(f"server for {self.socket_path} was already started")
            try:
                self.socket_path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ServeError(f"cannot create {self.socket_path.parent}: {exc}") from exc
            target = check_socket_path(self.socket_path)
            # A stale file (crash, kubelet leftovers) makes bind fail; a live one is not ours.
            claim_socket_path(self.socket_path)
            server = grpc.server(
                futures.ThreadPoolExecutor(
                    max_workers=self.options.max_workers,
                    thread_name_prefix=f"dp-{self.socket_path.name}",
                )
            )
            dp_grpc.add_DevicePluginServicer_to_server(self._servicer, server)
            try:
                server.add_insecure_port(target)
            except RuntimeError as exc:  # gRPC's only signal; the log line has the cause
                server.stop(None)
                raise ServeError(f"cannot bind {self.socket_path}: {exc}") from None
            server.start()
            self._server = server
            self._identity = socket_identity(self.socket_path)
            log.info(
                "serving %s on %s",
                self.handler.resource_name,
                self.socket_path,
            )

    def drain(self, timeout_s: float) -> bool:
        """Tell the kubelet the devices are going: every open ListAndWatch stream sends
        its devices as unhealthy. True when all did within ``timeout_s``."""
        return self._servicer.drain(timeout_s) if self.running else True

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop serving, end open ListAndWatch streams, remove our socket file; waits at
        most ``timeout_s`` (default ``options.stop_timeout_s``) for them to end."""
        deadline = time.monotonic() + (
            self.options.stop_timeout_s if timeout_s is None else timeout_s
        )
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopping.set()
            server, self._server = self._server, None
            if server is not None:
                grace = min(self.options.stop_grace_s, max(0.0, deadline - time.monotonic()))
                server.stop(grace).wait(max(0.0, deadline - time.monotonic()))
                # Streams poll ``_stopping``; wait so the caller knows they are over.
                self._servicer.wait_streams_closed(max(0.0, deadline - time.monotonic()))
            # Remove the file only if it is still the one we created.
            if self._identity is not None and socket_identity(self.socket_path) == self._identity:
                with contextlib.suppress(FileNotFoundError):
                    self.socket_path.unlink()
            self._stopped.set()
            log.info("stopped serving %s on %s", self.handler.resource_name, self.socket_path)
