"""The extender's cluster view at a given size, live: its memory at
5,000 nodes and 50,000 pods (docs/scale.md).

    python -m bench.scale.viewmem --nodes 5000 --pods 50000

On the local cluster's API server (takes the cluster lock): ``--nodes`` Node objects as
bench.scale makes them (the agent's inventory annotation and allocatable), then
``--pods`` pods of the default trace's stream (cycled past 100 % of the GPUs). The pods
the simulator (best-fit) places are created bound (``spec.nodeName``) and then carry the
extender's signed decision for their UID, as the extender's bind leaves them; the rest
stay Pending (a scheduler name nobody serves). No kwok: nothing here needs a pod to run.

Then ``gpu-share-extender`` starts in its own process (bench.scale.extender_proc) and
lists and watches it all. Printed: the extender's RSS before and after the view's first
list+watch sync, after ``--requests`` filter+prioritize pairs over every node (random
pod shapes of the trace), and their p50/p99. Everything made is deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import dra_stream as ds
from bench.replay import trace
from bench.scale import cluster as cl
from bench.scale import model
from bench.scale import procs as pr
from gpu_share.kube.rest import MERGE_PATCH
from gpu_share.sharing.decision import ContainerDecision, Decision, decision_key, sign
from gpu_share.sharing.placement import ClusterIndex, Placement, TieBreak, make_policy
from gpu_share.sharing.placement.pod_request import parse_pod_request

KEY = b"scale-bench-decision-key-0123456789"
NOBODY = "gs-scale-nobody"  # no scheduler serves it: unplaced pods stay Pending


def stream_of(all_pods: Sequence[trace.TracePod], seed: int, capacity: int,
              n: int) -> list[trace.TracePod]:
    """The first ``n`` GPU pods of the replay's stream (its resampling continued as far
    as ``n`` needs: past the 130 % it stops at for a replay)."""
    gpu = [p for p in all_pods if p.gpu_request > 0]
    ask = sum(p.gpu_request for p in gpu) / max(1, len(gpu))
    inflation = max(1.3, 1.2 * n * ask / capacity)
    stream = trace.arrival_order(list(all_pods), seed, capacity, inflation)
    return [p for p in stream if p.gpu_request > 0][:n]


def placements(nodes: Sequence[Any], pods: Sequence[trace.TracePod],
               load: Any) -> list[Placement | None]:
    # best-fit: the pods only have to land somewhere real (fgd at 5,000 nodes x 50,000
    # pods takes ~20 min here); the view holds them the same whoever placed them.
    index = ClusterIndex(make_policy("best-fit", load), list(nodes), TieBreak.DETERMINISTIC)
    return [index.place(p.demand(model.UNITS)) for p in pods]


def pod_body(name: str, p: trace.TracePod, placed: Placement | None, tag: str) -> dict[str, Any]:
    body = model.vcuda_pod(name, p, NOBODY, tag)
    if placed is not None:
        body["spec"]["nodeName"] = placed.node
    return body


def decision(body: dict[str, Any], uid: str, placed: Placement) -> str:
    """The annotation the extender's bind writes for this placement (signed for uid)."""
    asking = parse_pod_request(body, ds.MEM, ds.CORE, domain="vendor.com").asking
    containers = {
        cp.container: ContainerDecision(tuple(d.uuid for d in cp.devices), asking[cp.container])
        for cp in placed.containers
    }
    return sign(Decision(uid, placed.node, containers, int(time.time())), KEY)


def create_pods(env: cl.Env, ns: str, bodies: Sequence[dict[str, Any]],
                placed: Sequence[Placement | None], workers: int) -> float:
    base = f"/api/v1/namespaces/{ns}/pods"
    done = [0]
    lock = threading.Lock()

    def one(i: int) -> None:
        got = env.rest.create("create pod", base, bodies[i])
        pl = placed[i]
        if pl is not None:
            uid = str(got["metadata"]["uid"])
            ann = {decision_key("vendor.com"): decision(bodies[i], uid, pl)}
            env.rest.patch("annotate pod", f"{base}/{bodies[i]['metadata']['name']}",
                           {"metadata": {"uid": uid, "annotations": ann}},
                           content_type=MERGE_PATCH)
        with lock:
            done[0] += 1
            if done[0] % 5000 == 0:
                cl.log(f"  {done[0]} pods created")

    t0 = time.monotonic()
    with ThreadPoolExecutor(workers) as ex:
        for fut in [ex.submit(one, i) for i in range(len(bodies))]:
            fut.result()
    return time.monotonic() - t0


