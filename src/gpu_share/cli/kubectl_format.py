"""Output of ``kubectl gpu-share``: kubectl-style tables (default and ``-o wide``) and
JSON/YAML documents. No I/O: every function returns text."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import yaml

from gpu_share.cli.kubectl_fit import FitResult
from gpu_share.cli.kubectl_view import DeviceRow, NodeRow, SliceRow
from gpu_share.sharing.model import camel_fields

BAR_WIDTH = 10


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns left-aligned, three spaces apart (as kubectl prints them)."""
    widths = [len(h) for h in header]
    for r in rows:
        widths = [max(w, len(v)) for w, v in zip(widths, r, strict=True)]
    lines = ["   ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
             for r in (header, *rows)]
    return "\n".join(lines) + "\n"


def bar(used: int, total: int, width: int = BAR_WIDTH) -> str:
    """``[###-------]``: any use shows at least one mark, a device not full never all."""
    if total <= 0:
        return "[" + "?" * width + "]"
    used = max(0, min(used, total))
    filled = round(used * width / total)
    if used and not filled:
        filled = 1
    if used < total and filled == width:
        filled = width - 1
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def mib(value: int) -> str:
    return f"{value // 1024}Gi" if value % 1024 == 0 else f"{value}Mi"


def memory_pair(used_units: int, total_units: int, unit_mib: int) -> str:
    """``6/16Gi`` (one suffix when both are whole GiB), else ``768Mi/16Gi``."""
    used, total = used_units * unit_mib, total_units * unit_mib
    if used % 1024 == 0 and total % 1024 == 0:
        return f"{used // 1024}/{total // 1024}Gi"
    return f"{mib(used)}/{mib(total)}"


def block(free: tuple[int, int] | None, unit_mib: int) -> str:
    if free is None:
        return "<none>"
    return f"{mib(free[0] * unit_mib)}/{free[1]}%"


_MIN, _HOUR, _DAY = 60, 3600, 86400
# (shown while the age is below, unit, its letter, the smaller unit shown too or 0, its
# letter): kubectl's HumanDuration steps.
_AGE_STEPS = (
    (120, 1, "s", 0, ""),
    (10 * _MIN, _MIN, "m", 1, "s"),
    (180 * _MIN, _MIN, "m", 0, ""),
    (8 * _HOUR, _HOUR, "h", _MIN, "m"),
    (48 * _HOUR, _HOUR, "h", 0, ""),
    (8 * _DAY, _DAY, "d", _HOUR, "h"),
    (730 * _DAY, _DAY, "d", 0, ""),
)


def age(created: str, now: datetime) -> str:
    """kubectl's short age: 45s, 5m12s, 95m, 3h20m, 30h, 4d6h, 120d, 2y."""
    try:
        then = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    s = max(0, int((now - then).total_seconds()))
    for below, unit, name, part, part_name in _AGE_STEPS:
        if s < below:
            whole, rest = divmod(s, unit)
            rest = rest // part if part else 0
            return f"{whole}{name}{rest}{part_name}" if rest else f"{whole}{name}"
    return f"{s // (365 * _DAY)}y"


def document(doc: Any, output: str) -> str:
    if output == "yaml":
        return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return json.dumps(doc, indent=2) + "\n"


# ---------------------------------------------------------------- nodes


def _health(d: DeviceRow) -> str:
    # As kubectl shows a cordoned node: "Ready,SchedulingDisabled".
    health = "Healthy" if d.healthy else "Unhealthy"
    return health + ",Cordoned" if d.cordoned else health


def _cordon_cell(d: DeviceRow) -> str:
    if d.cordon is None:
        return "<none>"
    why = d.cordon.reason if len(d.cordon.reason) <= 40 else d.cordon.reason[:39] + "~"
    return f"{d.cordon.by}: {why}" if why else d.cordon.by


def _usage(d: DeviceRow) -> str:
    return f"mem{bar(d.memory_used, d.memory_total)} core{bar(d.cores_used, d.cores_total)}"


def nodes_table(rows: Sequence[NodeRow], wide: bool = False) -> str:
    header = ["NODE", "GPU", "MODEL", "MEMORY", "CORES", "HEALTH", "PODS", "LARGEST FREE",
              "USAGE"]
    if wide:
        header += ["CORDON", "POOL", "UUID", "NUMA", "POD NAMES"]
    out = []
    for n in rows:
        for d in n.devices:
            r = [n.name, str(d.index), d.model, memory_pair(d.memory_used, d.memory_total,
                                                            d.unit_mib),
                 f"{d.cores_used}/{d.cores_total}", _health(d), str(len(d.pods)),
                 block(n.largest_free, n.unit_mib), _usage(d)]
            if wide:
                r += [_cordon_cell(d), n.pool or "<none>", d.id,
                      "<none>" if d.numa is None else str(d.numa), ",".join(d.pods) or "<none>"]
            out.append(r)
    return table(header, out)


