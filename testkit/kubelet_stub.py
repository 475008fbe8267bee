"""A kubelet stand-in over real unix sockets, built from the generated stubs.

- ``KubeletStub``: serves ``Registration`` on ``<dir>/kubelet.sock`` (records Register
  requests), dials plugins as the kubelet does (``plugin(endpoint)``) and simulates a
  kubelet restart (stop, delete every socket in the dir, serve again).
- ``PluginClient``: the kubelet's side of one plugin: options, ListAndWatch in a
  thread keeping the latest list, GPA, Allocate, PreStartContainer.
- ``FakePodResources``: a ``PodResourcesLister`` whose answers the test sets.

Every wait is bounded; every server stops in ``close()``/``stop()``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path

import grpc

from gpu_share.plugin import wire
from gpu_share.plugin.manager import PluginSettings
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp
from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from gpu_share.plugin.proto import podresources_v1_pb2 as pr
from gpu_share.plugin.proto import podresources_v1_pb2_grpc as pr_grpc
from gpu_share.plugin.registration import RegistrationPolicy
from gpu_share.plugin.server import ServeOptions
from gpu_share.sharing.model import AdvertisedDevice, PodResourcesView

KUBELET_SOCKET = "kubelet.sock"


@contextlib.contextmanager
def socket_dir(prefix: str) -> Iterator[Path]:
    """A fresh dir under /tmp (short: unix socket paths must stay under 108 bytes),
    removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _target(path: Path) -> str:
    return f"unix://{path.resolve()}"


def fast_plugin_settings() -> PluginSettings:
    """Short polls and backoffs for tests; every bound still finite."""
    return PluginSettings(
        poll_interval_s=0.05,
        retry_pause_s=0.1,
        registration=RegistrationPolicy(
            max_attempts=50,
            max_total_s=5.0,
            initial_backoff_s=0.02,
            max_backoff_s=0.2,
            jitter_s=0.02,
            call_timeout_s=1.0,
        ),
        serve=ServeOptions(watch_poll_s=0.05, max_workers=8, stop_grace_s=0.1),
    )



class _Registration(dp_grpc.RegistrationServicer):
    def __init__(self, stub: KubeletStub) -> None:
        self._stub = stub

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        return self._stub._on_register(request, context)


