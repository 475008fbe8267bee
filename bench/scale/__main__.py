"""Cluster scale on the real kube-scheduler with kwok nodes.

    python -m bench.scale --nodes 1213 --rates 0,40 --paths base,extender,dra

On the local cluster's API server (hack/local-up-cluster.sh; takes the cluster lock for
the whole run):

1. kwok (hack/build-kwok.sh) manages ``--nodes`` fake nodes built from the openb node
   list (1,213 = the list; more replicate it): allocatable = the trace's CPU and memory
   plus the vcuda sums, the agent's inventory annotation, a NoSchedule taint only the
   bench's pods tolerate; with a DRA path, one ResourceSlice per node (the agent's
   builder).
2. The default trace's GPU pods (sorted, shuffled with ``--seed`` as bench/replay does;
   up to 100 % of the GPU capacity or ``--pods``) are streamed, once per path and rate,
   each stream in a fresh namespace: ``--rates 0`` creates them as fast as the creators
   go (the scheduler is the bottleneck), a positive rate creates that many per second.
   Paths: ``base`` kube-scheduler alone (node-wide sums only), ``extender`` kube-scheduler
   + gpu-share-extender in its own process (the chart's scheduler configuration),
   ``dra`` kube-scheduler with DRA consumable capacity (no extender), ``dra+extender`` the
   same with the DRA pods marked for the extender and the extender in its config
   (bench/scale/paths.py); ``--dra-scheduler 1.36`` runs the DRA paths on kube-scheduler
   v1.36 (hack/cluster/build.sh k8s-136) against the same v1.35 API server, a PATH on
   that kube-scheduler binary.
3. Prints one table: throughput, creation->bound p50/p99, allocation % beside the
   simulator's for the same nodes and pods (fgd; with ``dra+extender`` also the
   first-fit simulator, that path's own), misplaced pods, the extender's
   filter/prioritize/bind p50/p99, RSS (and its view's growth at sync), CPU and API
   requests, and the machine's CPU per bound pod by process (bench/scale/cpu.py).
   ``--out FILE`` also writes the figures as JSON.

Everything created (kwok, schedulers, extender, nodes, slices, namespaces) is removed at
the end, also on errors, SIGTERM and Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import dra_stream as ds
from bench.replay import trace
from bench.scale import cluster as cl
from bench.scale import model
from bench.scale import paths as pa
from bench.scale import procs as pr
from bench.scale.paths import PATHS


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.scale")
    ap.add_argument("--nodes", type=int, default=1213, help="1,213 = the openb node list")
    ap.add_argument("--pods", type=int, default=100_000, help="at most this many (a prefix)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--max-arrived", type=float, default=100.0,
                    help="stop when the pods ask this %% of the GPU capacity")
    ap.add_argument("--min-gpus", type=int, default=0,
                    help="only the trace's pods asking at least this many whole GPUs (2: the "
                    "multi-GPU claims whose device search is the DRA allocator's hard case)")
    ap.add_argument("--paths", default="base,extender,dra", help=f"any of {PATHS}")
    ap.add_argument("--rates", default="0",
                    help="pods/s, comma-separated; 0 = as fast as it takes, seq = one at a "
                    "time (the next once the last is decided: the simulator's order)")
    ap.add_argument("--creators", type=int, default=4, help="threads creating pods")
    ap.add_argument("--lease-seconds", type=int, default=160, help="kwok node lease duration")
    ap.add_argument("--scheduler-qps", type=float, default=0,
                    help="kube-scheduler clientConnection qps (0 = its default, 50)")
    ap.add_argument("--nodes-to-score", type=int, default=0, choices=range(101),
                    metavar="0-100", help="the extender path's percentageOfNodesToScore "
                    "(the chart's scheduler.percentageOfNodesToScore: 0 = kube-scheduler's "
                    "adaptive share, the chart's default)")
    ap.add_argument("--dra-nodes-to-score", type=int, default=0, choices=range(101),
                    metavar="0-100", help="the dra path's percentageOfNodesToScore (0 = "
                    "kube-scheduler's adaptive share, as the base path: 40 %% of 1,213 nodes)")
    ap.add_argument("--seen-workload", action="store_true",
                    help="the extender's fgd aims at the mix of pods it sees (the product "
                    "default) rather than the simulator's fixed trace mix")
    ap.add_argument("--extender-src", default="",
                    help="run the extender's gpu_share package from this src/ directory "
                    "(measure a candidate fix without touching the checkout)")
    ap.add_argument("--dra-scheduler", default="",
                    help="the DRA paths' kube-scheduler: empty = the local cluster's, 1.36 = "
                    "v1.36 from hack/k8s-136 (built into the cache on first use), else the "
                    "path of a kube-scheduler binary; same config, kubeconfig and gates")
    ap.add_argument("--controller-manager-qps", type=int, default=0,
                    help="restart the local cluster's kube-controller-manager with this "
                    "--kube-api-qps (burst twice that) for the run, and as before after it "
                    "(0 = leave it alone; its default is 20: DRA claims at ~10 pods/s)")
    ap.add_argument("--stream-timeout", type=float, default=3600)
    ap.add_argument("--settle", type=float, default=30,
                    help="end a stream when nothing changed for this long")
    ap.add_argument("--idle-sample", type=float, default=20,
                    help="seconds of the machine's CPU sampled with no stream, once before "
                    "the first stream; taken out of every stream's CPU per pod (0 = none)")
    ap.add_argument("--scheduler-gogc", type=int, default=0,
                    help="GOGC of the kube-schedulers the paths start (0 = Go's default, "
                    "100)")
    ap.add_argument("--lock-timeout", type=float, default=1800)
    ap.add_argument("--out", default="", help="also write the figures here (JSON)")
    ap.add_argument("--keep-dir", default="",
                    help="the run's files (scheduler configs and logs: a SIGQUIT goroutine "
                    "dump lands in the scheduler's log) go here and stay; default a "
                    "temporary directory, removed")
    a = ap.parse_args(argv)
    bad = set(a.paths.split(",")) - set(PATHS)
    if bad or a.nodes < 1:
        ap.error(f"--paths from {PATHS}; --nodes >= 1")
    return a


# ---------------------------------------------------------------- main


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    """SIGTERM runs the same clean-up as Ctrl-C."""
    old = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    with _signals():
        return _main(a)


@dataclass
class Plan:
    """The nodes, the pods and the simulators' allocation for them (before the lock)."""

    nodes: list[Any]
    pods: list[trace.TracePod]
    load: Any  # the trace's workload mix (fgd's target)
    capacity: int
    arrived: float  # % of the GPUs the pods ask
    sims: dict[str, float] = field(default_factory=dict)  # column -> allocation %


