"""Conversions between protobuf messages and the ``sharing.model`` value types.

Everything protobuf-shaped stays in this package; the agent only sees model types.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from gpu_share.plugin.handler import ResourceHandler
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


def plugin_options(handler: ResourceHandler) -> dp.DevicePluginOptions:
    """The options the plugin of ``handler`` registers with and answers."""
    return dp.DevicePluginOptions(
        pre_start_required=handler.pre_start_required,
        get_preferred_allocation_available=handler.preferred_allocation_available,
    )


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


def preferred_response(
    handler: ResourceHandler, req: dp.ContainerPreferredAllocationRequest
) -> dp.ContainerPreferredAllocationResponse:
    """The handler's choice for one container of a GetPreferredAllocation call."""
    ids = handler.preferred_allocation(
        list(req.available_deviceIDs), list(req.must_include_deviceIDs), req.allocation_size
    )
    return dp.ContainerPreferredAllocationResponse(deviceIDs=ids)


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


# ListPodResourcesResponse.pod_resources (podresources/v1 api.proto): its only field.
LIST_PODS_FIELD = 1
_LEN = 2  # wire type of length-delimited fields (messages, strings, bytes)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 64:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def _skip(data: bytes, pos: int, wire_type: int) -> int:
    if wire_type == 0:
        return _varint(data, pos)[1]
    if wire_type == 1:
        return pos + 8
    if wire_type == _LEN:
        size, pos = _varint(data, pos)
        return pos + size
    if wire_type == 5:
        return pos + 4
    raise ValueError(f"wire type {wire_type} not expected here")


def repeated_message_bytes(data: bytes, field: int) -> list[bytes] | None:
    """The encoded bytes of each element of the repeated message ``field`` at the top
    level of ``data`` (other fields skipped), without parsing them; None when ``data`` is
    not well-formed wire format (the caller then parses it whole and gets its error)."""
    out: list[bytes] = []
    pos, end = 0, len(data)
    try:
        while pos < end:
            tag, pos = _varint(data, pos)
            if tag >> 3 == field and tag & 7 == _LEN:
                size, pos = _varint(data, pos)
                out.append(data[pos : pos + size])
                pos += size
            else:
                pos = _skip(data, pos, tag & 7)
    except (IndexError, ValueError):
        return None
    return out if pos == end else None


class PodCache:
    """Converted pods by their encoded ``PodResources`` bytes: a pod the kubelet lists
    unchanged is neither parsed nor converted again, and the same object comes back
    (the engine then skips what it already knows of it). Holds the last list's pods
    only. Safe for concurrent callers (each builds a new table, the last one stays)."""

    def __init__(self, resources: Collection[str] | None) -> None:
        self._resources = resources
        self._pods: dict[bytes, PodResourcesPod] = {}

    def view(self, data: bytes) -> PodResourcesView:
        """``pod_resources_view`` of an encoded ``ListPodResourcesResponse``; raises
        ``google.protobuf.message.DecodeError`` on a malformed one."""
        chunks = repeated_message_bytes(data, LIST_PODS_FIELD)
        if chunks is None:
            return pod_resources_view(pr.ListPodResourcesResponse.FromString(data),
                                      self._resources)
        old: dict[bytes, PodResourcesPod] = self._pods
        new: dict[bytes, PodResourcesPod] = {}
        for chunk in chunks:
            pod = old.get(chunk) or new.get(chunk)
            if pod is None:
                pod = pod_from_pb(pr.PodResources.FromString(chunk), self._resources)
            new[chunk] = pod
        self._pods = new
        return PodResourcesView(pods=tuple(new[c] for c in chunks))


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
