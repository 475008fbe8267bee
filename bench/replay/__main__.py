"""Replay the openb trace: ``python -m bench.replay [--traces default,...] [--out DIR]``.

Prints, per trace file and per model-restricted variant of the default trace
(``bench/replay/restrict.py``: model10, model20, model25, model33), the GPU allocation %
(allocated GPU-milli / capacity) at arrived = 90..130 % of capacity, mean over the seeds,
per policy and tie-break, and the decision time p50/p99; writes ``<out>/<trace>.png``
(unallocated % vs arrived %) and ``<out>/results.json``.

``--sample off,100,50,0`` adds kube-scheduler's node sampling (``sampling.py``;
percentageOfNodesToScore, 0 = adaptive, off = every node a candidate as before);
``--nodes N`` replicates the node list to N nodes (as ``bench.scale`` does);
``--until PCT`` stops arrivals at PCT % of capacity (cheaper when only 100 % matters).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.replay import restrict, sampling, sim, trace

POLICIES = ("fgd", "best-fit", "packing", "random", "dotprod", "clustering")
TIES = ("deterministic", "random")
# FGD paper (Weng et al., ATC'23), allocation % at 100 % arrived, lexicographic ties. The
# gpuspec figures (10 seeds) are on the paper's own gpuspec files, not on our variants.
PUBLISHED = {
    "default": {
        "fgd": 95.23,
        "best-fit": 92.86,
        "packing": 91.78,
        "clustering": 91.65,
        "dotprod": 90.62,
        "random": 86.30,
    },
    "gpushare40": {"fgd": 93.96},
    "gpushare100": {"fgd": 86.64},
    "multigpu50": {"fgd": 97.09},
    "model10": {"fgd": 94.66, "best-fit": 93.10},
    "model20": {"fgd": 94.66, "best-fit": 88.46},
    "model25": {"fgd": 93.91, "best-fit": 85.67},
    "model33": {"fgd": 87.84, "best-fit": 80.39},
}


def _stem(f: Path) -> str:
    return f.stem.removeprefix("openb_pod_list_")


def load(name: str, nodes: list[Any]) -> list[trace.TracePod]:
    """A trace file's pods, or a model-restricted variant's."""
    if name in restrict.VARIANTS:
        return restrict.variant_pods(name, nodes)
    return trace.load_pods(trace.trace_dir() / f"openb_pod_list_{name}.csv")


Job = tuple[str, str, str, int, int | None]  # trace, policy, tie-break, seed, sample


@dataclass(frozen=True)
class Setup:
    """What every job of one invocation shares besides its ``Job``."""

    nodes: int = 0  # replicate the node list to this many (0: as it is)
    until: float = 0.0  # stop arrivals at this % of capacity (0: the whole order)
    retry: bool = True  # sampled: retry a pod in the next windows (kube-scheduler requeues)


def _job(args: Job, setup: Setup = Setup()) -> dict[str, Any]:
    name, policy, tie, seed, sample = args
    nodes = trace.load_nodes()
    if setup.nodes:
        from bench.scale.model import replicate

        nodes = replicate(nodes, setup.nodes, "s")
    pods = load(name, nodes)
    capacity = sum(len(n.devices) for n in nodes) * trace.GPU_MILLI
    order = trace.arrival_order(pods, seed, capacity)
    if setup.until:
        order = _cut(order, setup.until * capacity / 100)
    r = sim.run(
        nodes,
        order,
        sim.workload_of(pods),
        policy,
        tie,
        seed,
        sample=sample,
        sample_retry=setup.retry,
    )
    ds = sorted(r.decision_s)
    return {
        "trace": name,
        "policy": policy,
        "tie": tie,
        "seed": seed,
        "sample": sample,
        "retry": setup.retry,
        "nodes": len(nodes) if setup.nodes else 0,
        "windows": r.windows,
        "candidates": r.candidates,
        "allocation": r.allocation,
        "curve": r.curve,
        "p50_ms": 1e3 * ds[len(ds) // 2],
        "p99_ms": 1e3 * ds[int(len(ds) * 0.99)],
        "placed": r.placed,
        "failed": r.failed,
    }


def _cut(order: list[trace.TracePod], milli: float) -> list[trace.TracePod]:
    """The arrivals up to the first that brings the requests to ``milli``."""
    total = 0
    for i, p in enumerate(order):
        total += p.gpu_request
        if total >= milli:
            return order[: i + 1]
    return order


def _sample(text: str) -> int | None:
    return None if text == "off" else int(text)


def _key(r: dict[str, Any]) -> tuple[str, str, str, int, int | None]:
    return (r["trace"], r["policy"], r["tie"], r["seed"], r.get("sample"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replay")
    ap.add_argument("--traces", default="", help="comma-separated names (default: all files)")
    ap.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"also {sim.BLIND}: fgd with requirements left out of its workload, "
        f"{sim.UNPRICED}: fgd without share prices (bench only)",
    )
    ap.add_argument("--ties", default=",".join(TIES))
    ap.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 42,43")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--sample",
        default="off",
        help="comma-separated percentageOfNodesToScore values to replay (0 = adaptive, "
        "off = no sampling), e.g. off,100,50,30,20,10,0",
    )
    ap.add_argument(
        "--sample-once",
        action="store_true",
        help="sampled: a pod its window cannot take fails (default: it is retried in the "
        "next windows until they covered every node)",
    )
    ap.add_argument("--nodes", type=int, default=0, help="replicate the node list to N nodes")
    ap.add_argument("--until", type=float, default=0.0, help="stop arrivals at this %% of capacity")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="print tables and plots from <out>/results.jsonl of an earlier run",
    )
    ap.add_argument(
        "--markdown",
        action="store_true",
        help="with --report-only: also print the summary tables of docs/placement.md",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep <out>/results.jsonl and run only the runs it lacks",
    )
    ap.add_argument(
        "--out",
        default=str(Path(tempfile.gettempdir()) / "gpu-share-replay"),
        help="plots and results.json go here (keep it out of the repository)",
    )
    a = ap.parse_args(argv)
    if "-" in a.seeds:
        lo, hi = a.seeds.split("-")
        seeds = list(range(int(lo), int(hi) + 1))
    else:
        seeds = [int(s) for s in a.seeds.split(",")]
    names = [_stem(f) for f in trace.trace_files()] + list(restrict.VARIANTS)
    if a.traces:
        wanted = set(a.traces.split(","))
        names = [n for n in names if n in wanted]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "results.jsonl"  # one line per finished run: a long run never loses work
    if a.report_only:
        report(_read(log), out)
        if a.markdown:
            markdown(_read(log))
            sampling.markdown(_read(log))
        return 0
    done = _read(log) if a.resume else []
    if not a.resume:
        log.write_text("")
    have = {_key(r) for r in done}
    jobs: list[Job] = [
        (n, p, t, s, x)
        for n in names
        for p in a.policies.split(",")
        for t in a.ties.split(",")
        for s in seeds
        for x in [_sample(v) for v in a.sample.split(",")]
        if (n, p, t, s, x) not in have
    ]
    setup = Setup(a.nodes, a.until, not a.sample_once)
    results = list(done)
    with ProcessPoolExecutor(max_workers=a.workers) as ex, log.open("a") as f:
        for fut in as_completed([ex.submit(_job, j, setup) for j in jobs]):
            r = fut.result()
            results.append(r)
            f.write(json.dumps(r) + "\n")
            f.flush()
    (out / "results.json").write_text(json.dumps(results))
    report(results, out)
    return 0


Groups = dict[tuple[str, str, str], list[dict[str, Any]]]


def _groups(results: list[dict[str, Any]]) -> Groups:
    """Runs by (trace, policy, tie-break); a scaled cluster and a sampling percentage
    label the trace and the policy (``default@5000n``, ``fgd@10%``)."""
    out: Groups = {}
    for r in results:
        tr = str(r["trace"]) + (f"@{r['nodes']}n" if r.get("nodes") else "")
        pol = str(r["policy"]) + sampling.tag(r.get("sample"), r.get("retry", True))
        out.setdefault((tr, pol, str(r["tie"])), []).append(r)
    return out


def _at(r: dict[str, Any], cp: int) -> float:
    """Allocation % of run ``r`` at checkpoint ``cp`` (JSON turned the keys into text)."""
    alloc = r["allocation"]
    return float(alloc[str(cp)] if str(cp) in alloc else alloc.get(cp, float("nan")))


def _read(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def report(results: list[dict[str, Any]], out: Path) -> None:
    groups = _groups(results)
    cps = sim.CHECKPOINTS
    for tr in sorted({k[0] for k in groups}):
        print(f"\n== {tr}: GPU allocation % at arrived % (mean of seeds)")
        print(
            f"{'policy':<10} {'ties':<13} {'n':>2} "
            + " ".join(f"{c:>6}" for c in cps)
            + "  p50ms  p99ms"
        )
        for (t, pol, tie), rs in sorted(groups.items()):
            if t != tr:
                continue
            means = [statistics.fmean(_at(r, c) for r in rs) for c in cps]
            p50 = statistics.fmean(float(r["p50_ms"]) for r in rs)
            p99 = max(float(r["p99_ms"]) for r in rs)
            print(
                f"{pol:<10} {tie:<13} {len(rs):>2} "
                + " ".join(f"{m:6.2f}" for m in means)
                + f" {p50:6.2f} {p99:6.2f}"
            )
        pub = PUBLISHED.get(tr)
        if pub:
            ref = ", ".join(f"{k} {v}" for k, v in pub.items())
            print(f"published (FGD paper, 100 % arrived): {ref}")
        plot(tr, {k: v for k, v in groups.items() if k[0] == tr}, out)
    sys.stdout.flush()


def markdown(results: list[dict[str, Any]]) -> None:
    """Allocation % at 100 % arrived per trace, policy and tie-break (mean of seeds)."""
    groups = _groups(results)
    present = {(k[1], k[2]) for k in groups}
    cols = [(p, t) for p in (*POLICIES, sim.BLIND, sim.UNPRICED) for t in TIES if (p, t) in present]
    head = " | ".join(f"{p} {t[:4]}." for p, t in cols)
    print(f"\n| trace | seeds | {head} | published FGD / BestFit |")
    print("|---|---|" + "---|" * (len(cols) + 1))
    for tr in sorted({k[0] for k in groups}):
        cells, seeds = [], set()
        for p, t in cols:
            rs = groups.get((tr, p, t), [])
            if rs:
                seeds.add(len(rs))
            cells.append(f"{statistics.fmean(_at(r, 100) for r in rs):.2f}" if rs else "-")
        n = "/".join(str(x) for x in sorted(seeds))
        pub = PUBLISHED.get(tr, {})
        ref = " / ".join(str(pub.get(k, "-")) for k in ("fgd", "best-fit"))
        print(f"| {tr} | {n} | " + " | ".join(cells) + f" | {ref} |")
    print("\n| trace | ties | fgd at 90 / 95 / 100 / 110 / 130 % arrived | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for (tr, p, t), rs in sorted(groups.items()):
        if p != "fgd":
            continue
        at = " / ".join(
            f"{statistics.fmean(_at(r, c) for r in rs):.2f}" for c in (90, 95, 100, 110, 130)
        )
        p50 = statistics.median(float(r["p50_ms"]) for r in rs)
        p99 = statistics.median(float(r["p99_ms"]) for r in rs)
        print(f"| {tr} | {t} | {at} | {p50:.1f} | {p99:.1f} |")


def plot(tr: str, groups: Groups, out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib missing: pip install -e '.[bench]' for plots)")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (_, pol, tie), rs in sorted(groups.items()):
        curve = rs[0]["curve"]  # first seed; curves of seeds differ only slightly
        xs = [float(x) for x, _ in curve]
        ys = [float(y) for _, y in curve]
        ax.plot(xs, ys, label=f"{pol} ({tie})", linestyle="-" if tie == "deterministic" else "--")
    ax.set_xlabel("arrived GPU requests (% of capacity)")
    ax.set_ylabel("unallocated GPU (% of capacity)")
    ax.set_xlim(80, 130)
    ax.set_ylim(0, 20)
    ax.set_title(f"openb {tr}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"{tr}.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