def plan(a: argparse.Namespace, paths: Sequence[str], tag: str) -> Plan:
    """fgd's simulator for every run; with ``dra+extender`` also the first-fit one (fgd's
    node for the devices the DRA allocator takes: that path's own simulator)."""
    nodes = model.replicate(trace.load_nodes(units=model.UNITS), a.nodes, f"gss{tag}-")
    capacity = ds.capacity_milli(nodes)
    trace_pods = trace.load_pods(trace.trace_dir() / "openb_pod_list_default.csv")
    chosen = trace_pods
    if a.min_gpus > 0:
        chosen = [p for p in trace_pods if p.num_gpu >= a.min_gpus and p.gpu_milli >= 1000]
    pods = model.pods_for(chosen, a.seed, capacity, a.pods, a.max_arrived)
    load = ds.workload(trace_pods)
    arrived = 100 * sum(p.gpu_request for p in pods) / capacity
    out = Plan(nodes, pods, load, capacity, arrived)
    sims: list[tuple[str, Callable[..., list[str | None]]]] = [("simulator", ds.simulate)]
    if "dra+extender" in paths:
        sims.append(("first-fit sim", ds.simulate_first_fit))
    for column, simulate in sims:
        t0 = time.monotonic()
        out.sims[column] = ds.allocation_pct(pods, simulate(nodes, pods, load), capacity)
        cl.log(f"{column}: {out.sims[column]:.2f} % in {time.monotonic() - t0:.0f}s")
    cl.log(f"{len(nodes)} nodes, {capacity // 1000} GPUs; {len(pods)} GPU pods (seed {a.seed}) "
           f"asking {arrived:.1f} % of the GPUs")
    return out


def _main(a: argparse.Namespace) -> int:
    from testkit.harness import cluster_info, cluster_is_up

    info = cluster_info()
    if info.problem or not cluster_is_up():
        print(f"the local cluster is not usable: {info.problem or 'not up'}", file=sys.stderr)
        return 2
    paths = [p for p in PATHS if p in a.paths.split(",")]
    tag = uuid.uuid4().hex[:6]
    pl = plan(a, paths, tag)
    kwok_bin = cl.kwok_binary()
    dra_scheduler = None
    if set(paths) & set(pa.DRA_PATHS) and a.dra_scheduler:
        # Built (if it must be) before the lock is taken: a first build takes minutes.
        dra_scheduler = pr.scheduler_binary(a.dra_scheduler, Path(info.env["K8S_BIN_DIR"]))
        cl.log(f"dra paths: {pr.binary_version(dra_scheduler)} ({dra_scheduler})")
    _on_cluster(a, info.env, tag, pl, paths, kwok_bin, dra_scheduler)
    return 0


