"""Bounded soak of the node agent on the local cluster (run by hand, not in CI).

Hours of a busy node compressed into minutes: pods of mixed shapes are created and
deleted continuously, the agent pod is deleted (DaemonSet replaces it) and the kubelet is
restarted periodically; the agent process's RSS, thread count and open fds are read from
``/proc/<pid>`` on the host every ``--sample-every`` seconds into a CSV. At the end the
soak pods are deleted and the e2e audit runs (testkit/e2e.py: nothing
over-committed, PodResources = ledger = annotations = inventory).

    sudo .venv/bin/python -m bench.soak --minutes 30             # the documented run
    sudo .venv/bin/python -m bench.soak --minutes 5 --csv /tmp/soak.csv

Takes the cluster lock (/tmp/gpu-share-cluster.lock) for the whole run; brings the
cluster up, builds and imports the image and installs the chart (dummy backend) when
missing, and uninstalls what it installed at the end. Bounded: ``--minutes`` (at most
240) and ``--max-pods`` pod creations. See docs/performance.md, "Soak".
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NS = "gpu-share-soak"
FIELDS = (
    "t_s",
    "pid",
    "rss_kib",
    "threads",
    "fds",
    "running",
    "created",
    "refused",
    "agent_restarts",
    "kubelet_restarts",
)
# (memory units, cores) of the churned pods: memory-only, cores-only and both.
SHAPES = ((1, 0), (2, 0), (4, 0), (0, 10), (0, 25), (1, 10), (2, 20), (3, 30), (4, 50))


# ---------------------------------------------------------------------- pure parts (tested)


@dataclass(frozen=True)
class Sample:
    t_s: float
    pid: int
    rss_kib: int
    threads: int
    fds: int


def proc_figures(status_text: str) -> tuple[int, int]:
    """(VmRSS KiB, Threads) from the text of /proc/<pid>/status."""
    rss = threads = -1
    for line in status_text.splitlines():
        key, _, value = line.partition(":")
        if key == "VmRSS":
            rss = int(value.split()[0])
        elif key == "Threads":
            threads = int(value.split()[0])
    if rss < 0 or threads < 0:
        raise ValueError("no VmRSS/Threads in /proc status")
    return rss, threads


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per hour; 0 with < 2 points."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mx) * (v - my) for t, v in points) / var * 3600.0


@dataclass
class Segment:
    """The samples of one agent process (a restart starts a new segment)."""

    pid: int
    samples: list[Sample] = field(default_factory=list)

    def figures(self, name: str) -> dict[str, float]:
        vals = [float(getattr(s, name)) for s in self.samples]
        pts = [(s.t_s, float(getattr(s, name))) for s in self.samples]
        # The first minutes of a process are warm-up (imports, caches, first pods): a
        # leak shows as growth that goes on in the second half.
        mid = (pts[0][0] + pts[-1][0]) / 2
        return {
            "start": vals[0],
            "end": vals[-1],
            "max": max(vals),
            "slope_per_h": slope_per_hour(pts),
            "late_slope_per_h": slope_per_hour([pt for pt in pts if pt[0] >= mid]),
        }


def segments(samples: Sequence[Sample]) -> list[Segment]:
    out: list[Segment] = []
    for s in samples:
        if not out or out[-1].pid != s.pid:
            out.append(Segment(s.pid))
        out[-1].samples.append(s)
    return out


def summary(samples: Sequence[Sample]) -> list[str]:
    """Lines: per agent process, start/end/max and slope of RSS, threads and fds."""
    lines = []
    for seg in segments(samples):
        span = seg.samples[-1].t_s - seg.samples[0].t_s
        lines.append(f"agent pid {seg.pid}: {len(seg.samples)} samples over {span:.0f} s")
        for name, unit in (("rss_kib", "KiB"), ("threads", ""), ("fds", "")):
            f = seg.figures(name)
            lines.append(
                f"  {name:8} start {f['start']:.0f} end {f['end']:.0f} max {f['max']:.0f}"
                f" slope {f['slope_per_h']:+.0f}{unit}/h"
                f" (second half {f['late_slope_per_h']:+.0f}{unit}/h)"
            )
    return lines


# ---------------------------------------------------------------------- the run


def _log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _sh(*args: str, timeout: float = 900) -> str:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def _prepare() -> tuple[Any, bool]:
    """Cluster up, image built and imported, chart installed; (Kube, installed_here)."""
    from testkit.e2e import Kube
    from testkit.harness import BUILD_SCRIPT, CLUSTER_SCRIPT, cluster_info, helm_path

    _sh("bash", str(CLUSTER_SCRIPT), "up", timeout=80 * 60)
    _sh("bash", str(BUILD_SCRIPT), timeout=40 * 60)  # builds if needed, imports
    kube = Kube(env=cluster_info().env, helm_bin=helm_path(3))
    kube.ensure_agent_namespace()
    installed_here = not kube.installed()
    if installed_here:
        kube.install()
    kube.wait_agent_serving()
    return kube, installed_here


@dataclass
class Churn:
    rng: random.Random
    created: int = 0
    refused: int = 0
    live: list[str] = field(default_factory=list)


def _churn_step(kube: Any, churn: Churn, target: int, max_pods: int) -> None:
    """Delete finished/refused pods and a few of the oldest, create up to ``target``."""
    from testkit.e2e import container, pod

    pods = {p["metadata"]["name"]: p for p in kube.pods(NS)}
    phases = {n: p["status"].get("phase") for n, p in pods.items()}
    gone = [n for n in churn.live if phases.get(n) in ("Failed", "Succeeded", None)]
    for n in gone:
        if phases.get(n) == "Failed":
            churn.refused += 1
            why = pods[n]["status"].get("message") or pods[n]["status"].get("reason") or "?"
            _log(f"{n} refused: {why[:200]}")
    running = [n for n in churn.live if phases.get(n) == "Running"]
    victims = gone + running[: churn.rng.randint(1, 3)]
    if victims:
        kube.kubectl(
            "-n", NS, "delete", "pod", "--wait=false", "--ignore-not-found", *victims, check=False
        )
        churn.live = [n for n in churn.live if n not in victims]
    new: list[dict[str, Any]] = []
    while len(churn.live) + len(new) < target and churn.created < max_pods:
        m, c = churn.rng.choice(SHAPES)
        name = f"s-{churn.created}"
        churn.created += 1
        new.append(pod(name, NS, [container("main", m, c)]))
    if new:
        kube.apply(new)
        churn.live += [p["metadata"]["name"] for p in new]


def _sample(kube: Any, pid: int | None, t0: float) -> tuple[Sample | None, int | None]:
    from testkit.e2e import agent_host_pid

    for _ in range(2):
        try:
            if pid is None:
                pid = agent_host_pid(kube)
            rss, threads = proc_figures(Path(f"/proc/{pid}/status").read_text())
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            return Sample(round(time.monotonic() - t0, 1), pid, rss, threads, fds), pid
        except (OSError, AssertionError, ValueError):
            pid = None  # restarted (or restarting): look it up again
    return None, None


def _restart_agent(kube: Any) -> None:
    old = kube.ready_agent()
    if old is None:
        return
    kube.replace_agent_pod(old, 180)


def run(args: argparse.Namespace) -> int:
    from testkit.e2e import assert_consistent
    from testkit.harness import acquire_lock, cluster_cmd, release_lock, wait_until

    try:
        acquire_lock(args.lock_timeout, on_wait=lambda: _log("waiting for the cluster lock"))
    except TimeoutError as exc:
        raise SystemExit(str(exc)) from None
    kube, installed_here = _prepare()
    kube.create_namespace(NS)
    churn = Churn(random.Random(args.seed))
    samples: list[Sample] = []
    restarts = {"agent": 0, "kubelet": 0}
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    next_sample = next_agent = next_kubelet = t0
    next_agent += args.agent_restart_every
    next_kubelet += args.kubelet_restart_every
    pid: int | None = None
    rc = 0

    def row(s: Sample, running: int) -> tuple[object, ...]:
        """The CSV row (FIELDS) of sample ``s`` with ``running`` soak pods."""
        return (
            s.t_s,
            s.pid,
            s.rss_kib,
            s.threads,
            s.fds,
            running,
            churn.created,
            churn.refused,
            restarts["agent"],
            restarts["kubelet"],
        )

    with open(args.csv, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(FIELDS)
        try:
            while time.monotonic() < end:
                now = time.monotonic()
                if now >= next_agent:
                    _log("deleting the agent pod")
                    _restart_agent(kube)
                    restarts["agent"] += 1
                    next_agent = time.monotonic() + args.agent_restart_every
                    pid = None
                elif now >= next_kubelet:
                    _log("restarting the kubelet")
                    cluster_cmd("restart-kubelet", timeout=300)
                    restarts["kubelet"] += 1
                    next_kubelet = time.monotonic() + args.kubelet_restart_every
                _churn_step(kube, churn, args.pods, args.max_pods)
                if time.monotonic() >= next_sample:
                    s, pid = _sample(kube, pid, t0)
                    next_sample = time.monotonic() + args.sample_every
                    if s is not None:
                        samples.append(s)
                        running = sum(
                            1 for p in kube.pods(NS) if p["status"].get("phase") == "Running"
                        )
                        out.writerow(row(s, running))
                        fh.flush()
                        _log(
                            f"rss {s.rss_kib} KiB threads {s.threads} fds {s.fds} "
                            f"running {running} created {churn.created}"
                        )
                time.sleep(args.tick)
        finally:
            _log("deleting the soak pods; audit")
            kube.kubectl(
                "-n",
                NS,
                "delete",
                "pod",
                "--all",
                "--wait=true",
                "--timeout=240s",
                check=False,
                timeout=270,
            )
            wait_until("soak pods gone", lambda: not kube.pods(NS), 240, interval=2)
            s, pid = _sample(kube, None, t0)
            if s is not None:
                samples.append(s)
                out.writerow(row(s, 0))
    try:
        assert_consistent(kube, timeout=120)
        audit = "clean"
    except AssertionError as exc:
        audit = f"MISMATCHES\n{exc}"
        rc = 1
    kube.delete_namespace(NS)
    if installed_here:
        kube.uninstall()
    release_lock()
    print(
        f"soak: {(time.monotonic() - t0) / 60:.1f} min, {churn.created} pods created, "
        f"{churn.refused} refused at admission, {restarts['agent']} agent restarts, "
        f"{restarts['kubelet']} kubelet restarts; CSV {args.csv}"
    )
    print("\n".join(summary(samples)))
    print(f"audit: {audit}")
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--minutes", type=float, default=30.0, help="duration (<= 240)")
    ap.add_argument("--pods", type=int, default=12, help="soak pods kept alive (<= 40)")
    ap.add_argument("--max-pods", type=int, default=5000, help="pod creations at most")
    ap.add_argument("--tick", type=float, default=2.0, help="seconds between churn steps")
    ap.add_argument("--sample-every", type=float, default=10.0)
    ap.add_argument("--agent-restart-every", type=float, default=600.0)
    ap.add_argument("--kubelet-restart-every", type=float, default=420.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--csv", default="/tmp/gpu-share-soak.csv")
    ap.add_argument("--lock-timeout", type=float, default=45 * 60)
    args = ap.parse_args(argv)
    if not 0 < args.minutes <= 240 or not 0 < args.pods <= 40 or args.tick < 0.5:
        ap.error("--minutes in (0, 240], --pods in (0, 40], --tick >= 0.5")
    if os.geteuid() != 0:
        ap.error("run as root (the local cluster and /proc of the agent need it)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