class KubeletStub:
    def __init__(self, device_plugin_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(device_plugin_dir)
        self.socket_path = self.dir / KUBELET_SOCKET
        self._lock = threading.Condition()
        self._registrations: list[dp.RegisterRequest] = []
        self._server: grpc.Server | None = None
        self._clients: list[PluginClient] = []
        # Set to (code, message) to make Register fail; cleared by the test.
        self.register_error: tuple[grpc.StatusCode, str] | None = None
        # Called with each Register request before it is answered.
        self.on_register: Callable[[dp.RegisterRequest], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> KubeletStub:
        self.dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dp_grpc.add_RegistrationServicer_to_server(_Registration(self), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(_target(self.socket_path))
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()
        server, self._server = self._server, None
        if server is not None:
            server.stop(None).wait(5)

    def restart(self, delete_sockets: bool = True) -> None:
        """What a kubelet restart does to the dir: every socket is deleted, then a new
        kubelet.sock appears."""
        self.stop()
        if delete_sockets:
            for entry in self.dir.iterdir():
                if entry.is_socket():
                    entry.unlink()
        self.start()

    def __enter__(self) -> KubeletStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- registration ------------------------------------------------------------------
    def _on_register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        if self.on_register is not None:
            self.on_register(request)
        error = self.register_error
        with self._lock:
            self._registrations.append(request)
            self._lock.notify_all()
        if error is not None:
            context.abort(error[0], error[1])
        return dp.Empty()

    @property
    def registrations(self) -> list[dp.RegisterRequest]:
        with self._lock:
            return list(self._registrations)

    def wait_for_registrations(
        self, count: int, timeout_s: float = 10.0
    ) -> list[dp.RegisterRequest]:
        """Wait until at least ``count`` Register calls arrived; raise on timeout."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._registrations) >= count, timeout_s):
                raise TimeoutError(
                    f"{len(self._registrations)} registration(s) after {timeout_s}s, wanted {count}"
                )
            return list(self._registrations)

    # -- plugin side -------------------------------------------------------------------
    def plugin(self, endpoint: str) -> PluginClient:
        """Dial ``<dir>/<endpoint>`` as the kubelet does after a registration."""
        client = PluginClient(self.dir / endpoint)
        self._clients.append(client)
        return client


class PluginClient:
    """The kubelet's connection to one device plugin."""

    def __init__(self, socket_path: str | os.PathLike[str], timeout_s: float = 5.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(_target(self.socket_path))
        self.stub = dp_grpc.DevicePluginStub(self._channel)  # type: ignore[no-untyped-call]
        self._cv = threading.Condition()
        self._lists: list[list[AdvertisedDevice]] = []
        self._watch_call: grpc.Future | None = None
        self._watch_thread: threading.Thread | None = None
        self.watch_ended = threading.Event()
        self.watch_error: grpc.RpcError | None = None

    def options(self) -> dp.DevicePluginOptions:
        answer: dp.DevicePluginOptions = self.stub.GetDevicePluginOptions(
            dp.Empty(), timeout=self.timeout_s, wait_for_ready=True
        )
        return answer

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        answer = self.preferred_allocation_raw(
            dp.PreferredAllocationRequest(
                container_requests=[
                    dp.ContainerPreferredAllocationRequest(
                        available_deviceIDs=list(available),
                        must_include_deviceIDs=list(must_include),
                        allocation_size=size,
                    )
                ]
            )
        )
        return list(answer.container_responses[0].deviceIDs)

    def preferred_allocation_raw(
        self, request: dp.PreferredAllocationRequest
    ) -> dp.PreferredAllocationResponse:
        answer: dp.PreferredAllocationResponse = self.stub.GetPreferredAllocation(
            request, timeout=self.timeout_s
        )
        return answer

    def allocate(self, device_ids: Sequence[str]) -> dp.ContainerAllocateResponse:
        answer = self.allocate_raw(
            dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=list(device_ids))]
            )
        )
        first: dp.ContainerAllocateResponse = answer.container_responses[0]
        return first

    def allocate_raw(self, request: dp.AllocateRequest) -> dp.AllocateResponse:
        answer: dp.AllocateResponse = self.stub.Allocate(request, timeout=self.timeout_s)
        return answer

    def pre_start(self, device_ids: Sequence[str]) -> None:
        self.stub.PreStartContainer(
            dp.PreStartContainerRequest(devices_ids=list(device_ids)), timeout=self.timeout_s
        )

    # -- ListAndWatch ------------------------------------------------------------------
    def watch(self) -> PluginClient:
        """Open ListAndWatch in a thread; the lists received are kept in order."""
        call = self.stub.ListAndWatch(dp.Empty(), wait_for_ready=True)
        self._watch_call = call

        def consume() -> None:
            try:
                for answer in call:
                    devices = [wire.device_from_pb(d) for d in answer.devices]
                    with self._cv:
                        self._lists.append(devices)
                        self._cv.notify_all()
            except grpc.RpcError as exc:
                if exc.code() is not grpc.StatusCode.CANCELLED:
                    self.watch_error = exc
            finally:
                self.watch_ended.set()
                with self._cv:
                    self._cv.notify_all()

        self._watch_thread = threading.Thread(target=consume, daemon=True, name="stub-law")
        self._watch_thread.start()
        return self

    @property
    def lists(self) -> list[list[AdvertisedDevice]]:
        with self._cv:
            return list(self._lists)

    @property
    def latest(self) -> list[AdvertisedDevice] | None:
        with self._cv:
            return self._lists[-1] if self._lists else None

    def wait_for_list(
        self,
        predicate: Callable[[list[AdvertisedDevice]], bool] = lambda _: True,
        timeout_s: float = 5.0,
    ) -> list[AdvertisedDevice]:
        """Wait until the latest list satisfies ``predicate``; raise on timeout."""
        with self._cv:
            ok = self._cv.wait_for(
                lambda: bool(self._lists) and predicate(self._lists[-1]), timeout_s
            )
            if not ok:
                raise TimeoutError(f"no matching device list within {timeout_s}s: {self._lists}")
            return self._lists[-1]

    def close(self) -> None:
        call = self._watch_call
        if call is not None:
            call.cancel()
        if self._watch_thread is not None:
            self._watch_thread.join(5)
        self._channel.close()


class _Lister(pr_grpc.PodResourcesListerServicer):
    def __init__(self, fake: FakePodResources) -> None:
        self._fake = fake

    def _delay(self, context: grpc.ServicerContext) -> None:
        if self._fake.delay_s > 0:
            # Bounded; ends early once the caller gave up.
            gone = threading.Event()
            context.add_callback(gone.set)
            gone.wait(self._fake.delay_s)

    def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        self._fake.calls["List"] += 1
        self._delay(context)
        return self._fake.list_response

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        self._fake.calls["GetAllocatableResources"] += 1
        self._delay(context)
        return self._fake.allocatable_response

    def Get(
        self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.GetPodResourcesResponse:
        self._fake.calls["Get"] += 1
        self._delay(context)
        for pod in self._fake.list_response.pod_resources:
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pr.GetPodResourcesResponse(pod_resources=pod)
        context.abort(
            grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found"
        )
        raise AssertionError("unreachable")


class FakePodResources:
    """A kubelet PodResources endpoint on ``socket_path``; set what it answers."""

    def __init__(self, socket_path: str | os.PathLike[str]) -> None:
        self.socket_path = Path(socket_path)
        self.list_response = pr.ListPodResourcesResponse()
        self.allocatable_response = pr.AllocatableResourcesResponse()
        self.delay_s = 0.0  # answer this late (tests of the client's timeout)
        self.calls = {"List": 0, "GetAllocatableResources": 0, "Get": 0}
        self._server: grpc.Server | None = None

    def set_pods(self, view: PodResourcesView) -> None:
        self.list_response = wire.pod_resources_pb(view)

    def set_allocatable(self, devices: Mapping[str, Sequence[str]]) -> None:
        self.allocatable_response = pr.AllocatableResourcesResponse(
            devices=wire.container_devices_pb(devices)
        )

    def start(self) -> FakePodResources:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pr_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(_target(self.socket_path))
        server.start()
        self._server = server
        return self

    def stop(self, remove_socket: bool = True) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(None).wait(5)
        if remove_socket:
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()

    def __enter__(self) -> FakePodResources:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
