"""The cluster half of ``bench.scale``: kwok, the nodes, the schedulers, the pod stream.

Everything here is undone by its context manager (also on errors and Ctrl-C): the kwok
and scheduler processes are terminated, the nodes, slices and namespaces deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.scale import model
from gpu_share.kube.rest import MERGE_PATCH
from gpu_share.sharing.placement import NodeSlots
from testkit.process import stop_process
from testkit.scheduler import extender_entry

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Env:
    api: Any  # kubernetes.client.ApiClient
    core: Any  # CoreV1Api
    custom: Any  # CustomObjectsApi
    rest: Any  # gpu_share.kube.rest.RestClient: plain JSON, for the bulk calls
    kubeconfig: str
    tag: str
    workdir: Path
    k8s_bin: Path


def log(msg: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wait_for(what: str, check: Callable[[], bool], timeout: float, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    stop_process(proc, grace_s=15, kill_wait_s=10, sig=sig)


# ---------------------------------------------------------------- kwok


def kwok_binary() -> Path:
    out = subprocess.run(
        ["bash", str(REPO / "hack" / "build-kwok.sh")], capture_output=True, text=True, check=False
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("kwok=")]
    if out.returncode != 0 or not line:
        raise RuntimeError(f"hack/build-kwok.sh failed:\n{out.stderr[-3000:]}")
    return Path(line[0].split("=", 1)[1])


@contextlib.contextmanager
def kwok(env: Env, binary: Path, lease_s: int) -> Iterator[subprocess.Popen[bytes]]:
    """kwok managing only this run's nodes (by label) and the pods bound to them.

    The lease is renewed every lease_s/4 (kwok's rule): under the node lifecycle
    controller's 50 s grace period for lease_s <= 190, at lease_s/4 writes per node."""
    logf = env.workdir / "kwok.log"
    with logf.open("w") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--config={REPO / 'hack' / 'kwok' / 'stages.yaml'}",
                f"--kubeconfig={env.kubeconfig}",
                f"--manage-nodes-with-label-selector={model.LABEL}={env.tag}",
                "--manage-all-nodes=false",
                f"--node-lease-duration-seconds={lease_s}",
                "--cidr=10.200.0.1/16",
                "--node-ip=10.199.0.1",
                "--server-address=",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        time.sleep(1)
        if proc.poll() is not None:
            raise RuntimeError(f"kwok exited at once:\n{logf.read_text()[-3000:]}")
        yield proc
    finally:
        _stop(proc)


# ---------------------------------------------------------------- nodes


def _paged(env: Env, path: str, selector: str) -> list[dict[str, Any]]:
    """Every object of a list call, as JSON (no model objects: thousands of them)."""
    items: list[dict[str, Any]] = []
    cont = ""
    while True:
        q = [("labelSelector", selector), ("limit", 500)]
        if cont:
            q.append(("continue", cont))
        doc = _get(env, path, q)
        items.extend(doc.get("items") or [])
        cont = (doc.get("metadata") or {}).get("continue") or ""
        if not cont:
            return items


def _get(env: Env, path: str, query: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(env.rest.get(f"list {path}", path, dict(query)))


def ready_nodes(env: Env) -> int:
    n = 0
    for node in _paged(env, "/api/v1/nodes", f"{model.LABEL}={env.tag}"):
        conds = (node.get("status") or {}).get("conditions") or []
        alloc = (node.get("status") or {}).get("allocatable") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
        if ready and model.ds.MEM in alloc:
            n += 1
    return n


@contextlib.contextmanager
def nodes_registered(
    env: Env, nodes: Sequence[NodeSlots], workers: int, slices: bool
) -> Iterator[None]:
    """The Node objects (status patched), and with ``slices`` one ResourceSlice each."""
    selector = f"{model.LABEL}={env.tag}"

    def one(n: NodeSlots) -> None:
        env.rest.create("create node", "/api/v1/nodes", model.node_body(n, env.tag))
        env.rest.patch(
            "patch node status", f"/api/v1/nodes/{n.name}/status", model.node_status(n),
            content_type=MERGE_PATCH,
        )
        if slices:
            body = model.ds.resource_slice(n, env.tag)
            body["metadata"]["labels"] = {model.LABEL: env.tag}
            env.rest.create("create slice", "/apis/resource.k8s.io/v1/resourceslices", body)

    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(workers) as ex:
            for fut in [ex.submit(one, n) for n in nodes]:
                fut.result()
        log(f"{len(nodes)} nodes registered in {time.monotonic() - t0:.0f}s")
        yield
    finally:
        delete_nodes(env, selector)


def delete_nodes(env: Env, selector: str) -> None:
    with contextlib.suppress(Exception):
        env.custom.delete_collection_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices", label_selector=selector
        )
    for _ in range(5):
        with contextlib.suppress(Exception):
            env.core.delete_collection_node(label_selector=selector)
        try:
            left = len(_paged(env, "/api/v1/nodes", selector))
        except Exception:
            left = -1
        if left == 0:
            return
        time.sleep(2)
    print(f"WARNING: nodes with {selector} may be left; delete them with kubectl", file=sys.stderr)


@contextlib.contextmanager
def namespace(env: Env, name: str) -> Iterator[str]:
    env.core.create_namespace({"metadata": {"name": name, "labels": {model.LABEL: env.tag}}})
    try:
        yield name
    finally:
        drop_namespace(env, name)


def drop_namespace(env: Env, ns: str, timeout: float = 600) -> None:
    """Pods at once (no kubelet; zero grace), then the namespace. One delete per pod from
    8 threads, repeated for what is left: a deletecollection is worked off one pod at a
    time and may stop short."""
    base = f"/api/v1/namespaces/{ns}/pods"

    def one(name: str) -> None:
        with contextlib.suppress(Exception):
            env.rest.request(
                "delete pod", "DELETE", f"{base}/{name}", body={"gracePeriodSeconds": 0}
            )

    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                left = [str(p["metadata"]["name"]) for p in _paged(env, base, "")]
            except Exception:
                left = ["?"]
            if not left:
                # DRA: a claim still allocated counts against the devices of the next
                # stream, and holds the namespace; the claim controller frees them.
                claims = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
                held = False
                with contextlib.suppress(Exception):
                    held = bool(_paged(env, claims, ""))
                if held:
                    time.sleep(2)
                    continue
                return
            if left != ["?"]:
                with ThreadPoolExecutor(8) as ex:
                    list(ex.map(one, left))
            time.sleep(1)
        print(f"WARNING: pods of {ns} still there after {timeout:.0f}s", file=sys.stderr)
    finally:
        with contextlib.suppress(Exception):
            env.core.delete_namespace(ns, grace_period_seconds=0)


# ---------------------------------------------------------------- schedulers


def scheduler_config(
    env: Env, name: str, extender_port: int | None, qps: float, nodes_to_score: int = 0
) -> dict[str, Any]:
    """kube-scheduler alone (its defaults), or as the chart configures it with the
    extender (score plugins off, percentageOfNodesToScore as the chart's value,
    nodeCacheCapable)."""
    profile: dict[str, Any] = {"schedulerName": name}
    cfg: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": env.kubeconfig},
        "leaderElection": {"leaderElect": False},
        "profiles": [profile],
    }
    if qps > 0:
        cfg["clientConnection"].update({"qps": qps, "burst": int(2 * qps)})
    if extender_port is not None:
        cfg["percentageOfNodesToScore"] = nodes_to_score
        profile["plugins"] = {"score": {"disabled": [{"name": "*"}]}}
        cfg["extenders"] = [extender_entry(extender_port, model.ds.MEM, model.ds.CORE)]
    return cfg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scheduler_binary(spec: str, k8s_bin: Path) -> Path:
    """The kube-scheduler binary of ``--dra-scheduler``: empty = the local cluster's
    (``k8s_bin``), ``1.36`` = the one hack/cluster/build.sh builds from hack/k8s-136
    (built and cached on first use: minutes), else the path of a kube-scheduler binary."""
    if not spec:
        return k8s_bin / "kube-scheduler"
    if spec == "1.36":
        build = REPO / "hack" / "cluster" / "build.sh"
        log("kube-scheduler 1.36: hack/cluster/build.sh k8s-136 (cached after the first build)")
        subprocess.run(["bash", str(build), "k8s-136"], check=True, stdout=sys.stderr)
        out = subprocess.run(["bash", str(build), "k8s-136-dir"], check=True,
                             capture_output=True, text=True)
        return Path(out.stdout.strip()) / "bin" / "kube-scheduler"
    path = Path(spec).resolve()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(f"--dra-scheduler: {spec} is not an executable file")
    return path


