"""The extender's per-request CPU cost at 5,000 nodes, in process (no cluster).

    .venv/bin/python -m bench.extender_calls [--nodes 5000] [--calls 300] [--fill 6000]
        [--policy fgd] [--profile 20]

Builds ``--nodes`` openb GPU nodes (bench.scale.model.replicate of the trace's node list,
read from ../shared/traces/openb), fills them with the first ``--fill`` GPU pods of the
default trace's stream (best-fit, as bench.scale.viewmem), and puts an
``extender.core.Extender`` (the chart's fgd with share prices, the trace's workload) over
an in-memory view of them. Then ``--calls`` pods of the stream (trace shapes, each a new
UID) go through filter over every node name, then prioritize over the names that passed,
as kube-scheduler sends them (nodeCacheCapable); after each pair the pod is placed on
the top-scored node (one node changes per pod, as binds change the live view).

Printed: p50/p99 ms of filter and prioritize in the core, of the HTTP layer's work around
them (request body parse + validate; the answer's encoding as extender.http does it), and
with ``--profile N`` the top N functions (by own time) of a cProfile over 100 more pairs.
Figures only: nothing here asserts a time. About 25 s at 5,000 nodes and 300 calls.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench import dra_stream as ds
from bench.replay import trace
from bench.scale import model
from bench.scale.viewmem import NOBODY, stream_of
from gpu_share.extender import validate
from gpu_share.extender.core import Extender, ExtenderSettings

try:
    from gpu_share.extender.http import encode_priorities
except ImportError:  # a tree before it (the "before" figures): json.dumps, as it was

    def encode_priorities(answer: Any) -> bytes:
        return json.dumps(answer).encode()

from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import (
    ClusterIndex,
    ClusterPolicy,
    TieBreak,
    Workload,
    make_policy,
)
from testkit.static_view import StaticView

KEY = b"extender-calls-bench-key-0123456789"


class View(StaticView):
    """The ClusterView the extender reads: the index's nodes, as they are now (the index
    changes its one dict of nodes in place); a pod that lands is committed to it."""

    def __init__(self, index: ClusterIndex, load: Workload) -> None:
        super().__init__(index.nodes, load)
        self.index = index


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def line(label: str, xs: Sequence[float]) -> str:
    return (f"  {label:<34} p50 {pct(xs, 0.5):7.2f}  p99 {pct(xs, 0.99):7.2f}  "
            f"mean {statistics.fmean(xs):7.2f} ms")


def setup(a: argparse.Namespace) -> tuple[Extender, View, list[str], list[trace.TracePod]]:
    nodes = model.replicate(trace.load_nodes(units=model.UNITS), a.nodes, "x")
    capacity = ds.capacity_milli(nodes)
    trace_pods = trace.load_pods(trace.trace_dir() / "openb_pod_list_default.csv")
    load = ds.workload(trace_pods)
    pods = stream_of(trace_pods, a.seed, capacity, a.fill + a.calls)
    index = ClusterIndex(make_policy("best-fit", load), list(nodes), TieBreak.DETERMINISTIC)
    for p in pods[: a.fill]:
        index.place(p.demand(model.UNITS))
    view = View(index, load)
    policy = make_policy(a.policy, load)

    def factory(_: Any) -> ClusterPolicy:
        return policy

    settings = ExtenderSettings(ResourceNames(ds.MEM, ds.CORE), "vendor.com", KEY)
    ext = Extender(settings, view, None, factory)  # type: ignore[arg-type]
    return ext, view, [n.name for n in nodes], pods[a.fill:]


def calls(ext: Extender, view: View, names: list[str], pods: Sequence[trace.TracePod],
          tag: str) -> dict[str, list[float]]:
    """One filter + prioritize pair per pod; times in ms per part."""
    out: dict[str, list[float]] = {
        k: [] for k in ("filter", "prioritize", "filter parse", "filter encode",
                        "prioritize parse", "prioritize encode")
    }
    for i, p in enumerate(pods):
        body = model.vcuda_pod(f"{tag}-{i}", p, NOBODY, "bench")
        body["metadata"]["uid"] = f"{tag}-{i}"
        raw = json.dumps({"Pod": body, "NodeNames": names}).encode()
        t0 = time.perf_counter()
        args = validate.filter_args(validate.parse_json(raw))
        t1 = time.perf_counter()
        got = ext.filter(args)
        t2 = time.perf_counter()
        json.dumps(got).encode()
        t3 = time.perf_counter()
        raw = json.dumps({"Pod": body, "NodeNames": got["NodeNames"] or []}).encode()
        t4 = time.perf_counter()
        args = validate.filter_args(validate.parse_json(raw))
        t5 = time.perf_counter()
        prio = ext.prioritize(args)
        t6 = time.perf_counter()
        encode_priorities(prio)
        t7 = time.perf_counter()
        out["filter"].append(1e3 * (t2 - t1))
        out["filter parse"].append(1e3 * (t1 - t0))
        out["filter encode"].append(1e3 * (t3 - t2))
        out["prioritize"].append(1e3 * (t6 - t5))
        out["prioritize parse"].append(1e3 * (t5 - t4))
        out["prioritize encode"].append(1e3 * (t7 - t6))
        best = max(prio, key=lambda h: h["Score"], default=None)
        if best is not None and best["Score"] > 0:  # the pod lands: one node changes
            pl = ext._evaluate([best["Host"]], p.demand(model.UNITS))[best["Host"]]
            if not hasattr(pl, "reason"):
                view.index.commit(p.demand(model.UNITS), pl)  # type: ignore[arg-type]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--fill", type=int, default=6000, help="pods placed before the calls")
    ap.add_argument("--policy", default="fgd")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--profile", type=int, default=0, help="top N of a cProfile pass")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    ext, view, names, pods = setup(a)
    print(f"{len(names)} nodes, {a.fill} pods placed, policy {a.policy}, "
          f"setup {time.perf_counter() - t0:.1f} s")
    rng = random.Random(a.seed)
    probe = list(pods)
    rng.shuffle(probe)
    warm = calls(ext, view, names, probe[: min(20, len(probe))], "warm")
    del warm
    got = calls(ext, view, names, probe, "call")
    print(f"{len(probe)} filter+prioritize pairs over {len(names)} names:")
    for k, xs in got.items():
        print(line(k, xs))
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        calls(ext, view, names, probe[:100], "prof")
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(a.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