def _device_doc(d: DeviceRow) -> dict[str, Any]:
    return {
        **camel_fields(d, "index", "id", "model", "healthy", "cordoned"),
        "cordon": (None if d.cordon is None else
                   {"by": d.cordon.by, "reason": d.cordon.reason, "at": d.cordon.at or None}),
        "numa": d.numa,
        "memoryUnits": {"total": d.memory_total, "used": d.memory_used,
                        "free": d.memory_total - d.memory_used},
        "memoryMiB": {"total": d.memory_total * d.unit_mib, "used": d.memory_used * d.unit_mib},
        "cores": {"total": d.cores_total, "used": d.cores_used,
                  "free": d.cores_total - d.cores_used},
        "pods": list(d.pods),
    }


def nodes_doc(rows: Sequence[NodeRow]) -> dict[str, Any]:
    return {
        "kind": "GpuShareNodeList",
        "items": [
            {
                "name": n.name,
                "pool": n.pool or None,
                "unitMiB": n.unit_mib,
                "pods": list(n.pods),
                "largestFree": (None if n.largest_free is None else
                                {"memoryUnits": n.largest_free[0], "cores": n.largest_free[1]}),
                "devices": [_device_doc(d) for d in n.devices],
            }
            for n in rows
        ],
    }


# ---------------------------------------------------------------- pods


def _device_cell(r: SliceRow) -> str:
    if not r.device:
        return "<none>"
    return str(r.index) if r.index is not None else r.device


def _memory_cell(r: SliceRow) -> str:
    return f"{r.memory_units}u" if r.unit_mib is None else mib(r.memory_units * r.unit_mib)


def pods_table(rows: Sequence[SliceRow], now: datetime, *, all_namespaces: bool,
               wide: bool = False) -> str:
    header = ["POD", "CONTAINER", "NODE", "GPU", "MEMORY", "CORES", "MODE", "SOURCE", "AGE"]
    if all_namespaces:
        header.insert(0, "NAMESPACE")
    if wide:
        header += ["UUID", "SIGNED"]
    out = []
    for r in rows:
        cells = [r.pod, r.container, r.node or "<none>", _device_cell(r), _memory_cell(r),
                 str(r.cores), "exclusive" if r.exclusive else "shared", r.source,
                 age(r.created, now)]
        if all_namespaces:
            cells.insert(0, r.namespace)
        if wide:
            cells += [r.device or "<none>", "yes" if r.signed else "no"]
        out.append(cells)
    return table(header, out)


def pods_doc(rows: Sequence[SliceRow]) -> dict[str, Any]:
    return {
        "kind": "GpuShareSliceList",
        "items": [
            {
                "namespace": r.namespace,
                "pod": r.pod,
                "container": r.container,
                "node": r.node or None,
                "device": r.device or None,
                "index": r.index,
                "memoryUnits": r.memory_units,
                "memoryMiB": None if r.unit_mib is None else r.memory_units * r.unit_mib,
                "cores": r.cores,
                "mode": "exclusive" if r.exclusive else "shared",
                "source": r.source,
                "signed": r.signed,
                "created": r.created or None,
            }
            for r in rows
        ],
    }


# ---------------------------------------------------------------- fit

NO_INVENTORY = "no gpu-share inventory"


def fit_text(res: FitResult, unit_mib: Mapping[str, int], wide: bool = False) -> str:
    """Where it fits (best first), then why not elsewhere; nodes without an inventory
    are one summary line unless ``wide``."""
    if res.error:
        return f"the pod is not valid: {res.error}\n"
    parts = []
    if res.fits:
        parts.append(f"Fits on {len(res.fits)} node(s), best first:\n")
        parts.append(table(
            ["NODE", "SCORE", "DEVICES", "LARGEST FREE"],
            [[f.node, str(f.score),
              ",".join(f"{c}:{i}" for c, i, _ in f.devices) or "<none>",
              block(f.free, unit_mib.get(f.node, 1024))] for f in res.fits],
        ))
    else:
        parts.append("Fits on no node.\n")
    failed = sorted(res.failed.items())
    hidden = [] if wide else [n for n, why in failed if NO_INVENTORY in why]
    shown = [(n, why) for n, why in failed if n not in set(hidden)]
    if shown:
        parts.append("Does not fit:\n")
        parts.append(table(["NODE", "REASON"], [[n, why] for n, why in shown]))
    if hidden:
        names = ", ".join(hidden[:5]) + (", ..." if len(hidden) > 5 else "")
        parts.append(f"{len(hidden)} node(s) without a gpu-share inventory: {names}"
                     " (-o wide lists them)\n")
    return "".join(parts)


def fit_doc(res: FitResult, request: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "kind": "GpuShareFit",
        "request": dict(request),
        "error": res.error or None,
        "fits": [
            {"node": f.node, "score": f.score,
             "devices": [{"container": c, "index": i, "id": u} for c, i, u in f.devices]}
            for f in res.fits
        ],
        "failed": dict(sorted(res.failed.items())),
    }
