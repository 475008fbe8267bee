"""Conversions between protobuf messages and the ``sharing.model`` value types.

Everything protobuf-shaped stays in this package; the agent only sees model types.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp
from gpu_share.plugin.proto import podresources_v1_pb2 as pr
from gpu_share.sharing.model import (
    AdvertisedDevice,
    AllocateSpec,
    PodResourcesContainer,
    PodResourcesPod,
    PodResourcesView,
)

# Health strings the kubelet understands (k8s.io/kubelet deviceplugin constants).
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


def device_to_pb(device: AdvertisedDevice) -> dp.Device:
    msg = dp.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY)
    if device.numa_node is not None:
        msg.topology.nodes.append(dp.NUMANode(ID=device.numa_node))
    return msg


def list_and_watch_response(devices: Iterable[AdvertisedDevice]) -> dp.ListAndWatchResponse:
    return dp.ListAndWatchResponse(devices=[device_to_pb(d) for d in devices])


def device_from_pb(msg: dp.Device) -> AdvertisedDevice:
    numa = msg.topology.nodes[0].ID if msg.HasField("topology") and msg.topology.nodes else None
    return AdvertisedDevice(id=msg.ID, healthy=msg.health == HEALTHY, numa_node=numa)


def allocate_response(spec: AllocateSpec) -> dp.ContainerAllocateResponse:
    return dp.ContainerAllocateResponse(
        envs=dict(spec.envs),
        mounts=[
            dp.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in spec.mounts
        ],
        devices=[
            dp.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in spec.devices
        ],
        annotations=dict(spec.annotations),
        cdi_devices=[dp.CDIDevice(name=name) for name in spec.cdi_devices],
    )


def _devices_by_resource(
    groups: Iterable[pr.ContainerDevices], resources: Collection[str] | None
) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for group in groups:
        if resources is not None and group.resource_name not in resources:
            continue
        out.setdefault(group.resource_name, []).extend(group.device_ids)
    return {name: tuple(ids) for name, ids in out.items()}


def pod_from_pb(msg: pr.PodResources, resources: Collection[str] | None) -> PodResourcesPod:
    return PodResourcesPod(
        namespace=msg.namespace,
        name=msg.name,
        containers=tuple(
            PodResourcesContainer(name=c.name, devices=_devices_by_resource(c.devices, resources))
            for c in msg.containers
        ),
    )


def pod_resources_view(
    msg: pr.ListPodResourcesResponse, resources: Collection[str] | None = None
) -> PodResourcesView:
    """``resources``: keep only these resource names' devices (None keeps all). Pods and
    containers are always kept, so callers still see who runs on the node."""
    return PodResourcesView(pods=tuple(pod_from_pb(p, resources) for p in msg.pod_resources))


def allocatable_devices(
    msg: pr.AllocatableResourcesResponse, resources: Collection[str] | None = None
) -> dict[str, tuple[str, ...]]:
    return _devices_by_resource(msg.devices, resources)


def pod_resources_pb(view: PodResourcesView) -> pr.ListPodResourcesResponse:
    """The reverse of ``pod_resources_view`` (used by test stubs and benchmarks)."""
    return pr.ListPodResourcesResponse(pod_resources=[pod_pb(p) for p in view.pods])


def pod_pb(pod: PodResourcesPod) -> pr.PodResources:
    return pr.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[
            pr.ContainerResources(name=c.name, devices=container_devices_pb(c.devices))
            for c in pod.containers
        ],
    )


def container_devices_pb(devices: Mapping[str, Sequence[str]]) -> list[pr.ContainerDevices]:
    return [
        pr.ContainerDevices(resource_name=name, device_ids=list(ids))
        for name, ids in devices.items()
    ]