def post(port: int, verb: str, args: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/{verb}", json.dumps(args).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def requests(port: int, names: list[str], pods: Sequence[trace.TracePod], n: int,
             seed: int) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    tf, tp = [], []
    for i in range(n):
        p = rng.choice(pods)
        pod = model.vcuda_pod(f"probe-{i}", p, NOBODY, "probe")
        pod["metadata"]["uid"] = f"probe-{uuid.uuid4()}"
        t0 = time.perf_counter()
        got = post(port, "filter", {"Pod": pod, "NodeNames": names})
        t1 = time.perf_counter()
        post(port, "prioritize", {"Pod": pod, "NodeNames": got["NodeNames"] or []})
        tf.append(1e3 * (t1 - t0))
        tp.append(1e3 * (time.perf_counter() - t1))
    return tf, tp


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.scale.viewmem", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--requests", type=int, default=100,
                    help="filter+prioritize pairs over every node after the sync")
    ap.add_argument("--workers", type=int, default=16, help="threads creating objects")
    ap.add_argument("--lock-timeout", type=float, default=1800)
    ap.add_argument("--out", default="", help="also write the figures here (JSON)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    with cl_signals():
        return _main(a)


@contextlib.contextmanager
def cl_signals() -> Any:
    from bench.scale.__main__ import _signals

    with _signals():
        yield


def _main(a: argparse.Namespace) -> int:
    from kubernetes import client as k8s

    from gpu_share.kube.rest import make_rest_client
    from testkit.harness import cluster_info, cluster_is_up, cluster_lock
    from testkit.kube_admin import admin_client

    info = cluster_info()
    if info.problem or not cluster_is_up():
        print(f"the local cluster is not usable: {info.problem or 'not up'}", file=sys.stderr)
        return 2
    tag = uuid.uuid4().hex[:6]
    nodes = model.replicate(trace.load_nodes(units=model.UNITS), a.nodes, f"gsv{tag}-")
    capacity = ds.capacity_milli(nodes)
    trace_pods = trace.load_pods(trace.trace_dir() / "openb_pod_list_default.csv")
    load = ds.workload(trace_pods)
    pods = stream_of(trace_pods, a.seed, capacity, a.pods)
    placed = placements(nodes, pods, load)
    bodies = [pod_body(f"v{i}", p, pl, tag)
              for i, (p, pl) in enumerate(zip(pods, placed, strict=True))]
    n_bound = sum(pl is not None for pl in placed)
    cl.log(f"{len(nodes)} nodes, {len(pods)} pods ({n_bound} bound by the simulator)")
    api = admin_client(info.env["KUBECONFIG"])
    rest = make_rest_client(info.env["KUBECONFIG"])
    with (
        cluster_lock(a.lock_timeout, on_wait=lambda: cl.log("waiting for the cluster lock...")),
        tempfile.TemporaryDirectory(prefix="gs-viewmem-") as tmp,
    ):
        env = cl.Env(api, k8s.CoreV1Api(api), k8s.CustomObjectsApi(api), rest,
                     info.env["KUBECONFIG"], tag, Path(tmp), Path(info.env["K8S_BIN_DIR"]))
        wl_file = env.workdir / "workload.json"
        wl_file.write_text(json.dumps(
            [[s.memory_units, s.cores, s.weight, s.cpu, s.host_memory] for s in load.shapes]))
        with (
            cl.nodes_registered(env, nodes, a.workers, slices=False),
            cl.namespace(env, f"gs-viewmem-{tag}") as ns,
        ):
            wall = create_pods(env, ns, bodies, placed, a.workers)
            cl.log(f"{len(bodies)} pods created in {wall:.0f}s")
            port = pr.free_port()
            t0 = time.monotonic()
            with pr.extender(env, port, KEY, wl_file) as ext:
                synced_s = time.monotonic() - t0
                st = ext.stats()
                marks = st["marks"]
                names = sorted(n.name for n in nodes)
                tf, tp = requests(port, names, pods, a.requests, a.seed)
                after = ext.stats()
            doc = {
                "nodes": len(nodes), "pods": len(pods), "bound": n_bound,
                "sync_s": synced_s,
                "rss_before_sync_mib": marks.get("rss_before_sync_mib"),
                "rss_synced_mib": marks.get("rss_synced_mib"),
                "rss_after_requests_mib": after["rss_mib"],
                "filter_ms": tf, "prioritize_ms": tp,
                # inside the process, around Extender.filter/prioritize (no HTTP, JSON)
                "inproc_filter_ms": after["durations_ms"]["filter"],
                "inproc_prioritize_ms": after["durations_ms"]["prioritize"],
            }
    q = model.percentile
    print(f"\n{doc['nodes']} nodes, {doc['pods']} pods ({n_bound} bound with a signed "
          f"decision, {doc['pods'] - n_bound} pending)")
    print(f"  extender start to view synced      {doc['sync_s']:.1f} s")
    before, synced = doc["rss_before_sync_mib"], doc["rss_synced_mib"]
    print(f"  RSS before / after the first sync  {before:.0f} / {synced:.0f} MiB "
          f"(view {synced - before:.0f} MiB)")
    print(f"  RSS after {a.requests} filter+prioritize  {doc['rss_after_requests_mib']:.0f} MiB")
    print(f"  filter p50 / p99 (HTTP, all nodes) {q(tf, 50):.1f} / {q(tf, 99):.1f} ms")
    print(f"  prioritize p50 / p99               {q(tp, 50):.1f} / {q(tp, 99):.1f} ms")
    fi, pi = doc["inproc_filter_ms"], doc["inproc_prioritize_ms"]
    print(f"  in the process: filter {q(fi, 50):.1f} / {q(fi, 99):.1f} ms, "
          f"prioritize {q(pi, 50):.1f} / {q(pi, 99):.1f} ms")
    if a.out:
        Path(a.out).write_text(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
