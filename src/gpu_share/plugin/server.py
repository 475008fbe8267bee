"""One gRPC ``DevicePlugin`` server per extended resource, on a unix socket.

The servicer only maps protobuf to ``ResourceHandler`` calls and errors to status
codes; every decision is the handler's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import grpc

from gpu_share.errors import AllocationError, GpuShareError, IdentityError, KubeAccessError
from gpu_share.plugin import wire
from gpu_share.plugin.handler import ResourceHandler
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from gpu_share.plugin.watcher import SocketId, socket_identity

log = logging.getLogger(__name__)

# Trailing-metadata key carrying the error's ``reason`` next to the status message.
REASON_METADATA_KEY = "gpu-share-reason"


@dataclass(frozen=True)
class ServeOptions:
    # How often an open ListAndWatch stream notices a stopping server or a gone client.
    watch_poll_s: float = 0.5
    # Threads per server; each ListAndWatch stream holds one while open.
    max_workers: int = 16
    # Grace for in-flight unary calls when stopping.
    stop_grace_s: float = 0.5


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status code the kubelet sees for an error raised by a handler."""
    if isinstance(exc, AllocationError):
        if exc.reason == "NoFit":
            return grpc.StatusCode.RESOURCE_EXHAUSTED
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, IdentityError | KubeAccessError):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, GpuShareError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL


def _abort(context: grpc.ServicerContext, exc: Exception, call: str) -> NoReturn:
    code = status_for(exc)
    if isinstance(exc, GpuShareError):
        reason, message = exc.reason, exc.message
        log.warning("%s failed: %s (%s)", call, message, reason)
    else:
        reason, message = "Internal", f"{type(exc).__name__}: {exc}"
        log.exception("%s failed unexpectedly", call)
    context.set_trailing_metadata(((REASON_METADATA_KEY, reason),))
    context.abort(code, message)
    raise AssertionError("context.abort returned")  # it always raises


class DevicePluginServicer(dp_grpc.DevicePluginServicer):
    def __init__(
        self, handler: ResourceHandler, stopping: threading.Event, watch_poll_s: float
    ) -> None:
        self._handler = handler
        self._stopping = stopping
        self._watch_poll_s = watch_poll_s
        self._streams = 0
        self._streams_cv = threading.Condition()

    @property
    def open_streams(self) -> int:
        with self._streams_cv:
            return self._streams

    def wait_streams_closed(self, timeout_s: float) -> bool:
        with self._streams_cv:
            return self._streams_cv.wait_for(lambda: self._streams == 0, timeout=timeout_s)

    @contextlib.contextmanager
    def _stream(self) -> Iterator[None]:
        with self._streams_cv:
            self._streams += 1
        try:
            yield
        finally:
            with self._streams_cv:
                self._streams -= 1
                self._streams_cv.notify_all()

    def GetDevicePluginOptions(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions(
            pre_start_required=self._handler.pre_start_required,
            get_preferred_allocation_available=self._handler.preferred_allocation_available,
        )

    def ListAndWatch(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> Iterator[dp.ListAndWatchResponse]:
        gone = threading.Event()
        context.add_callback(gone.set)  # client went away or the server cancelled us
        with self._stream():
            try:
                # Read the version before the list so a change in between is resent.
                version = self._handler.wait_for_change(0, 0.0)
                yield wire.list_and_watch_response(self._handler.list_devices())
                while not (self._stopping.is_set() or gone.is_set()):
                    current = self._handler.wait_for_change(version, self._watch_poll_s)
                    if current != version and not self._stopping.is_set():
                        version = current
                        yield wire.list_and_watch_response(self._handler.list_devices())
            except Exception as exc:
                _abort(context, exc, "ListAndWatch")

    def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> dp.PreferredAllocationResponse:
        try:
            return dp.PreferredAllocationResponse(
                container_responses=[
                    dp.ContainerPreferredAllocationResponse(
                        deviceIDs=self._handler.preferred_allocation(
                            list(req.available_deviceIDs),
                            list(req.must_include_deviceIDs),
                            req.allocation_size,
                        )
                    )
                    for req in request.container_requests
                ]
            )
        except Exception as exc:
            _abort(context, exc, "GetPreferredAllocation")

    def Allocate(
        self, request: dp.AllocateRequest, context: grpc.ServicerContext
    ) -> dp.AllocateResponse:
        try:
            return dp.AllocateResponse(
                container_responses=[
                    wire.allocate_response(self._handler.allocate(list(req.devices_ids)))
                    for req in request.container_requests
                ]
            )
        except Exception as exc:
            _abort(context, exc, "Allocate")

    def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> dp.PreStartContainerResponse:
        try:
            self._handler.pre_start(list(request.devices_ids))
        except Exception as exc:
            _abort(context, exc, "PreStartContainer")
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
        with self._lock:
            if self._server is not None or self._stopping.is_set():
                raise RuntimeError(f"server for {self.socket_path} was already started")
            self.socket_path.parent.mkdir(parents=True, exist_ok=True)
            # A stale file (crash, kubelet leftovers) makes bind fail.
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            server = grpc.server(
                futures.ThreadPoolExecutor(
                    max_workers=self.options.max_workers,
                    thread_name_prefix=f"dp-{self.socket_path.name}",
                )
            )
            dp_grpc.add_DevicePluginServicer_to_server(self._servicer, server)  # type: ignore[no-untyped-call]
            server.add_insecure_port(f"unix://{self.socket_path.resolve()}")
            server.start()
            self._server = server
            self._identity = socket_identity(self.socket_path)
            log.info(
                "serving %s on %s",
                self.handler.resource_name,
                self.socket_path,
            )

    def stop(self) -> None:
        """Stop serving, end open ListAndWatch streams, remove our socket file."""
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopping.set()
            server, self._server = self._server, None
            if server is not None:
                grace = self.options.stop_grace_s
                server.stop(grace).wait(grace + 5.0)
                # Streams poll ``_stopping``; wait so the caller knows they are over.
                self._servicer.wait_streams_closed(self.options.watch_poll_s + 5.0)
            # Remove the file only if it is still the one we created.
            if self._identity is not None and socket_identity(self.socket_path) == self._identity:
                with contextlib.suppress(FileNotFoundError):
                    self.socket_path.unlink()
            self._stopped.set()
            log.info("stopped serving %s on %s", self.handler.resource_name, self.socket_path)
