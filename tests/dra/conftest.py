"""A fake ClaimPreparer, a kubelet-like client and a served DRA plugin on real unix
sockets in a short temp dir."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from gpu_share.agent.dra.ports import ClaimRef, PreparedDevice, PrepareResult
from gpu_share.dra.proto import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from gpu_share.dra.proto import pluginregistration_v1_pb2 as reg
from gpu_share.dra.proto import pluginregistration_v1_pb2_grpc as reg_grpc
from gpu_share.dra.server import DraPluginServer, DraServeOptions

DRIVER = "gpu-share.vendor.com"
FAST = DraServeOptions(watch_poll_s=0.05, stop_grace_s=0.2, stop_timeout_s=5.0)
# (messages, stubs) of each DRA API version the kubelet may pick.
VERSIONS: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}


def devices_for(ref: ClaimRef) -> tuple[PreparedDevice, ...]:
    return (
        PreparedDevice(
            requests=("slice",),
            pool="node-a",
            device="gpu-0",
            cdi_device_ids=(f"{DRIVER}/claim={ref.uid}-gpu-0",),
        ),
    )


@dataclass
class FakePreparer:
    """Records every call; answers devices per claim, or what the test sets."""

    prepared: list[list[ClaimRef]] = field(default_factory=list)
    unprepared: list[list[ClaimRef]] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # uid -> error (both calls)
    raise_with: BaseException | None = None
    omit: set[str] = field(default_factory=set)  # uids left out of the answer
    # When set, prepare blocks until ``release`` is set (a call in flight).
    block: bool = False
    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    result_for: Callable[[ClaimRef], PrepareResult] | None = None

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        self.prepared.append(list(claims))
        self.entered.set()
        if self.block:
            self.release.wait(30)
        if self.raise_with is not None:
            raise self.raise_with
        out: dict[str, PrepareResult] = {}
        for ref in claims:
            if ref.uid in self.omit:
                continue
            if self.result_for is not None:
                out[ref.uid] = self.result_for(ref)
            elif ref.uid in self.errors:
                out[ref.uid] = PrepareResult(error=self.errors[ref.uid])
            else:
                out[ref.uid] = PrepareResult(devices=devices_for(ref))
        return out

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        self.unprepared.append(list(claims))
        if self.raise_with is not None:
            raise self.raise_with
        return {r.uid: self.errors.get(r.uid, "") for r in claims if r.uid not in self.omit}


class Kubelet:
    """What the kubelet does: GetInfo and NotifyRegistrationStatus on the registration
    socket, then the DRAPlugin calls on the endpoint GetInfo named."""

    def __init__(self, registration_socket: Path) -> None:
        self.registration_socket = registration_socket
        self._channels: list[grpc.Channel] = []

    def channel(self, path: str | Path, **options: int) -> grpc.Channel:
        ch = grpc.insecure_channel(
            f"unix://{Path(path).absolute()}",
            options=[(f"grpc.{k}", v) for k, v in options.items()],
        )
        self._channels.append(ch)
        return ch

    def registration(self) -> Any:
        return reg_grpc.RegistrationStub(self.channel(self.registration_socket))

    def get_info(self) -> reg.PluginInfo:
        info: reg.PluginInfo = self.registration().GetInfo(reg.InfoRequest(), timeout=5)
        return info

    def notify(self, registered: bool, error: str = "") -> None:
        self.registration().NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=registered, error=error), timeout=5
        )

    def register(self) -> reg.PluginInfo:
        info = self.get_info()
        self.notify(True)
        return info

    def dra(self, version: str, endpoint: str | Path) -> Any:
        return VERSIONS[version][1].DRAPluginStub(self.channel(endpoint))

    def prepare(
        self, version: str, endpoint: str | Path, claims: Sequence[tuple[str, str, str]],
        timeout: float = 5,
    ) -> Any:
        pb = VERSIONS[version][0]
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        return self.dra(version, endpoint).NodePrepareResources(request, timeout=timeout)

    def unprepare(
        self, version: str, endpoint: str | Path, claims: Sequence[tuple[str, str, str]]
    ) -> Any:
        pb = VERSIONS[version][0]
        request = pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        return self.dra(version, endpoint).NodeUnprepareResources(request, timeout=5)

    def raw(self, endpoint: str | Path, method: str, data: bytes, version: str = "v1") -> bytes:
        """Send ``data`` unserialized to a DRAPlugin ``method``."""
        call = self.channel(endpoint).unary_unary(
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/{method}"
        )
        out: bytes = call(data, timeout=5)
        return out

    def close(self) -> None:
        for ch in self._channels:
            ch.close()


@pytest.fixture
def preparer() -> FakePreparer:
    return FakePreparer()


@pytest.fixture
def failures() -> list[str]:
    return []


@pytest.fixture
def plugin(
    sock_dir: Path, preparer: FakePreparer, failures: list[str]
) -> Iterator[DraPluginServer]:
    server = DraPluginServer(
        DRIVER,
        preparer,
        plugin_dir=sock_dir / "plugins" / DRIVER,
        registration_dir=sock_dir / "plugins_registry",
        options=FAST,
        on_registration_failure=failures.append,
    )
    server.start()
    try:
        yield server
    finally:
        preparer.release.set()
        server.stop()


@pytest.fixture
def kubelet(plugin: DraPluginServer) -> Iterator[Kubelet]:
    with contextlib.closing(Kubelet(plugin.registration_socket)) as k:
        yield k
