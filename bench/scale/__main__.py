"""Cluster scale on the real kube-scheduler with kwok nodes.

    python -m bench.scale --nodes 1213 --rates 0,40 --paths base,extender,dra

On the local cluster's API server (hack/local-up-cluster.sh; takes the cluster lock for
the whole run):

1. kwok (hack/build-kwok.sh) manages ``--nodes`` fake nodes built from the openb node
   list (1,213 = the list; more replicate it): allocatable = the trace's CPU and memory
   plus the vcuda sums, the agent's inventory annotation, a NoSchedule taint only the
   bench's pods tolerate; with ``dra`` in the paths, one ResourceSlice per node (the
   agent's builder).
2. The default trace's GPU pods (sorted, shuffled with ``--seed`` as bench/replay does;
   up to 100 % of the GPU capacity or ``--pods``) are streamed, once per path and rate,
   each stream in a fresh namespace: ``--rates 0`` creates them as fast as the creators
   go (the scheduler is the bottleneck), a positive rate creates that many per second.
   Paths: ``base`` kube-scheduler alone (node-wide sums only), ``extender`` kube-scheduler
   + gpu-share-extender in its own process (the chart's scheduler configuration),
   ``dra`` kube-scheduler with DRA consumable capacity (no extender); ``--dra-scheduler
   1.36`` runs that path on kube-scheduler v1.36 (hack/cluster/build.sh k8s-136) against
   the same v1.35 API server, a PATH on that kube-scheduler binary.
3. Prints one table: throughput, creation->bound p50/p99, allocation % beside the
   simulator's for the same nodes and pods (fgd), misplaced pods, the extender's
   filter/prioritize/bind p50/p99, RSS (and its view's growth at sync), CPU and API
   requests. ``--out FILE`` also writes the figures as JSON.

Everything created (kwok, schedulers, extender, nodes, slices, namespaces) is removed at
the end, also on errors, SIGTERM and Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import dra_stream as ds
from bench.replay import trace
from bench.scale import cluster as cl
from bench.scale import model

KEY = b"scale-bench-decision-key-0123456789"
PATHS = ("base", "extender", "dra")


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
    ap.add_argument("--paths", default="base,extender,dra")
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
                    help="the dra path's kube-scheduler: empty = the local cluster's, 1.36 = "
                    "v1.36 from hack/k8s-136 (built into the cache on first use), else the "
                    "path of a kube-scheduler binary; same config, kubeconfig and gates")
    ap.add_argument("--controller-manager-qps", type=int, default=0,
                    help="restart the local cluster's kube-controller-manager with this "
                    "--kube-api-qps (burst twice that) for the run, and as before after it "
                    "(0 = leave it alone; its default is 20: DRA claims at ~10 pods/s)")
    ap.add_argument("--stream-timeout", type=float, default=3600)
    ap.add_argument("--settle", type=float, default=30,
                    help="end a stream when nothing changed for this long")
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- one stream


class Run:
    def __init__(self, env: cl.Env, a: argparse.Namespace, nodes: Sequence[Any],
                 pods: Sequence[trace.TracePod]) -> None:
        self.env, self.a, self.pods, self.nodes = env, a, pods, nodes
        self.names = [f"p{i:05d}" for i in range(len(pods))]
        self.by_name = dict(zip(self.names, pods, strict=True))
        self.devices = {n.name: [d.uuid for d in n.devices] for n in nodes}
        self.capacity = ds.capacity_milli(nodes)
        self.offsets = {r: model.arrival_offsets(len(pods), r) for r in self.rates}

    @property
    def rates(self) -> list[float]:
        return [model.SEQUENTIAL if r == "seq" else float(r) for r in self.a.rates.split(",")]

    def label(self, path: str, rate: float) -> str:
        return f"{path} {'seq' if rate < 0 else 'max' if rate == 0 else f'{rate:g}/s'}"

    def go(self, ns: str, bodies: Sequence[dict[str, Any]], rate: float) -> tuple[cl.Stream, float]:
        s, wall = cl.stream(
            self.env, ns, bodies, self.offsets[rate], self.a.creators,
            self.a.stream_timeout, self.a.settle,
        )
        if s.errors:
            cl.log(f"  {len(s.errors)} creates failed, e.g. {s.errors[0]}")
        return s, wall

    def figures(self, label: str, s: cl.Stream, wall: float, decisions: bool) -> model.PathFigures:
        bound = sorted(s.bound.items(), key=lambda kv: kv[1][1])
        lat = [t - s.created[n] for n, (_, t) in bound if n in s.created]
        final = {n: p for n, p in s.pods.items() if (p.get("spec") or {}).get("nodeName")}
        milli = sum(self.by_name[n].gpu_request for n in final)
        placed = []
        for n, (node, _) in bound:
            p = final.get(n)
            if p is None:
                continue
            devs = self._decision(p, node) if decisions else None
            placed.append(model.BoundPod(node, self.by_name[n], devs))
        return model.PathFigures(
            path=label,
            pods=len(self.pods),
            bound=len(final),
            unschedulable=len(self.pods) - len(final),
            wall_s=wall,
            latencies_s=lat,
            alloc_pct=model.allocation_pct(milli, self.capacity),
            misplaced=model.misplaced(placed, self.devices),
        )

    @staticmethod
    def _decision(pod: dict[str, Any], node: str) -> tuple[str, ...] | None:
        from gpu_share.sharing.decision import DecisionError, decision_key, verify_binding

        notes = (pod.get("metadata") or {}).get("annotations") or {}
        text = notes.get(decision_key("vendor.com"))
        if not text:
            return ()  # bound without a decision: counts as misplaced
        try:
            d = verify_binding(text, KEY, str(pod["metadata"]["uid"]), node)
        except DecisionError:
            return ()
        return tuple(x for c in d.containers.values() for x in c.devices)


def _extender_figures(f: model.PathFigures, before: dict[str, Any], after: dict[str, Any],
                      cpu0: float, cpu1: float) -> None:
    verbs = (("filter", "filter_ms"), ("prioritize", "prioritize_ms"), ("bind", "bind_ms"))
    for verb, attr in verbs:
        n0 = len(before["durations_ms"][verb])
        setattr(f, attr, list(after["durations_ms"][verb][n0:]))
    f.filter_nodes = list(after["filter_names"][len(before["filter_names"]):])
    f.api_requests = sum(after["api"].values()) - sum(before["api"].values())
    f.rss_mib = float(after["rss_mib"])
    marks = after.get("marks") or {}
    f.view_mib = float(marks.get("rss_synced_mib", 0)) - float(marks.get("rss_before_sync_mib", 0))
    f.cpu_s = cpu1 - cpu0
    kinds = {k: v - before["api"].get(k, 0) for k, v in after["api"].items()}
    f.notes.append("api by kind: " + json.dumps({k: v for k, v in kinds.items() if v}))


def run_base(r: Run) -> list[model.PathFigures]:
    env, out = r.env, []
    name = f"gs-scale-base-{env.tag}"
    with cl.kube_scheduler(env, name, cl.scheduler_config(env, name, None, r.a.scheduler_qps)):
        for rate in r.rates:
            with cl.namespace(env, f"gs-scale-{env.tag}-base-{int(rate) % 1000}") as ns:
                bodies = [model.vcuda_pod(n, p, name, env.tag) for n, p in r.by_name.items()]
                s, wall = r.go(ns, bodies, rate)
                out.append(r.figures(r.label("base", rate), s, wall, decisions=False))
                _progress(out[-1])
    return out


def run_extender(r: Run, workload_file: Path | None) -> list[model.PathFigures]:
    env, out = r.env, []
    name = f"gs-scale-ext-{env.tag}"
    port = free_port()
    src = Path(r.a.extender_src) if r.a.extender_src else None
    with cl.extender(env, port, KEY, workload_file, src) as ext:
        cfg = cl.scheduler_config(env, name, port, r.a.scheduler_qps, r.a.nodes_to_score)
        with cl.kube_scheduler(env, name, cfg):
            for rate in r.rates:
                with cl.namespace(env, f"gs-scale-{env.tag}-ext-{int(rate) % 1000}") as ns:
                    bodies = [model.vcuda_pod(n, p, name, env.tag) for n, p in r.by_name.items()]
                    before, cpu0 = ext.stats(), ext.cpu_s()
                    s, wall = r.go(ns, bodies, rate)
                    after, cpu1 = ext.stats(), ext.cpu_s()
                    f = r.figures(r.label("extender", rate), s, wall, decisions=True)
                    _extender_figures(f, before, after, cpu0, cpu1)
                    out.append(f)
                    _progress(f)
                time.sleep(2)  # the view sees the deletions before the next stream
    return out


def run_dra(r: Run, scheduler: Path | None = None) -> list[model.PathFigures]:
    env, out = r.env, []
    version = cl.binary_version(scheduler or env.k8s_bin / "kube-scheduler")
    name = f"gs-scale-dra-{env.tag}"
    klass = f"gs-scale-{env.tag}"
    env.custom.create_cluster_custom_object(
        "resource.k8s.io", "v1", "deviceclasses", ds.device_class(klass)
    )
    settings = ds.translation_settings(klass)
    try:
        cfg = cl.scheduler_config(env, name, None, r.a.scheduler_qps)
        if r.a.dra_nodes_to_score:
            cfg["percentageOfNodesToScore"] = r.a.dra_nodes_to_score
        with cl.kube_scheduler(env, name, cfg, gates="DRAConsumableCapacity=true",
                               binary=scheduler):
            for rate in r.rates:
                with cl.namespace(env, f"gs-scale-{env.tag}-dra-{int(rate) % 1000}") as ns:
                    bodies, templates = [], {}
                    for n, p in r.by_name.items():
                        body, t = ds.dra_pod(model.vcuda_pod(n, p, name, env.tag), ns, settings)
                        bodies.append(body)
                        templates.update({tb["metadata"]["name"]: tb for tb in t.templates})
                    for tb in templates.values():
                        env.custom.create_namespaced_custom_object(
                            "resource.k8s.io", "v1", ns, "resourceclaimtemplates", tb
                        )
                    s, wall = r.go(ns, bodies, rate)
                    f = r.figures(r.label("dra", rate), s, wall, decisions=False)
                    claims = env.custom.list_namespaced_custom_object(
                        "resource.k8s.io", "v1", ns, "resourceclaims"
                    )["items"]
                    # DRA's own device accounting replaces the best-fit guess.
                    f.misplaced = ds.claim_use(claims).devices_over
                    f.notes.append("misplaced = devices over capacity in the claims")
                    f.notes.append(claim_rate(claims))
                    bound_on = {
                        n: str(p["spec"]["nodeName"]) for n, p in s.pods.items()
                        if (p.get("spec") or {}).get("nodeName")
                    }
                    fit = model.unbound_that_fit(
                        r.nodes, r.by_name, bound_on, model.device_use(claims)
                    )
                    f.unbound_fit = len(fit)
                    f.notes.append(
                        f"{len(fit)} unbound pods would fit on a node at the end"
                        + (f", e.g. {', '.join(fit[:5])}" if fit else "")
                        + f"; {len(s.unschedulable)} were refused as unschedulable"
                    )
                    f.notes.append(f"kube-scheduler: {version}")
                    out.append(f)
                    _progress(f)
    finally:
        with contextlib.suppress(Exception):
            env.custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", klass)
    return out


def claim_rate(claims: Sequence[dict[str, Any]]) -> str:
    """How fast kube-controller-manager made the claims from their templates (two writes
    per pod, the claim and the pod's status, on a client of 20 QPS by default)."""
    stamps = sorted(
        time.mktime(time.strptime(c["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
        for c in claims
    )
    if len(stamps) < 2 or stamps[-1] <= stamps[0]:
        return f"{len(stamps)} claims made"
    return (f"{len(stamps)} claims made by kube-controller-manager in "
            f"{stamps[-1] - stamps[0]:.0f} s: {(len(stamps) - 1) / (stamps[-1] - stamps[0]):.1f}/s")


def _progress(f: model.PathFigures) -> None:
    cl.log(f"  {f.path}: {f.bound}/{f.pods} bound, {f.pods_per_s:.1f} pods/s, "
           f"allocation {f.alloc_pct:.2f} %, misplaced {f.misplaced}, {f.wall_s:.0f} s")


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


def _main(a: argparse.Namespace) -> int:
    from kubernetes import client as k8s

    from gpu_share.kube.rest import make_rest_client
    from testkit.harness import cluster_info, cluster_is_up, cluster_lock
    from testkit.kube_admin import admin_client

    info = cluster_info()
    if info.problem or not cluster_is_up():
        print(f"the local cluster is not usable: {info.problem or 'not up'}", file=sys.stderr)
        return 2
    paths = [p for p in PATHS if p in a.paths.split(",")]
    tag = uuid.uuid4().hex[:6]
    nodes = model.replicate(trace.load_nodes(units=model.UNITS), a.nodes, f"gss{tag}-")
    capacity = ds.capacity_milli(nodes)
    trace_pods = trace.load_pods(trace.trace_dir() / "openb_pod_list_default.csv")
    chosen = trace_pods
    if a.min_gpus > 0:
        chosen = [p for p in trace_pods if p.num_gpu >= a.min_gpus and p.gpu_milli >= 1000]
    pods = model.pods_for(chosen, a.seed, capacity, a.pods, a.max_arrived)
    load = ds.workload(trace_pods)
    t0 = time.monotonic()
    sim = ds.simulate(nodes, pods, load)
    sim_alloc = ds.allocation_pct(pods, sim, capacity)
    arrived = 100 * sum(p.gpu_request for p in pods) / capacity
    cl.log(f"{len(nodes)} nodes, {capacity // 1000} GPUs; {len(pods)} GPU pods (seed {a.seed}) "
           f"asking {arrived:.1f} % of the GPUs; simulator (fgd) {sim_alloc:.2f} % "
           f"in {time.monotonic() - t0:.0f}s")
    kwok_bin = cl.kwok_binary()
    dra_scheduler = None
    if "dra" in paths and a.dra_scheduler:
        # Built (if it must be) before the lock is taken: a first build takes minutes.
        dra_scheduler = cl.scheduler_binary(a.dra_scheduler, Path(info.env["K8S_BIN_DIR"]))
        cl.log(f"dra path: {cl.binary_version(dra_scheduler)} ({dra_scheduler})")
    api = admin_client(info.env["KUBECONFIG"])
    rest = make_rest_client(info.env["KUBECONFIG"])
    results: list[model.PathFigures] = []
    with (
        cluster_lock(a.lock_timeout, on_wait=lambda: cl.log("waiting for the cluster lock...")),
        _workdir(a.keep_dir) as tmp,
        cl.controller_manager_qps(
            Path(info.env["GPU_SHARE_CLUSTER_DIR"]), a.controller_manager_qps
        ),
    ):
        env = cl.Env(api, k8s.CoreV1Api(api), k8s.CustomObjectsApi(api), rest,
                     info.env["KUBECONFIG"],
                     tag, Path(tmp), Path(info.env["K8S_BIN_DIR"]))
        wl_file = None
        if not a.seen_workload:
            wl_file = env.workdir / "workload.json"
            wl_file.write_text(json.dumps(
                [[s.memory_units, s.cores, s.weight, s.cpu, s.host_memory] for s in load.shapes]
            ))
        with (
            cl.kwok(env, kwok_bin, a.lease_seconds),
            cl.nodes_registered(env, nodes, 8, slices="dra" in paths),
        ):
            cl.wait_for("kwok to make every node Ready", lambda: cl.ready_nodes(env) >= len(nodes),
                        600, every=3)
            r = Run(env, a, nodes, pods)
            for p in paths:
                cl.log(f"path {p}")
                if p == "base":
                    results += run_base(r)
                elif p == "extender":
                    results += run_extender(r, wl_file)
                else:
                    results += run_dra(r, dra_scheduler)
                # After every path: a run stopped later keeps what it measured.
                report(a, len(nodes), capacity, pods, arrived, sim_alloc, results)
    return 0


def _workdir(keep: str) -> contextlib.AbstractContextManager[str]:
    if not keep:
        return tempfile.TemporaryDirectory(prefix="gs-scale-")
    Path(keep).mkdir(parents=True, exist_ok=True)
    return contextlib.nullcontext(keep)


def report(a: argparse.Namespace, n_nodes: int, capacity: int, pods: Sequence[Any],
           arrived: float, sim_alloc: float, results: list[model.PathFigures]) -> None:
    print()
    print(f"{n_nodes} kwok nodes, {capacity // 1000} GPUs, {len(pods)} pods "
          f"({arrived:.1f} % of the GPUs asked), seed {a.seed}")
    print(model.table(results, sim_alloc))
    for f in results:
        for note in f.notes:
            print(f"  {f.path}: {note}")
    print(flush=True)
    if a.out:
        doc = {
            "nodes": n_nodes, "gpus": capacity // 1000, "pods": len(pods), "seed": a.seed,
            "arrived_pct": arrived, "sim_alloc_pct": sim_alloc,
            "dra_scheduler": a.dra_scheduler, "min_gpus": a.min_gpus,
            "controller_manager_qps": a.controller_manager_qps,
            "dra_nodes_to_score": a.dra_nodes_to_score,
            "paths": [{**asdict(f), "pods_per_s": f.pods_per_s} for f in results],
        }
        Path(a.out).write_text(json.dumps(doc))


if __name__ == "__main__":
    raise SystemExit(main())
