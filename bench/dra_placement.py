"""DRA on the real kube-scheduler vs the extender, on one sampled openb stream.

    python -m bench.dra_placement --nodes 60 --pods 400 --seed 42

On the local cluster's API server (takes the cluster lock; needs the cluster up):

1. registers ``--nodes`` openb GPU nodes as Node objects (no kubelet; allocatable = the
   trace's CPU and memory plus the vcuda sums, the inventory annotation for the
   extender, Ready; the pods tolerate every taint, as tests/extender does) and one
   ResourceSlice per node built by the agent's own builder (``sharing/dra/slices.py``:
   100 memory units of 1 GiB and 100 cores per device), plus a DeviceClass;
2. DRA path: a second kube-scheduler (its own schedulerName, default plugins,
   ``DRAConsumableCapacity`` on, NO extender) places the stream, each pod rewritten by
   the webhook's translation (one claim per pod from a ``gpu-share-m<u>-c<c>`` template);
3. extender path: ``testkit.scheduler.extender_and_scheduler`` (fgd,
   score plugins off) places the same stream as vcuda pods over the same nodes.

Each path runs the stream twice, in fresh namespaces: ``seq`` creates a pod, waits until
it is bound or unschedulable, then the next (the arrival order the simulator sees:
allocation); ``burst`` creates them all at once (throughput: decided pods / seconds from
the first create to the last decision; creation->bound latency per pod, seen by a watch).
The simulator's figure for the same nodes and prefix (fgd, as the extender) is printed
beside them. Everything created is deleted at the end (also on errors and Ctrl-C).

Bounded: ``--pod-timeout`` per pod, ``--phase-timeout`` per stream; the scheduler
binary (``--scheduler``; default the cluster's) must not be newer than the API server
(version skew policy). kube-scheduler 1.34.x has kubernetes#133705 (consumable capacity
checks the slice's first device for every allocation): its DRA figures are wrong; the
table says which version ran.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from bench import dra_stream as ds
from bench.replay import trace
from testkit.process import stop_process

GROUP, VERSION = "resource.k8s.io", "v1"
KEY = b"dra-placement-bench-key-0123456789"


# ---------------------------------------------------------------- versions


def binary_version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    m = re.search(r"v\d+\.\d+\.\d+\S*", out.stdout + out.stderr)
    if not m:
        raise RuntimeError(f"{binary} --version said {out.stdout!r}")
    return m.group(0)


def minor(version: str) -> tuple[int, int]:
    m = re.match(r"v?(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"not a version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def skew_problem(scheduler: str, apiserver: str) -> str | None:
    """kube-scheduler may be as new as the API server or one minor older, no newer."""
    s, a = minor(scheduler), minor(apiserver)
    if s > a:
        return f"kube-scheduler {scheduler} is newer than the API server {apiserver}"
    if s[0] != a[0] or a[1] - s[1] > 1:
        return f"kube-scheduler {scheduler} is more than one minor older than {apiserver}"
    return None


def has_issue_133705(scheduler: str) -> bool:
    return minor(scheduler) < (1, 35)


# ---------------------------------------------------------------- watching pods


class PodTracker:
    """A watch on one namespace: when each pod was first seen bound or unschedulable
    (monotonic clock). An unschedulable verdict given while the pod's claims did not
    exist yet is not final (the scheduler retries once they do)."""

    def __init__(self, core: Any, namespace: str) -> None:
        self.core, self.ns = core, namespace
        self.cond = threading.Condition()
        self.bound: dict[str, tuple[str, float]] = {}
        self.unschedulable: dict[str, float] = {}
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PodTracker:
        from kubernetes import watch

        self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                for ev in self._watch.stream(
                    self.core.list_namespaced_pod, self.ns, timeout_seconds=60
                ):
                    self._seen(ev["object"])
                    if self._stop.is_set():
                        return

    def _seen(self, pod: Any) -> None:
        now = time.monotonic()
        name = pod.metadata.name
        with self.cond:
            if pod.spec.node_name and name not in self.bound:
                self.bound[name] = (str(pod.spec.node_name), now)
                self.unschedulable.pop(name, None)
            elif name not in self.bound and name not in self.unschedulable and _refused(pod):
                self.unschedulable[name] = now
            self.cond.notify_all()

    def decided(self, name: str) -> bool:
        return name in self.bound or name in self.unschedulable

    def wait(self, timeout: float) -> None:
        with self.cond:
            self.cond.wait(timeout)


def _refused(pod: Any) -> bool:
    claims = {c.name for c in pod.spec.resource_claims or []}
    have = {s.name for s in pod.status.resource_claim_statuses or [] if s.resource_claim_name}
    if claims - have:
        return False  # the scheduler is waiting for the claims' creation
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in pod.status.conditions or []
    )


# ---------------------------------------------------------------- one stream


@dataclass
class StreamResult:
    nodes: list[str | None]
    outcome: list[str]
    latencies_s: list[float]
    wall_s: float
    reasons: dict[str, int]  # the scheduler's message for the pods left unbound


def stream(
    core: Any,
    ns: str,
    bodies: Sequence[dict[str, Any]],
    window: int,
    pod_timeout: float,
    phase_timeout: float,
) -> StreamResult:
    """Creates the pods, at most ``window`` undecided at a time; bounded by both timeouts."""
    names = [b["metadata"]["name"] for b in bodies]
    created: dict[str, float] = {}
    pending: list[str] = []
    given_up: set[str] = set()
    deadline = time.monotonic() + phase_timeout
    with PodTracker(core, ns) as tr:
        i = 0
        last = time.monotonic()
        while (i < len(bodies) or pending) and time.monotonic() < deadline:
            while i < len(bodies) and len(pending) < window:
                created[names[i]] = time.monotonic()
                core.create_namespaced_pod(ns, bodies[i])
                pending.append(names[i])
                i += 1
            tr.wait(0.2)
            now = time.monotonic()
            for n in list(pending):
                if tr.decided(n):
                    pending.remove(n)
                    last = now
                elif now - created[n] > pod_timeout:
                    pending.remove(n)
                    given_up.add(n)
        first = min(created.values(), default=last)
        # The final placement is what the API server says now.
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(ns).items}
        nodes: list[str | None] = []
        outcome: list[str] = []
        lat: list[float] = []
        for n in names:
            node = pods[n].spec.node_name if n in pods else None
            nodes.append(str(node) if node else None)
            if node:
                outcome.append("bound")
                if n in tr.bound:
                    lat.append(tr.bound[n][1] - created[n])
            elif n in tr.unschedulable and n not in given_up:
                outcome.append("unschedulable")
            else:
                outcome.append("undecided")
        ends = [t for _, t in tr.bound.values()] + list(tr.unschedulable.values())
        wall = (max(ends) if ends else last) - first
    reasons: dict[str, int] = {}
    for n in names:
        if n in pods and not pods[n].spec.node_name:
            msg = _message(pods[n])
            reasons[msg] = reasons.get(msg, 0) + 1
    return StreamResult(nodes, outcome, lat, wall, reasons)


def _message(pod: Any) -> str:
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False":
            return re.sub(r"\d+/\d+ nodes are available: ", "", str(c.message or c.reason))[:160]
    return "no PodScheduled condition"


# ---------------------------------------------------------------- the cluster


@dataclass
class Env:
    api: Any
    core: Any
    custom: Any
    kubeconfig: str
    tag: str
    workdir: Path


def _wait(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


@contextlib.contextmanager
def registered(env: Env, nodes: Sequence[Any], class_name: str) -> Iterator[None]:
    """The Node objects, their ResourceSlices and the DeviceClass; all deleted after."""
    created: list[str] = []
    selector = ",".join(f"{k}={v}" for k, v in ds.node_labels(env.tag).items())
    try:
        env.custom.create_cluster_custom_object(
            GROUP, VERSION, "deviceclasses", ds.device_class(class_name)
        )
        for n in nodes:
            env.core.create_node(
                {
                    "metadata": {
                        "name": n.name,
                        "labels": ds.node_labels(env.tag),
                        "annotations": {
                            ds.INVENTORY_KEY: ds.inventory_annotation(n)
                        },
                    }
                }
            )
            created.append(n.name)
            status = ds.node_status(n)
            status["conditions"] = [_ready()]
            env.core.patch_node_status(n.name, {"status": status})
            env.custom.create_cluster_custom_object(
                GROUP, VERSION, "resourceslices", ds.resource_slice(n, env.tag)
            )
        yield
    finally:
        with contextlib.suppress(Exception):
            env.custom.delete_collection_cluster_custom_object(
                GROUP, VERSION, "resourceslices", label_selector=selector
            )
        for name in created:
            with contextlib.suppress(Exception):
                env.core.delete_node(name)
        with contextlib.suppress(Exception):
            env.custom.delete_cluster_custom_object(GROUP, VERSION, "deviceclasses", class_name)


def _ready() -> dict[str, str]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "registered by bench.dra_placement (no kubelet)",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


@contextlib.contextmanager
def namespace(env: Env, name: str) -> Iterator[str]:
    env.core.create_namespace({"metadata": {"name": name, "labels": {"gs-dra-bench": env.tag}}})
    try:
        yield name
    finally:
        drop_namespace(env, name)


def drop_namespace(env: Env, ns: str, timeout: float = 90) -> None:
    """Pods first (no kubelet: only a zero grace period removes them at once), then the
    claims must be gone (deallocated) before the next stream counts free capacity."""
    with contextlib.suppress(Exception):
        env.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)

    def empty() -> bool:
        pods = env.core.list_namespaced_pod(ns).items
        claims = env.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "resourceclaims")
        return not pods and not claims.get("items")

    try:
        _wait(f"pods and claims of {ns} gone", empty, timeout)
    finally:
        with contextlib.suppress(Exception):
            env.core.delete_namespace(ns, grace_period_seconds=0)


def _start_line(log: Path) -> bool:
    return log.exists() and "Starting Kubernetes Scheduler" in log.read_text(errors="replace")


def wait_started(proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"kube-scheduler exited:\n{log.read_text()[-3000:]}")
        return _start_line(log)

    _wait("kube-scheduler to start", up, timeout)
    time.sleep(2)  # its informers sync after the start line


@contextlib.contextmanager
def dra_scheduler(env: Env, binary: Path, name: str) -> Iterator[subprocess.Popen[bytes]]:
    """kube-scheduler with its default plugins (DynamicResources among them), no extender."""
    cfg = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": env.kubeconfig},
        "leaderElection": {"leaderElect": False},
        "percentageOfNodesToScore": 100,
        "profiles": [{"schedulerName": name}],
    }
    conf = env.workdir / "dra-sched.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    log_path = env.workdir / "dra-sched.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--config={conf}",
                "--secure-port=0",
                "--v=1",
                "--feature-gates=DRAConsumableCapacity=true",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": env.kubeconfig},
        )
    try:
        wait_started(proc, log_path)
        yield proc
    finally:
        stop_process(proc, grace_s=10, kill_wait_s=10)


# ---------------------------------------------------------------- the two paths


@dataclass
class Options:
    pod_timeout: float
    phase_timeout: float
    modes: tuple[str, ...]


def _window(mode: str, n: int) -> int:
    return 1 if mode == "seq" else max(1, n)


def _pod_timeout(mode: str, o: Options) -> float:
    # A burst queues every pod at once (the controllers' and scheduler's client rate
    # limits pace them): only the phase bound applies.
    return o.pod_timeout if mode == "seq" else o.phase_timeout


def run_dra(
    env: Env, binary: Path, pods: Sequence[trace.TracePod], class_name: str, o: Options
) -> dict[str, ds.RunFigures]:
    sched = f"gs-dra-{env.tag}"
    with dra_scheduler(env, binary, sched) as proc:
        return _dra_streams(env, pods, ds.translation_settings(class_name), sched, "DRA",
                            o, proc)


def run_dra_extender(
    env: Env, binary: Path, pods: Sequence[trace.TracePod], class_name: str, load: Any,
    o: Options, detail: dict[str, Any] | None = None,
) -> dict[str, ds.RunFigures]:
    """DRA pods as the webhook marks them for the extender (``--mark-for-extender``),
    kube-scheduler with DRA and the extender ranking their nodes. ``detail`` (a test's):
    filled as ``_dra_streams`` says."""
    from testkit.scheduler import extender_and_scheduler

    sched = f"gs-drx-{env.tag}"
    settings = replace(ds.translation_settings(class_name), mark_for_extender=True)
    with extender_and_scheduler(
        env.kubeconfig, binary, env.workdir, sched, load, KEY, dra_driver=ds.DRIVER
    ) as proc:
        wait_started(proc, env.workdir / "sched.log")
        return _dra_streams(env, pods, settings, sched, "DRA+extender", o, proc, detail)


def _dra_streams(
    env: Env, pods: Sequence[trace.TracePod], settings: Any, sched: str, what: str,
    o: Options, proc: subprocess.Popen[bytes], detail: dict[str, Any] | None = None,
) -> dict[str, ds.RunFigures]:
    """``detail``: filled from the last mode's stream before its namespace goes:
    ``nodes`` (per pod, None if unbound), ``annotations`` (pod -> its annotations) and
    ``devices`` (pod -> device indices its claims were allocated on its node)."""
    out: dict[str, ds.RunFigures] = {}
    for mode in o.modes:
        with namespace(env, f"{sched}-{mode}") as ns:
            bodies, templates = [], {}
            for i, p in enumerate(pods):
                body, t = ds.dra_pod(ds.vcuda_pod(f"p{i:04d}", p, sched, env.tag), ns, settings)
                bodies.append(body)
                templates.update({tb["metadata"]["name"]: tb for tb in t.templates})
            for tb in templates.values():
                env.custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, "resourceclaimtemplates", tb
                )
            r = stream(
                env.core, ns, bodies, _window(mode, len(bodies)), _pod_timeout(mode, o),
                o.phase_timeout,
            )
            claims = env.custom.list_namespaced_custom_object(
                GROUP, VERSION, ns, "resourceclaims"
            )["items"]
            out[mode] = _figures(pods, r, claims)
            _progress(f"{what} {mode}", out[mode], r)
            if detail is not None:
                detail.update(_detail(env, ns, r, claims))
        if proc.poll() is not None:
            raise RuntimeError(f"the {what} kube-scheduler exited; see {env.workdir}")
        time.sleep(1)  # an extender's view sees the deletions
    return out


def _detail(env: Env, ns: str, r: StreamResult, claims: list[Any]) -> dict[str, Any]:
    from gpu_share.sharing.dra.pod_claims import allocated_indices

    pods = env.core.list_namespaced_pod(ns).items
    node_of = {p.metadata.name: p.spec.node_name for p in pods}
    devices: dict[str, list[int]] = {}
    for c in claims:
        for ref in (c.get("status") or {}).get("reservedFor") or []:
            got = allocated_indices(c, ds.DRIVER, node_of.get(ref.get("name")) or "")
            devices.setdefault(ref.get("name"), []).extend(got or ())
    return {
        "nodes": r.nodes,
        "annotations": {p.metadata.name: dict(p.metadata.annotations or {}) for p in pods
                        if p.spec.node_name},
        "devices": devices,
    }


def run_extender(
    env: Env, binary: Path, pods: Sequence[trace.TracePod], load: Any, o: Options
) -> dict[str, ds.RunFigures]:
    from testkit.scheduler import extender_and_scheduler

    sched = f"gs-ext-{env.tag}"
    out: dict[str, ds.RunFigures] = {}
    with extender_and_scheduler(
        env.kubeconfig, binary, env.workdir, sched, load, KEY
    ) as proc:
        wait_started(proc, env.workdir / "sched.log")
        for mode in o.modes:
            with namespace(env, f"gs-ext-{env.tag}-{mode}") as ns:
                bodies = [ds.vcuda_pod(f"p{i:04d}", p, sched, env.tag) for i, p in enumerate(pods)]
                r = stream(
                    env.core, ns, bodies, _window(mode, len(bodies)), _pod_timeout(mode, o),
                    o.phase_timeout,
                )
                out[mode] = _figures(pods, r, None)
                _progress(f"extender {mode}", out[mode], r)
            time.sleep(1)  # the extender's view sees the deletions
    return out


_CAP: dict[str, int] = {}


def _figures(
    pods: Sequence[trace.TracePod], r: StreamResult, claims: list[dict[str, Any]] | None
) -> ds.RunFigures:
    use = None if claims is None else ds.claim_use(claims)
    return ds.figures(
        pods, r.nodes, r.outcome, _CAP["milli"], _CAP["devices"], r.wall_s, r.latencies_s, use
    )


def _progress(what: str, f: ds.RunFigures, r: StreamResult) -> None:
    print(
        f"  {what}: {f.bound}/{f.pods} bound, {f.unschedulable} unschedulable, "
        f"{f.undecided} undecided, allocation {f.alloc_pct:.2f} %, {f.wall_s:.1f} s",
        flush=True,
    )
    for msg, n in sorted(r.reasons.items(), key=lambda kv: -kv[1])[:3]:
        print(f"    {n} x {msg}")


# ---------------------------------------------------------------- main


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.dra_placement")
    ap.add_argument("--nodes", type=int, default=60)
    ap.add_argument("--pods", type=int, default=400, help="at most this many GPU pods")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument(
        "--max-arrived", type=float, default=100.0,
        help="stop the stream when the pods ask this %% of the nodes' GPU capacity",
    )
    ap.add_argument("--modes", default="seq,burst", help="seq, burst or both")
    ap.add_argument("--paths", default="dra,extender,dra+extender",
                    help="any of dra, extender, dra+extender (DRA pods ranked by the "
                         "extender); or sim: the simulators alone, no cluster")
    ap.add_argument("--seeds", default="42", help="sim: comma-separated seeds")
    ap.add_argument(
        "--scheduler", default="", help="kube-scheduler binary (default: the cluster's)"
    )
    ap.add_argument("--pod-timeout", type=float, default=30.0)
    ap.add_argument("--phase-timeout", type=float, default=300.0)
    ap.add_argument("--lock-timeout", type=float, default=600.0)
    a = ap.parse_args(argv)
    if not 1 <= a.nodes <= 1213 or not 1 <= a.pods <= 8000:
        ap.error("--nodes 1..1213, --pods 1..8000")
    return a


def simulated(a: argparse.Namespace) -> int:
    """``--paths sim``: the two simulators alone, per seed of ``--seeds`` (no cluster):
    fgd's own devices against the allocator's first fit on fgd's node."""
    nodes = ds.sample_nodes(trace.load_nodes(units=ds.UNITS), a.nodes)
    cap = ds.capacity_milli(nodes)
    trace_pods = trace.load_pods(trace.trace_dir() / "openb_pod_list_default.csv")
    load = ds.workload(trace_pods)
    print(f"{len(nodes)} nodes, {sum(len(n.devices) for n in nodes)} GPUs")
    print("seed   pods  simulator fgd  sim. first-fit  difference (pp)")
    for seed in (int(x) for x in a.seeds.split(",")):
        pods = ds.sample_pods(trace_pods, seed, cap, a.pods, a.max_arrived)
        fgd = ds.allocation_pct(pods, ds.simulate(nodes, pods, load), cap)
        ff = ds.allocation_pct(pods, ds.simulate_first_fit(nodes, pods, load), cap)
        print(f"{seed:>4} {len(pods):>6} {fgd:>14.2f} {ff:>15.2f} {ff - fgd:>+16.2f}",
              flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    from kubernetes import client as k8s

    from testkit.harness import cluster_info, cluster_is_up, cluster_lock
    from testkit.kube_admin import admin_client

    a = _args(argv)
    if a.paths == "sim":
        return simulated(a)
    # A plain SIGTERM (e.g. timeout(1)) still runs the clean-up in the finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    info = cluster_info()
    if info.problem or not cluster_is_up():
        print(f"the local cluster is not usable: {info.problem or 'not up'}", file=sys.stderr)
        return 2
    kubeconfig = info.env["KUBECONFIG"]
    binary = Path(a.scheduler or Path(info.env["K8S_BIN_DIR"]) / "kube-scheduler")
    api = admin_client(kubeconfig)
    server = k8s.VersionApi(api).get_code().git_version
    version = binary_version(binary)
    problem = skew_problem(version, server)
    if problem:
        print(f"refusing to run: {problem} (version skew policy)", file=sys.stderr)
        return 2

    all_nodes = trace.load_nodes(units=ds.UNITS)
    tag = uuid.uuid4().hex[:6]
    nodes = ds.renamed(ds.sample_nodes(all_nodes, a.nodes), f"gsd{tag}-")
    _CAP["milli"] = ds.capacity_milli(nodes)
    _CAP["devices"] = sum(len(n.devices) for n in nodes)
    trace_pods = trace.load_pods(trace.trace_dir() / "openb_pod_list_default.csv")
    pods = ds.sample_pods(trace_pods, a.seed, _CAP["milli"], a.pods, a.max_arrived)
    load = ds.workload(trace_pods)
    sim = ds.simulate(nodes, pods, load)
    sim_ff = ds.simulate_first_fit(nodes, pods, load)
    arrived = 100 * sum(p.gpu_request for p in pods) / _CAP["milli"]
    print(
        f"kube-scheduler {version} ({binary}), API server {server}; {len(nodes)} nodes, "
        f"{_CAP['devices']} GPUs; {len(pods)} GPU pods (seed {a.seed}) asking {arrived:.1f} % "
        "of the GPU capacity",
        flush=True,
    )
    if has_issue_133705(version):
        print("WARNING: kube-scheduler < 1.35 has kubernetes#133705: DRA figures are not valid")
    modes = tuple(m for m in ("seq", "burst") if m in a.modes.split(","))
    o = Options(a.pod_timeout, a.phase_timeout, modes)
    results: dict[str, dict[str, ds.RunFigures]] = {}
    with (
        cluster_lock(a.lock_timeout, on_wait=lambda: print("waiting for the cluster lock...")),
        tempfile.TemporaryDirectory(prefix="gs-dra-bench-") as tmp,
    ):
        env = Env(api, k8s.CoreV1Api(api), k8s.CustomObjectsApi(api), kubeconfig, tag, Path(tmp))
        class_name = f"gs-bench-{tag}"
        with registered(env, nodes, class_name):
            if "dra" in a.paths.split(","):
                results["DRA"] = run_dra(env, binary, pods, class_name, o)
            if "extender" in a.paths.split(","):
                results["extender"] = run_extender(env, binary, pods, load, o)
            if "dra+extender" in a.paths.split(","):
                results["DRA+extender"] = run_dra_extender(env, binary, pods, class_name,
                                                           load, o)
    columns = [
        (f"{path} {mode}", results[path].get(mode))
        for path in results
        for mode in modes
    ]
    print()
    print(ds.table(columns, _CAP["devices"], ("simulator fgd", pods, sim, _CAP["milli"]),
                   ("sim. first-fit", pods, sim_ff, _CAP["milli"])))
    print(f"(kube-scheduler {version}; allocation = GPU-milli of bound pods / capacity)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
