"""PodResources client against the fake kubelet endpoint."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import DecodeError

from gpu_share.errors import KubeAccessError
from gpu_share.plugin import wire
from gpu_share.plugin.podresources import PodResourcesClient
from gpu_share.plugin.proto import podresources_v1_pb2 as pr
from gpu_share.sharing.model import PodResourcesContainer, PodResourcesPod, PodResourcesView
from testkit.kubelet_stub import FakePodResources

MEM = "vendor.com/vcuda-memory"
CORE = "vendor.com/vcuda-core"
OTHER = "example.com/fpga"

VIEW = PodResourcesView(
    pods=(
        PodResourcesPod(
            namespace="ns",
            name="p1",
            containers=(
                PodResourcesContainer(
                    "init", {MEM: ("GPU-a-0", "GPU-a-1"), CORE: ("GPU-a-c0",), OTHER: ("f0",)}
                ),
                PodResourcesContainer("app", {}),
            ),
        ),
        PodResourcesPod(namespace="other", name="p2", containers=()),
    )
)


@pytest.fixture
def fake(sock_dir: Path) -> Iterator[FakePodResources]:
    f = FakePodResources(sock_dir / "pod-resources" / "kubelet.sock").start()
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture
def connect(fake: FakePodResources) -> Iterator[Callable[..., PodResourcesClient]]:
    """Clients of ``fake`` (PodResourcesClient's options), closed after the test."""
    made: list[PodResourcesClient] = []

    def make(**options: Any) -> PodResourcesClient:
        made.append(PodResourcesClient(fake.socket_path, **options))
        return made[-1]

    yield make
    for client in made:
        client.close()


def test_list_converts_all_resources_without_filter(
    fake: FakePodResources, connect: Callable[..., PodResourcesClient]
) -> None:
    fake.set_pods(VIEW)
    assert connect(timeout_s=2).list() == VIEW


def test_list_keeps_only_our_resources_but_every_pod(
    fake: FakePodResources, connect: Callable[..., PodResourcesClient]
) -> None:
    fake.set_pods(VIEW)
    view = connect(resource_names={MEM, CORE}).list()
    assert [(p.namespace, p.name) for p in view.pods] == [("ns", "p1"), ("other", "p2")]
    init = view.pods[0].containers[0]
    assert dict(init.devices) == {MEM: ("GPU-a-0", "GPU-a-1"), CORE: ("GPU-a-c0",)}
    assert view.pods[0].containers[1] == PodResourcesContainer("app", {})


def test_allocatable(fake: FakePodResources, connect: Callable[..., PodResourcesClient]) -> None:
    fake.set_allocatable({MEM: ["m0", "m1"], OTHER: ["f0"]})
    assert connect(resource_names=[MEM]).allocatable() == {MEM: ("m0", "m1")}


def test_get_one_pod_or_none(
    fake: FakePodResources, connect: Callable[..., PodResourcesClient]
) -> None:
    fake.set_pods(VIEW)
    client = connect()
    assert client.get("ns", "p1") == VIEW.pods[0]
    assert client.get("ns", "missing") is None


def test_timeout_raises_kube_access_error(
    fake: FakePodResources, connect: Callable[..., PodResourcesClient]
) -> None:
    fake.delay_s = 3.0
    client = connect(timeout_s=0.2)
    with pytest.raises(KubeAccessError, match="DEADLINE_EXCEEDED") as info:
        client.list()
    assert info.value.reason == "KubeUnreachable"


def test_missing_socket_raises_kube_access_error(sock_dir: Path) -> None:
    client = PodResourcesClient(sock_dir / "absent.sock", timeout_s=0.5)
    try:
        with pytest.raises(KubeAccessError, match="UNAVAILABLE"):
            client.list()
        with pytest.raises(KubeAccessError):
            client.allocatable()
    finally:
        client.close()


def test_reconnects_after_kubelet_restart(
    fake: FakePodResources, connect: Callable[..., PodResourcesClient]
) -> None:
    fake.set_pods(VIEW)
    client = connect(timeout_s=1)
    assert len(client.list().pods) == 2
    fake.stop()
    with pytest.raises(KubeAccessError):
        client.list()
    fake.set_pods(PodResourcesView())
    fake.start()
    assert client.list() == PodResourcesView()


# ---- the List answer's per-pod cache (wire.PodCache) ------------------------------------


def _encoded(view: PodResourcesView) -> bytes:
    return wire.pod_resources_pb(view).SerializeToString()


def test_pod_cache_reads_what_a_whole_parse_reads() -> None:
    resources = frozenset({MEM, CORE})
    cache = wire.PodCache(resources)
    changed = PodResourcesPod("ns", "p1", (PodResourcesContainer("app", {MEM: ("GPU-b-0",)}),))
    for view in (VIEW, PodResourcesView(), PodResourcesView((VIEW.pods[1], changed, VIEW.pods[1]))):
        data = _encoded(view)
        whole = wire.pod_resources_view(pr.ListPodResourcesResponse.FromString(data), resources)
        assert cache.view(data) == whole
    # Fields of a later API version are skipped, as a parse skips them.
    extra = _encoded(VIEW) + b"\x10\x07" + b"\x1a\x03abc" + b"\x25\x00\x00\x00\x00"
    whole = wire.pod_resources_view(pr.ListPodResourcesResponse.FromString(extra), resources)
    assert cache.view(extra) == whole


def test_pod_cache_reuses_unchanged_pods_only() -> None:
    cache = wire.PodCache(None)
    first = cache.view(_encoded(VIEW))
    p1_again = PodResourcesPod("ns", "p1", (PodResourcesContainer("app", {MEM: ("GPU-a-3",)}),))
    second = cache.view(_encoded(PodResourcesView((p1_again, VIEW.pods[1]))))
    assert second.pods[1] is first.pods[1]  # listed unchanged: the same object
    assert second.pods[0] == p1_again and second.pods[0] is not first.pods[0]
    # Only the last list's pods are kept.
    cache.view(_encoded(PodResourcesView()))
    assert cache.view(_encoded(VIEW)).pods[1] is not first.pods[1]


def test_wire_split_refuses_what_is_not_wire_format() -> None:
    assert wire.repeated_message_bytes(b"\x0a\x05ab", 1) is None  # cut short
    assert wire.repeated_message_bytes(b"\x0f", 1) is None  # wire type 7
    assert wire.repeated_message_bytes(b"\x0a\x00\x0a\x01\x00", 1) == [b"", b"\x00"]
    with pytest.raises(DecodeError):
        wire.PodCache(None).view(b"\x0a\x05ab")


def test_client_reuses_pods_listed_unchanged(fake: FakePodResources) -> None:
    client = PodResourcesClient(fake.socket_path, timeout_s=2)
    fake.set_pods(VIEW)
    try:
        assert client.list() == VIEW
        assert client.list().pods[0] is client.list().pods[0]  # reused between Lists
    finally:
        client.close()
