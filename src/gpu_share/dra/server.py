"""The DRA kubelet plugin: the DRAPlugin service on ``<pluginDir>/dra.sock`` and the
registration service on ``<registrationDir>/<driver>-reg.sock``.

Each socket is bound under a hidden temporary name in its dir, made owner-only, then
renamed into place. That way the kubelet's plugin watcher (which skips dot files) only
ever sees a finished socket, and gRPC, which unlinks the path it bound when it stops,
never removes a file at the public path that is not ours (a restarted socket, another
agent's). A watcher thread polls both paths; a socket deleted or replaced under us is
served again on a new file, which makes the kubelet register the driver again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpu_share.agent.dra.ports import ClaimPreparer
from gpu_share.dra import sockets
from gpu_share.dra.guard import MAX_MESSAGE_BYTES
from gpu_share.dra.registration import RegistrationService, registration_socket_name
from gpu_share.dra.service import DraService
from gpu_share.dra.sockets import DraServeError, SocketId

log = logging.getLogger(__name__)

DRA_SOCKET_NAME = "dra.sock"


@dataclass(frozen=True)
class DraServeOptions:
    # Threads per socket: concurrent calls the preparer sees at most.
    max_workers: int = 8
    # Calls accepted at once per socket (running + queued); more get RESOURCE_EXHAUSTED.
    max_concurrent_rpcs: int = 32
    # Largest message either way (the kubelet's client reads up to 4 MiB too).
    max_message_bytes: int = MAX_MESSAGE_BYTES
    # How often the socket files are checked for deletion or replacement.
    watch_poll_s: float = 0.5
    # Grace for in-flight calls when stopping; they are cancelled after it.
    stop_grace_s: float = 0.5
    # The longest stop() takes.
    stop_timeout_s: float = 5.0


class _SocketServer:
    """One gRPC server on one unix socket path; can be served again after the file goes."""

    def __init__(
        self,
        label: str,
        path: Path,
        handlers: Callable[[], Sequence[grpc.GenericRpcHandler]],
        options: DraServeOptions,
    ) -> None:
        self.label = label
        self.path = path
        self._handlers = handlers
        self._options = options
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self.identity: SocketId | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    def still_ours(self) -> bool:
        """Our socket file is still at the path (not deleted, not replaced)."""
        return self.identity is not None and sockets.socket_identity(self.path) == self.identity

    def start(self) -> None:
        sockets.dra_target(self.path)  # the public path must fit, not only the temporary
        sockets.claim_socket_path(self.path)
        temp = self.path.with_name(f".gs-{secrets.token_hex(4)}.sock")
        target = sockets.dra_target(temp)
        executor = futures.ThreadPoolExecutor(
            max_workers=self._options.max_workers, thread_name_prefix=f"dra-{self.label}"
        )
        size = self._options.max_message_bytes
        server = grpc.server(
            executor,
            handlers=list(self._handlers()),
            options=[
                ("grpc.max_receive_message_length", size),
                ("grpc.max_send_message_length", size),
            ],
            maximum_concurrent_rpcs=self._options.max_concurrent_rpcs,
        )
        try:
            try:
                server.add_insecure_port(target)
            except RuntimeError as exc:  # gRPC's only signal; its log line has the cause
                raise DraServeError(f"cannot bind {self.path}: {exc}") from None
            server.start()
            sockets.restrict_socket(temp)
            sockets.claim_socket_path(self.path)  # a file may have appeared meanwhile
            try:
                os.rename(temp, self.path)
            except OSError as exc:
                raise DraServeError(f"cannot move socket into {self.path}: {exc}") from exc
        except BaseException:
            server.stop(None)
            executor.shutdown(wait=False, cancel_futures=True)
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
            raise
        self._server, self._executor = server, executor
        self.identity = sockets.socket_identity(self.path)
        log.info("DRA %s socket serving on %s", self.label, self.path)

    def stop(self, deadline: float, grace_s: float) -> None:
        """Stop serving by ``deadline`` (monotonic); in-flight calls get ``grace_s``
        then are cancelled. Removes the socket file if it is still ours."""
        server, self._server = self._server, None
        executor, self._executor = self._executor, None
        self._stop_server(server, executor, deadline, grace_s)
        if self.still_ours():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self.identity = None

    def restart(self, deadline: float, grace_s: float) -> None:
        """Serve on a new file at the path, then let the old server finish its calls
        (it was bound under another name: stopping it removes nothing at the path)."""
        server, self._server = self._server, None
        executor, self._executor = self._executor, None
        self.identity = None
        try:
            self.start()
        finally:
            self._stop_server(server, executor, deadline, grace_s)

    def _stop_server(
        self,
        server: grpc.Server | None,
        executor: futures.ThreadPoolExecutor | None,
        deadline: float,
        grace_s: float,
    ) -> None:
        if server is not None:
            grace = min(grace_s, max(0.0, deadline - time.monotonic()))
            if not server.stop(grace).wait(max(0.0, deadline - time.monotonic())):
                log.warning("DRA %s socket %s did not stop in time", self.label, self.path)
        if executor is not None:
            # A preparer call still running keeps its thread; nothing waits for it here.
            executor.shutdown(wait=False, cancel_futures=True)


class DraPluginServer:
    """The DRA kubelet plugin of one driver. Start once; ``stop()`` is idempotent.

    ``preparer`` does the work of NodePrepareResources / NodeUnprepareResources;
    ``on_registration_failure(error)`` hears each registration the kubelet refused,
    ``on_registered()`` each one it accepted.
    """

    def __init__(
        self,
        driver_name: str,
        preparer: ClaimPreparer,
        *,
        plugin_dir: str | os.PathLike[str],
        registration_dir: str | os.PathLike[str],
        options: DraServeOptions | None = None,
        on_registration_failure: Callable[[str], None] | None = None,
        on_registered: Callable[[], None] | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.options = options or DraServeOptions()
        self.plugin_dir = Path(plugin_dir)
        self.registration_dir = Path(registration_dir)
        self.dra_socket = self.plugin_dir / DRA_SOCKET_NAME
        self.registration_socket = self.registration_dir / registration_socket_name(driver_name)
        self.service = DraService(preparer)
        self.registration = RegistrationService(
            driver_name,
            os.fspath(self.dra_socket.absolute()),
            on_failure=on_registration_failure,
            on_registered=on_registered,
        )
        self._dra = _SocketServer("plugin", self.dra_socket, self.service.handlers, self.options)
        self._reg = _SocketServer(
            "registration", self.registration_socket, self.registration.handlers, self.options
        )
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._started = False
        self._stopped = False
        self._watcher: threading.Thread | None = None
        self._restarts = 0
        self._last_restart_error = ""

    @property
    def running(self) -> bool:
        return self._started and not self._stopping.is_set()

    @property
    def restarts(self) -> int:
        """How often a socket was served again after it was deleted or replaced."""
        with self._lock:
            return self._restarts

    def start(self) -> None:
        """Serve the DRA socket, then the registration socket (the kubelet dials the DRA
        endpoint as soon as it sees the registration one). Raises ``DraServeError``
        naming the cause when a socket cannot be served."""
        with self._lock:
            if self._started:
                raise RuntimeError(f"DRA plugin {self.driver_name} was already started")
            self._started = True
            sockets.ensure_dir(self.plugin_dir, own=True)
            sockets.ensure_dir(self.registration_dir, own=False)
            self._dra.start()
            try:
                self._reg.start()
            except BaseException:
                self._dra.stop(time.monotonic() + self.options.stop_timeout_s, 0.0)
                self._stopping.set()
                raise
            self._watcher = threading.Thread(
                target=self._watch, name=f"dra-watch-{self.driver_name}", daemon=True
            )
            self._watcher.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop both sockets within ``timeout_s`` (default ``options.stop_timeout_s``):
        the registration one first, so the kubelet stops routing to us."""
        budget = self.options.stop_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        self._stopping.set()
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            grace = self.options.stop_grace_s
            # Both share the deadline; the registration socket takes no time to stop.
            self._reg.stop(deadline, grace)
            self._dra.stop(deadline, grace)
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(max(0.0, deadline - time.monotonic()))
        log.info("DRA plugin %s stopped", self.driver_name)

    def _watch(self) -> None:
        while not self._stopping.wait(self.options.watch_poll_s):
            for server in (self._dra, self._reg):
                self._keep(server)

    def _keep(self, server: _SocketServer) -> None:
        with self._lock:
            if self._stopping.is_set() or server.still_ours():
                return
            log.warning(
                "DRA %s socket %s was deleted or replaced; serving it again",
                server.label,
                server.path,
            )
            try:
                server.restart(
                    time.monotonic() + self.options.stop_timeout_s, self.options.stop_grace_s
                )
            except DraServeError as exc:
                # Retried at the next poll; said once per distinct cause.
                if str(exc) != self._last_restart_error:
                    log.error("cannot serve DRA %s socket again: %s", server.label, exc)
                self._last_restart_error = str(exc)
                return
            self._last_restart_error = ""
            self._restarts += 1
