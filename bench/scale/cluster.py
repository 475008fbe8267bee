"""The cluster half of ``bench.scale``: kwok, the nodes, the schedulers, the pod stream.

Everything here is undone by its context manager (also on errors and Ctrl-C): the kwok
and scheduler processes are terminated, the nodes, slices and namespaces deleted.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.scale import model
from gpu_share.kube.rest import MERGE_PATCH
from gpu_share.sharing.placement import NodeSlots
from testkit.process import stop_process

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


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
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
        stop(proc)


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