def binary_version(binary: Path) -> str:
    """What ``BINARY --version`` says (``Kubernetes v1.36.3``)."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                         check=True, timeout=60)
    return out.stdout.strip()


@contextlib.contextmanager
def kube_scheduler(
    env: Env, name: str, cfg: Mapping[str, Any], gates: str = "", binary: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """kube-scheduler (the local cluster's, or ``binary``) serving the profile ``name``
    beside the cluster's own scheduler, which leaves its pods alone (their schedulerName):
    the same kubeconfig, config and gates whichever binary runs."""
    conf = env.workdir / f"{name}.yaml"
    conf.write_text(yaml.safe_dump(dict(cfg)))
    logf = env.workdir / f"{name}.log"
    exe = binary or env.k8s_bin / "kube-scheduler"
    # Served like the cluster's own scheduler (hack/local-up-cluster.sh start_component):
    # /debug/pprof and /metrics on 127.0.0.1, for the admin's client certificate.
    port = _free_port()
    args = [
        str(exe), f"--config={conf}", "--bind-address=127.0.0.1", f"--secure-port={port}",
        f"--authentication-kubeconfig={env.kubeconfig}",
        f"--authorization-kubeconfig={env.kubeconfig}", "--v=1",
    ]
    if gates:
        args.append(f"--feature-gates={gates}")
    with logf.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"kube-scheduler exited:\n{logf.read_text()[-3000:]}")
            return "Starting Kubernetes Scheduler" in logf.read_text(errors="replace")

        wait_for("kube-scheduler to start", up, 120)
        log(f"  kube-scheduler {name} (pid {proc.pid}): https://127.0.0.1:{port} "
            f"(/debug/pprof, /metrics), log {logf}")
        time.sleep(3)  # its informers sync after the start line
        yield proc
    finally:
        _stop(proc)


def _kcm_qps(cluster_dir: Path) -> str:
    """The running kube-controller-manager's --kube-api-qps ("" = its default)."""
    pid = (cluster_dir / "run" / "kube-controller-manager.pid").read_text().strip()
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return next((a.split("=", 1)[1] for a in args if a.startswith("--kube-api-qps=")), "")


def _restart_kcm(qps: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPU_SHARE_KCM_API_QPS"}
    if qps:
        env["GPU_SHARE_KCM_API_QPS"] = qps
    subprocess.run(
        ["bash", str(REPO / "hack" / "local-up-cluster.sh"), "restart-controller-manager"],
        env=env, check=True, stdout=sys.stderr, timeout=300,
    )


@contextlib.contextmanager
def controller_manager_qps(cluster_dir: Path, qps: int) -> Iterator[None]:
    """The local cluster's kube-controller-manager restarted with --kube-api-qps ``qps``
    (burst twice that) for the block, then restarted as it ran before (also on errors);
    ``qps`` 0 leaves it alone. Each of its controllers has a client at that rate: DRA
    pods' claims are made by the resource claim controller, two writes a pod."""
    if qps <= 0:
        yield
        return
    before = _kcm_qps(cluster_dir)
    log(f"kube-controller-manager: --kube-api-qps {qps} (was {before or 'its default, 20'})")
    try:
        _restart_kcm(str(qps))
        yield
    finally:
        log(f"kube-controller-manager: back to --kube-api-qps {before or 'its default'}")
        _restart_kcm(before)


@dataclass
class ExtenderProc:
    proc: subprocess.Popen[bytes]
    port: int
    stats_file: Path

    def stats(self, timeout: float = 30) -> dict[str, Any]:
        """Asks the process for its figures (SIGUSR1) and reads them."""
        before = self.stats_file.stat().st_mtime_ns if self.stats_file.exists() else 0
        self.proc.send_signal(signal.SIGUSR1)

        def fresh() -> bool:
            return self.stats_file.exists() and self.stats_file.stat().st_mtime_ns != before

        wait_for("extender stats", fresh, timeout, every=0.1)
        return dict(json.loads(self.stats_file.read_text()))

    def cpu_s(self) -> float:
        f = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def extender(
    env: Env, port: int, key: bytes, workload_file: Path | None, src: Path | None = None
) -> Iterator[ExtenderProc]:
    """``gpu-share-extender`` (the console script's code) in its own process; ``src``: a
    source tree whose ``gpu_share`` package to run instead (to measure a candidate fix)."""
    key_file = env.workdir / "decision.key"
    key_file.write_bytes(key)
    stats = env.workdir / "extender-stats.json"
    logf = env.workdir / "extender.log"
    cmd = [sys.executable, "-m", "bench.scale.extender_proc", str(stats)]
    if workload_file is not None:
        cmd += ["--workload", str(workload_file)]
    cmd += [
        "--", f"--listen=127.0.0.1:{port}", f"--key-file={key_file}",
        f"--kubeconfig={env.kubeconfig}", "--log-level=warning",
    ]
    with logf.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                [*([str(src)] if src else []), str(REPO)]
            )},
        )
    ext = ExtenderProc(proc, port, stats)
    try:

        def synced() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the extender exited:\n{logf.read_text()[-3000:]}")
            # Written by the process itself once its view synced (no signal before:
            # SIGUSR1 would end a process that has not installed its handler yet).
            with contextlib.suppress(OSError, ValueError):
                return "synced_at" in (json.loads(stats.read_text()).get("marks") or {})
            return False

        wait_for("the extender's view to sync", synced, 600, every=2)
        yield ext
    finally:
        _stop(proc)


