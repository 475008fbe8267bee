"""The CDI spec of a node's devices (Container Device Interface, cncf-tags/container-device-
interface SPEC.md): what a CDI-capable runtime injects for ``<kind>=<device uuid>``, the
names ``response.py`` hands out under the cdi-annotations / cdi-cri strategies.

Pure: the agent (``agent/cdi.py``) reads other spec files and writes ours. Interop rule
(docs/enforcement.md, "CDI"): another spec of the same kind (e.g. ``nvidia-ctk cdi
generate``) that already defines a device is never duplicated. Defined under its UUID,
the device is left to that spec (``referenced``: our name resolves to it); defined only
under another name (index naming), it is left out too (``shadowed``) and reported, since
two specs of one kind defining one device node is what the runtime would then reject or
resolve arbitrarily.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_share.config.model import DeviceListStrategy, RuntimeConfig
from gpu_share.devices.base import Device, DeviceNode, RuntimeNaming
from gpu_share.sharing.model import Hook

# The runtime reads /etc/cdi (static, e.g. nvidia-ctk output) and /var/run/cdi (transient,
# ours); a device defined in both is taken from /var/run/cdi.
STATIC_SPEC_DIR = "/etc/cdi"
DYNAMIC_SPEC_DIR = "/var/run/cdi"
CDI_STRATEGIES = frozenset({DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI})
# Per device: which device CDI injected (one variable per device, so several merge).
ENV_CDI_DEVICE_PREFIX = "GPU_SHARE_CDI_DEVICE_"
MAX_SPEC_DEVICES = 1024
# The NVIDIA container toolkit's hook that sets the driver's per-cgroup memory limit from
# the container's NVIDIA_GPU_MEMORY_REQUEST / NVIDIA_GPU_MEMORY_LIMIT (MiB).
MEMORY_LIMITS_HOOK = "apply-cuda-memory-limits"
# CDI device names: alphanumeric at both ends, '-', '_', '.' between (SPEC.md).
_DEVICE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,252}[A-Za-z0-9])?")



def claim_spec_prefix(driver: str) -> str:
    """The start of every per-claim CDI spec file name of ``driver`` (DRA mode writes
    them; the device-plugin mode's spec writer leaves them alone)."""
    return f"{driver}-claim_"

def uses_cdi(runtime: RuntimeConfig) -> bool:
    """Whether any device list strategy names devices through CDI."""
    return any(s in CDI_STRATEGIES for s in runtime.device_list_strategy)


def cdi_version(kind: str) -> str:
    """The lowest spec version with what we use: ``hostPath`` of device nodes (0.5.0),
    a dot in the kind's name segment (0.6.0). Lowest, so older runtimes read it too."""
    return "0.6.0" if "." in kind.partition("/")[2] else "0.5.0"


def spec_file_name(kind: str) -> str:
    """``gpu-share_<vendor>-<class>.json``: one file per node agent (one kind per pool)."""
    return "gpu-share_" + kind.replace("/", "-") + ".json"


@dataclass(frozen=True)
class ForeignSpec:
    """What another spec file of our kind defines: device names and the container paths
    of each device's own nodes."""

    path: str
    names: Mapping[str, frozenset[str]]


@dataclass(frozen=True)
class CdiPlan:
    """``spec``: the document to write (None: every device is defined elsewhere, write
    nothing). ``referenced``: (uuid, file) defined under the uuid by another spec.
    ``shadowed``: (uuid, file, names) defined there under other names only. ``invalid``:
    uuids that are no CDI device name."""

    spec: dict[str, Any] | None
    referenced: tuple[tuple[str, str], ...] = ()
    shadowed: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    invalid: tuple[str, ...] = ()


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _node_paths(device: Mapping[str, Any]) -> frozenset[str]:
    edits = device.get("containerEdits")
    nodes = _as_list(edits.get("deviceNodes")) if isinstance(edits, dict) else []
    return frozenset(
        n["path"] for n in nodes if isinstance(n, dict) and isinstance(n.get("path"), str)
    )


def foreign_spec(path: str, doc: object, kind: str) -> ForeignSpec | None:
    """The devices ``doc`` (a parsed spec file) defines for ``kind``; None when it is
    another kind or not a spec. Tolerant: a malformed entry is skipped, not fatal."""
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        return None
    names: dict[str, frozenset[str]] = {}
    for dev in _as_list(doc.get("devices"))[:MAX_SPEC_DEVICES]:
        if isinstance(dev, dict) and isinstance(dev.get("name"), str):
            names[dev["name"]] = _node_paths(dev)
    return ForeignSpec(path=path, names=names)


def _node(n: DeviceNode) -> dict[str, Any]:
    return {"path": n.container_path, "hostPath": n.host_path, "permissions": n.permissions}


def _device_entry(d: Device) -> dict[str, Any]:
    return {
        "name": d.uuid,
        "containerEdits": {
            "env": [f"{ENV_CDI_DEVICE_PREFIX}{d.index}={d.uuid}"],
            "deviceNodes": [_node(n) for n in d.nodes],
        },
    }


def _defined_elsewhere(
    d: Device, foreign: Sequence[ForeignSpec]
) -> tuple[str, str, tuple[str, ...]] | None:
    """(file, "" or the other names) of the first spec defining ``d``; None if none does.
    "" means: defined under the uuid itself."""
    own = {n.container_path for n in d.nodes}
    for f in foreign:
        if d.uuid in f.names:
            return (f.path, "", ())
        others = tuple(sorted(name for name, paths in f.names.items() if own and own <= paths))
        if others:
            return (f.path, "other", others)
    return None


def plan_spec(
    kind: str,
    devices: Iterable[Device],
    naming: RuntimeNaming | None,
    foreign: Sequence[ForeignSpec] = (),
) -> CdiPlan:
    """Our spec for ``devices`` (in index order) minus what ``foreign`` specs define."""
    entries: list[dict[str, Any]] = []
    referenced: list[tuple[str, str]] = []
    shadowed: list[tuple[str, str, tuple[str, ...]]] = []
    invalid: list[str] = []
    for d in sorted(devices, key=lambda x: (x.index, x.uuid))[:MAX_SPEC_DEVICES]:
        if not _DEVICE_NAME.fullmatch(d.uuid):
            invalid.append(d.uuid)
            continue
        hit = _defined_elsewhere(d, foreign)
        if hit is None:
            entries.append(_device_entry(d))
        elif hit[1] == "":
            referenced.append((d.uuid, hit[0]))
        else:
            shadowed.append((d.uuid, hit[0], hit[2]))
    spec: dict[str, Any] | None = None
    if entries:
        spec = {"cdiVersion": cdi_version(kind), "kind": kind, "devices": entries}
        shared = [_node(n) for n in (naming.shared_nodes if naming else ())]
        if shared:
            # Applied once whenever any of our devices is injected (e.g. /dev/nvidiactl).
            spec["containerEdits"] = {"deviceNodes": shared}
    return CdiPlan(
        spec=spec, referenced=tuple(referenced), shadowed=tuple(shadowed), invalid=tuple(invalid)
    )


def memory_limits_hook(hook_path: str, driver_root: str, uuid: str) -> Hook:
    """The toolkit's hook for one GPU, as its own generated specs call it."""
    return Hook(hook_path, ("nvidia-cdi-hook", MEMORY_LIMITS_HOOK, "--driver-root", driver_root,
                            "--gpu-id", uuid))


def hook_doc(h: Hook) -> dict[str, Any]:
    return {"hookName": h.hook_name, "path": h.path, "args": list(h.args)}


def memory_limits_spec(
    kind: str, devices: Iterable[Device], hook_path: str, driver_root: str
) -> dict[str, Any] | None:
    """The hook-only devices of ``kind`` (one per GPU, named by UUID, no device node): a
    device-plugin container is handed ``<kind>=<uuid>`` beside its GPU, whoever's spec
    defines the GPU itself. None when no device has a valid name."""
    entries = [
        {"name": d.uuid,
         "containerEdits": {"hooks": [hook_doc(memory_limits_hook(hook_path, driver_root,
                                                                   d.uuid))]}}
        for d in sorted(devices, key=lambda x: (x.index, x.uuid))[:MAX_SPEC_DEVICES]
        if _DEVICE_NAME.fullmatch(d.uuid)
    ]
    if not entries:
        return None
    return {"cdiVersion": cdi_version(kind), "kind": kind, "devices": entries}
