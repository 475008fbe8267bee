"""Client of the kubelet's PodResources API v1 (implements ``agent.ports.PodResourcesSource``).

The channel is opened on first use and dropped after any failure, so the next call dials
the (possibly re-created) socket afresh instead of waiting out gRPC's reconnect backoff.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Collection
from typing import TypeAlias

import grpc
from google.protobuf.message import DecodeError

from gpu_share.errors import KubeAccessError
from gpu_share.plugin import wire
from gpu_share.plugin.proto import podresources_v1_pb2 as pr
from gpu_share.plugin.proto import podresources_v1_pb2_grpc as pr_grpc
from gpu_share.plugin.registration import unix_target
from gpu_share.sharing.model import PodResourcesPod, PodResourcesView

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# The kubelet's answers can be large on busy nodes; the default 4 MiB is too tight.
MAX_RECEIVE_BYTES = 64 << 20
LIST_METHOD = "/v1.PodResourcesLister/List"
_RawList: TypeAlias = "grpc.UnaryUnaryMultiCallable[pr.ListPodResourcesRequest, bytes]"


class PodResourcesClient:
    def __init__(
        self,
        socket_path: str | os.PathLike[str] = DEFAULT_SOCKET,
        *,
        timeout_s: float = 2.0,
        resource_names: Collection[str] | None = None,
    ) -> None:
        """``resource_names``: keep only these resources' devices in answers (None: all)."""
        self.socket_path = os.fspath(socket_path)
        self.timeout_s = timeout_s
        self.resource_names = frozenset(resource_names) if resource_names is not None else None
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: pr_grpc.PodResourcesListerStub | None = None
        # List answered as bytes: pods unchanged since the last List are reused, not
        # parsed and converted again (wire.PodCache).
        self._list_raw: _RawList | None = None
        self._pods = wire.PodCache(self.resource_names)

    def _get_stub(self) -> pr_grpc.PodResourcesListerStub:
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(
                    unix_target(self.socket_path),
                    options=[("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)],
                )
                self._stub = pr_grpc.PodResourcesListerStub(self._channel)
                self._list_raw = self._channel.unary_unary(
                    LIST_METHOD,
                    request_serializer=pr.ListPodResourcesRequest.SerializeToString,
                    response_deserializer=None,
                )
            return self._stub

    def _get_list(self) -> _RawList:
        with self._lock:
            if self._list_raw is not None:
                return self._list_raw
        self._get_stub()
        with self._lock:
            assert self._list_raw is not None
            return self._list_raw

    def _reset(self) -> None:
        with self._lock:
            channel, self._channel, self._stub = self._channel, None, None
            self._list_raw = None
        if channel is not None:
            channel.close()

    def list(self) -> PodResourcesView:
        """All pods the kubelet admitted, with the devices each container holds.
        Raises ``KubeAccessError`` on any failure (timeout included)."""
        try:
            data = self._get_list()(pr.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as exc:
            self._reset()
            raise self._error("List", exc) from exc
        try:
            return self._pods.view(bytes(data))
        except DecodeError as exc:
            self._reset()
            raise KubeAccessError(
                f"kubelet PodResources List at {self.socket_path}: answer not readable: {exc}"
            ) from exc

    def allocatable(self) -> dict[str, tuple[str, ...]]:
        """Resource name -> every device ID the kubelet knows for it."""
        try:
            answer: pr.AllocatableResourcesResponse = self._get_stub().GetAllocatableResources(
                pr.AllocatableResourcesRequest(), timeout=self.timeout_s
            )
        except grpc.RpcError as exc:
            self._reset()
            raise self._error("GetAllocatableResources", exc) from exc
        return wire.allocatable_devices(answer, self.resource_names)

    def get(self, namespace: str, name: str) -> PodResourcesPod | None:
        """One pod (needs the kubelet's Get API, on by default since 1.34); None when the
        kubelet does not know the pod."""
        try:
            answer: pr.GetPodResourcesResponse = self._get_stub().Get(
                pr.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace),
                timeout=self.timeout_s,
            )
        except grpc.RpcError as exc:
            if _code(exc) is grpc.StatusCode.NOT_FOUND:
                return None
            self._reset()
            raise self._error("Get", exc) from exc
        if not answer.HasField("pod_resources"):
            return None
        return wire.pod_from_pb(answer.pod_resources, self.resource_names)

    def close(self) -> None:
        self._reset()

    def _error(self, call: str, exc: grpc.RpcError) -> KubeAccessError:
        code = _code(exc)
        details = exc.details() if hasattr(exc, "details") else str(exc)
        return KubeAccessError(
            f"kubelet PodResources {call} at {self.socket_path} failed: "
            f"{code.name if code is not None else 'UNKNOWN'}: {details}"
        )


def _code(exc: grpc.RpcError) -> grpc.StatusCode | None:
    code = exc.code() if hasattr(exc, "code") else None
    return code if isinstance(code, grpc.StatusCode) else None
