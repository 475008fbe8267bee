"""Where a stream's CPU went on this machine: each cluster component's, the extender's,
the bench's own and the rest, from /proc before and after the stream.

The cluster, kwok, the extender and the bench share the machine's cores, so a path's
throughput is bounded by the CPU it costs per pod across all of them; this says which
process pays it (milliseconds of CPU per bound pod) and how busy the machine was.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

# The processes of the local cluster and kwok, by their command name.
COMPONENTS = (
    "kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok",
    "kubelet", "containerd",
)
# /proc/<pid>/comm keeps the first 15 bytes of a name (kube-controller-manager's too).
BY_COMM = {name[:15]: name for name in COMPONENTS}
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    by_name: Mapping[str, float]  # CPU seconds so far, per component / "extender" / "bench"
    busy_s: float  # the machine's busy CPU seconds (user, nice, system, irq, softirq)
    steal_s: float  # time the hypervisor gave to other guests
    total_s: float  # all of it, idle included


@dataclass
class Usage:
    """What one stream cost: CPU seconds per process kind, machine cores busy."""

    seconds: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    busy_cores: float = float("nan")
    steal_pct: float = float("nan")

    def cores(self) -> dict[str, float]:
        return {k: v / self.wall_s for k, v in self.seconds.items()} if self.wall_s > 0 else {}

    def per_pod_ms(self, pods: int, idle: Usage | None = None) -> dict[str, float]:
        """CPU per bound pod; with ``idle`` (the same processes with no stream), what they
        spend anyway over the stream's time (kwok's node leases, say) taken out."""
        if not pods:
            return {}
        base = idle.cores() if idle is not None else {}
        return {
            k: max(0.0, 1000 * (v - base.get(k, 0.0) * self.wall_s) / pods)
            for k, v in self.seconds.items()
        }

    def note(self, pods: int, idle: Usage | None = None) -> str:
        per = self.per_pod_ms(pods, idle)
        parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
        spent = "above idle" if idle is not None else "in all"
        idle_cores = f" (idle {idle.busy_cores:.2f})" if idle is not None else ""
        return (f"CPU ms per bound pod, {spent}: {parts}; total {sum(per.values()):.1f}; "
                f"machine busy {self.busy_cores:.2f} cores{idle_cores}, "
                f"steal {self.steal_pct:.1f} %")


def _proc_cpu_s(stat: str) -> float:
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # the process ended while we looked
        return None


def _processes() -> Iterable[tuple[int, str, str]]:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            comm, stat = _read(d / "comm"), _read(d / "stat")
            if comm is not None and stat is not None:
                yield int(d.name), comm.strip(), stat


def sample(extender_pid: int | None = None) -> Sample:
    by_name: dict[str, float] = dict.fromkeys(COMPONENTS, 0.0)
    me = os.getpid()
    for pid, comm, stat in _processes():
        if pid == me:
            by_name["bench"] = _proc_cpu_s(stat)
        elif pid == extender_pid:
            by_name["extender"] = _proc_cpu_s(stat)
        elif comm in BY_COMM:
            by_name[BY_COMM[comm]] += _proc_cpu_s(stat)
    cpu = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = cpu
    return Sample(
        by_name, (user + nice + system + irq + softirq) / TICK, steal / TICK,
        (user + nice + system + idle + iowait + irq + softirq + steal) / TICK,
    )


def usage(before: Sample, after: Sample, wall_s: float) -> Usage:
    """The CPU between two samples; "other" is the machine's busy time no listed process
    accounts for (processes that ended between the samples, the kernel's threads)."""
    seconds = {
        k: max(0.0, v - before.by_name.get(k, 0.0)) for k, v in after.by_name.items()
    }
    seconds = {k: v for k, v in seconds.items() if v > 0}
    busy = after.busy_s - before.busy_s
    seconds["other"] = max(0.0, busy - sum(seconds.values()))
    total = after.total_s - before.total_s
    return Usage(
        seconds, wall_s,
        busy / wall_s if wall_s > 0 else float("nan"),
        100 * (after.steal_s - before.steal_s) / total if total > 0 else float("nan"),
    )
