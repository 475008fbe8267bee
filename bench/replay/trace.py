"""Loading the openb trace (Alibaba cluster-trace-gpu-v2023) into placement values.

Units: each device is split into 1000 memory units (1/1000 of that device's memory) and
1000 cores (per-mille of its SMs), so a pod's ``gpu_milli`` maps to both dimensions
exactly, without rounding (the product uses 100 core percent and 1 GiB units; the
policy is unit-agnostic). Allocation is counted in GPU-milli, as in the FGD paper.
"""

from __future__ import annotations

import csv
import functools
import os
import random
from dataclasses import dataclass
from pathlib import Path

from gpu_share.sharing.placement import (
    Demand,
    DeviceSlot,
    ModelReq,
    NodeSlots,
    PodDemand,
    label_form,
)

# The trace lives in shared/ beside the checkout (never copied into the repo).
_BESIDE_REPO = Path(__file__).resolve().parents[3] / "shared" / "traces" / "openb"
DEFAULT_TRACES = str(_BESIDE_REPO if _BESIDE_REPO.is_dir() else "/work/shared/traces/openb")
UNITS = 1000  # memory units and cores per device in the replay
GPU_MILLI = 1000


def trace_dir() -> Path:
    return Path(os.environ.get("GPU_SHARE_TRACES", DEFAULT_TRACES))


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU, capped at 1000
    gpu_spec: str  # allowed models, "|"-separated ("" = any)

    @property
    def gpu_request(self) -> int:
        """GPU-milli the pod asks for in total."""
        return self.num_gpu * self.gpu_milli

    def demand(self, units: int = UNITS, host: bool = True) -> PodDemand:
        """Our request for the pod; with ``units`` < 1000 shares round up (the real
        scheduler check uses the product's 100 per device). ``host=False``: GPU only."""
        if self.num_gpu == 0 or self.gpu_milli == 0:
            containers: tuple[Demand, ...] = ()
        elif self.num_gpu == 1 and self.gpu_milli < GPU_MILLI:
            m = -(-self.gpu_milli * units // GPU_MILLI)  # exact when units == GPU_MILLI
            containers = (Demand("main", m, m),)
        else:  # whole devices (the trace has no fractional multi-GPU pods)
            containers = (Demand("main", self.num_gpu * units, self.num_gpu * units),)
        models = model_req(self.gpu_spec)
        if not host:
            return PodDemand(containers, models=models)
        return PodDemand(containers, cpu=self.cpu_milli, host_memory=self.memory_mib, models=models)


@functools.lru_cache(maxsize=1024)
def model_req(gpu_spec: str) -> ModelReq:
    """The trace's ``gpu_spec`` ("A|B", "" = any) as a requirement."""
    return ModelReq.parse(gpu_spec)


def load_nodes(path: Path | None = None, units: int = UNITS, host: bool = True) -> list[NodeSlots]:
    """GPU nodes; ``host=False`` leaves CPU/memory unchecked."""
    path = path or trace_dir() / "openb_node_list_gpu_node.csv"
    out = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            n = int(row["gpu"])
            if n == 0:
                continue
            devices = tuple(
                DeviceSlot(f"{row['sn']}-gpu{i}", i, units, units, units, units) for i in range(n)
            )
            cpu, mem = int(row["cpu_milli"]), int(row["memory_mib"])
            out.append(
                NodeSlots(
                    row["sn"],
                    devices,
                    cpu if host else None,
                    mem if host else None,
                    label_form(row.get("model") or ""),
                    cpu_total=cpu if host else None,
                    host_memory_total=mem if host else None,
                )
            )
    return out


def load_pods(path: Path) -> list[TracePod]:
    out = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            out.append(
                TracePod(
                    row["name"],
                    int(row["cpu_milli"]),
                    int(row["memory_mib"]),
                    int(row["num_gpu"]),
                    min(int(row["gpu_milli"]), GPU_MILLI),
                    (row.get("gpu_spec") or "").strip(),
                )
            )
    return out


def trace_files() -> list[Path]:
    return sorted(trace_dir().glob("openb_pod_list_*.csv"))


def arrival_order(
    pods: list[TracePod], seed: int, capacity_milli: int, inflation: float = 1.3
) -> list[TracePod]:
    """Pods sorted by name, shuffled with ``seed``; then resampled copies (same seed's
    stream) appended until the requests reach ``inflation`` x capacity. Pods beyond that
    point are cut (the multigpu traces alone exceed it)."""
    rng = random.Random(seed)
    order = sorted(pods, key=lambda p: p.name)
    rng.shuffle(order)
    target = inflation * capacity_milli
    out: list[TracePod] = []
    total = 0
    for p in order:
        if total >= target:
            return out
        out.append(p)
        total += p.gpu_request
    i = 0
    while total < target:
        p = rng.choice(pods)
        i += 1
        out.append(
            TracePod(
                f"{p.name}-r{i}", p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec
            )
        )
        total += p.gpu_request
    return out