# ---------------------------------------------------------------- the stream


@dataclass
class Stream:
    created: dict[str, float] = field(default_factory=dict)
    bound: dict[str, tuple[str, float]] = field(default_factory=dict)
    unschedulable: dict[str, float] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # final objects
    errors: list[str] = field(default_factory=list)


class PodWatch:
    """A raw JSON watch of one namespace: when each pod was first seen bound (or
    refused), on the monotonic clock."""

    def __init__(self, env: Env, ns: str, s: Stream) -> None:
        self.env, self.ns, self.s = env, ns, s
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PodWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            if self._resp is not None:
                self._resp.close()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        rv = ""
        while not self._stop.is_set():
            try:
                q: dict[str, Any] = {"watch": "true", "timeoutSeconds": 300}
                if rv:
                    q["resourceVersion"] = rv
                self._resp = self.env.rest.watch(
                    "watch pods", f"/api/v1/namespaces/{self.ns}/pods", q, 330
                )
                for ev in self._resp:
                    obj = ev.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if ev.get("type") in ("ADDED", "MODIFIED"):
                        self._seen(obj)
                    if self._stop.is_set():
                        return
            except Exception:
                if self._stop.is_set():
                    return
                rv = ""
                time.sleep(0.5)

    def _seen(self, pod: Mapping[str, Any]) -> None:
        now = time.monotonic()
        name = str(pod["metadata"]["name"])
        node = (pod.get("spec") or {}).get("nodeName")
        with self.cond:
            if node and name not in self.s.bound:
                self.s.bound[name] = (str(node), now)
                self.s.unschedulable.pop(name, None)
            elif not node and name not in self.s.unschedulable and _refused(pod):
                self.s.unschedulable[name] = now
            self.cond.notify_all()