def _on_cluster(a: argparse.Namespace, cluster_env: Mapping[str, str], tag: str, pl: Plan,
                paths: Sequence[str], kwok_bin: Path, dra_scheduler: Path | None) -> None:
    """Under the cluster lock: kwok, the nodes, then each path in turn."""
    from kubernetes import client as k8s

    from gpu_share.kube.rest import make_rest_client
    from testkit.harness import cluster_lock
    from testkit.kube_admin import admin_client

    api = admin_client(cluster_env["KUBECONFIG"])
    rest = make_rest_client(cluster_env["KUBECONFIG"])
    results: list[model.PathFigures] = []
    with (
        cluster_lock(a.lock_timeout, on_wait=lambda: cl.log("waiting for the cluster lock...")),
        _workdir(a.keep_dir) as tmp,
        pr.controller_manager_qps(
            Path(cluster_env["GPU_SHARE_CLUSTER_DIR"]), a.controller_manager_qps
        ),
    ):
        env = cl.Env(api, k8s.CoreV1Api(api), k8s.CustomObjectsApi(api), rest,
                     cluster_env["KUBECONFIG"], tag, Path(tmp), Path(cluster_env["K8S_BIN_DIR"]))
        wl_file = None
        if not a.seen_workload:
            wl_file = env.workdir / "workload.json"
            wl_file.write_text(json.dumps(
                [[s.memory_units, s.cores, s.weight, s.cpu, s.host_memory] for s in pl.load.shapes]
            ))
        slices = bool(set(paths) & set(pa.DRA_PATHS))
        with (
            cl.kwok(env, kwok_bin, a.lease_seconds),
            cl.nodes_registered(env, pl.nodes, 8, slices=slices),
        ):
            cl.wait_for("kwok to make every node Ready",
                        lambda: cl.ready_nodes(env) >= len(pl.nodes), 600, every=3)
            r = pa.Run(env, a, pl.nodes, pl.pods)
            runs = {
                "base": lambda: pa.run_base(r),
                "extender": lambda: pa.run_extender(r, wl_file),
                "dra": lambda: pa.run_dra(r, dra_scheduler),
                "dra+extender": lambda: pa.run_dra(r, dra_scheduler, wl_file, with_extender=True),
            }
            for p in paths:
                cl.log(f"path {p}")
                results += runs[p]()
                # After every path: a run stopped later keeps what it measured.
                report(a, pl, results)


def _workdir(keep: str) -> contextlib.AbstractContextManager[str]:
    if not keep:
        return tempfile.TemporaryDirectory(prefix="gs-scale-")
    Path(keep).mkdir(parents=True, exist_ok=True)
    return contextlib.nullcontext(keep)


def report(a: argparse.Namespace, pl: Plan, results: list[model.PathFigures]) -> None:
    print()
    print(f"{len(pl.nodes)} kwok nodes, {pl.capacity // 1000} GPUs, {len(pl.pods)} pods "
          f"({pl.arrived:.1f} % of the GPUs asked), seed {a.seed}")
    print(model.table(results, sims=pl.sims))
    for f in results:
        for note in f.notes:
            print(f"  {f.path}: {note}")
    print(flush=True)
    if a.out:
        doc = {
            "nodes": len(pl.nodes), "gpus": pl.capacity // 1000, "pods": len(pl.pods),
            "seed": a.seed, "arrived_pct": pl.arrived,
            "sim_alloc_pct": pl.sims["simulator"],
            "sim_first_fit_pct": pl.sims.get("first-fit sim"),
            "dra_scheduler": a.dra_scheduler, "min_gpus": a.min_gpus,
            "controller_manager_qps": a.controller_manager_qps,
            "dra_nodes_to_score": a.dra_nodes_to_score,
            "nodes_to_score": a.nodes_to_score,
            "paths": [{**asdict(f), "pods_per_s": f.pods_per_s} for f in results],
        }
        Path(a.out).write_text(json.dumps(doc))


if __name__ == "__main__":
    raise SystemExit(main())
