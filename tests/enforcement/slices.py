"""Slices from a real agent (dummy backend, hami-core pool, real gRPC, kubelet-side stub)
and the stand-in driver's view of the same node, for the enforcement tests."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp
from tests.agent.served_agent import CORE, MEM, Rig, pod_view, rig_with
from tests.enforcement.runtime import HostImage, Image

if TYPE_CHECKING:  # conftest imports pytest; hack/gpu-delivery.py runs without it
    from tests.enforcement.conftest import Built


@dataclass
class Node:
    rig: Rig
    image: Image | HostImage

    def slice(self, name: str, memory_units: int, cores: int = 0) -> dp.ContainerAllocateResponse:
        """The kubelet admits pod ``name`` with one container asking for ``memory_units``
        and ``cores``: GetPreferredAllocation + Allocate per resource, in random order.
        Both responses of a container are identical; the last one is returned."""
        rig = self.rig
        view = pod_view(name, ("main", memory_units, cores), uid=f"uid-{name}")
        rig.pods.pods[(view.namespace, view.name)] = view
        rig.publish_pr()
        wanted = [(r, n) for r, n in ((MEM, memory_units), (CORE, cores)) if n > 0]
        random.Random(name).shuffle(wanted)
        resp = None
        for resource, n in wanted:
            client = rig.clients[resource]
            ids = client.preferred_allocation(rig.free_ids(resource), [], n)
            resp = client.allocate(ids)
            rig.held.setdefault((view.namespace, view.name, "main"), {})[resource] = ids
            rig.publish_pr()
        assert resp is not None
        return resp


def hami_sections(lib: Path, d: Path, unit_mib: int) -> dict[str, object]:
    preload = d / "ld.so.preload"
    preload.write_text(f"{lib}\n")
    return {
        "memoryUnitMiB": unit_mib,
        "runtime": {
            "enforcement": "hami-core",
            "hamiCore": {
                "libraryPath": str(lib),
                "preloadPath": str(preload),
                "cacheDir": str(d / "vgpu"),
            },
        },
    }


@contextlib.contextmanager
def hami_node(
    built: Built, tmp: Path, *, devices: int = 1, memory_mib: int = 16384, unit_mib: int = 1024
) -> Iterator[Node]:
    """A node of ``devices`` dummy devices of ``memory_mib`` in a hami-core pool."""
    sections = hami_sections(built.libvgpu, tmp, unit_mib)
    sections["dummy"] = lambda d: {"deviceCount": devices, "memoryMiB": memory_mib,
                                   "faultFile": str(d / "faults.json")}
    with rig_with(sections) as rig:
        assert rig.agent is not None
        devs = rig.agent.backend.devices()
        table = ";".join(f"{d.uuid}={d.memory_mib}" for d in devs)
        state = tmp / "driver-state"
        state.mkdir(exist_ok=True)
        yield Node(rig, Image(str(built.standin), table, str(state)))