def _refused(pod: Mapping[str, Any]) -> bool:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    claims = {c["name"] for c in spec.get("resourceClaims") or []}
    statuses = status.get("resourceClaimStatuses") or []
    have = {s["name"] for s in statuses if s.get("resourceClaimName")}
    if claims - have:
        return False  # waiting for its claims to exist
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


def stream(
    env: Env,
    ns: str,
    bodies: Sequence[Mapping[str, Any]],
    offsets: Sequence[float],
    workers: int,
    timeout: float,
    settle: float,
) -> tuple[Stream, float]:
    """Creates pod i at ``offsets[i]`` s after the start (all at once: as fast as the
    creators go), until every pod is bound or refused, or nothing changed for ``settle``
    s after the last create. Returns the figures and the wall time (first create to
    the last decision)."""
    s = Stream()
    names = [str(b["metadata"]["name"]) for b in bodies]
    todo: queue.Queue[int | None] = queue.Queue()

    def creator() -> None:
        while (i := todo.get()) is not None:
            try:
                s.created[names[i]] = time.monotonic()
                env.rest.create("create pod", f"/api/v1/namespaces/{ns}/pods", bodies[i])
            except Exception as e:
                s.errors.append(f"{names[i]}: {e}"[:300])

    with PodWatch(env, ns, s) as w:
        threads = [threading.Thread(target=creator, daemon=True) for _ in range(workers)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        for i, off in enumerate(offsets):
            delay = t0 + off - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            todo.put(i)
            if off < 0:  # sequential: the replay's order exactly
                with w.cond:
                    w.cond.wait_for(
                        lambda n=names[i]: n in s.bound or n in s.unschedulable, timeout=60
                    )
        for _ in threads:
            todo.put(None)
        deadline = t0 + timeout
        last_change, last_count, shown = time.monotonic(), -1, time.monotonic()
        while time.monotonic() < deadline:
            with w.cond:
                w.cond.wait(1.0)
                count = len(s.bound) + len(s.unschedulable)
            now = time.monotonic()
            if count != last_count:
                last_change, last_count = now, count
            if now - shown > 60:
                shown = now
                log(f"    {len(s.created)} created, {len(s.bound)} bound, "
                    f"{len(s.unschedulable)} refused after {now - t0:.0f}s")
            if count >= len(names) or (
                all(not t.is_alive() for t in threads) and now - last_change > settle
            ):
                break
        for t in threads:
            t.join(timeout=30)
    for p in _paged(env, f"/api/v1/namespaces/{ns}/pods", ""):
        s.pods[str(p["metadata"]["name"])] = p
    first = min(s.created.values(), default=t0)
    ends = [t for _, t in s.bound.values()] + list(s.unschedulable.values())
    return s, (max(ends) if ends else time.monotonic()) - first
