"""Replay the openb trace: ``python -m bench.replay [--traces default,...] [--out DIR]``.

Prints, per trace file, the GPU allocation % (allocated GPU-milli / capacity) at arrived
= 90..130 % of capacity, mean over the seeds, per policy and tie-break, and the decision
time p50/p99; writes ``<out>/<trace>.png`` (unallocated % vs arrived %) and
``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from bench.replay import sim, trace

POLICIES = ("fgd", "best-fit", "packing", "random")
TIES = ("deterministic", "random")


def _job(args: tuple[str, str, str, int]) -> dict[str, Any]:
    trace_file, policy, tie, seed = args
    nodes = trace.load_nodes()
    pods = trace.load_pods(Path(trace_file))
    capacity = sum(len(n.devices) for n in nodes) * trace.GPU_MILLI
    order = trace.arrival_order(pods, seed, capacity)
    r = sim.run(nodes, order, sim.workload_of(pods), policy, tie, seed)
    ds = sorted(r.decision_s)
    return {
        "trace": Path(trace_file).stem.removeprefix("openb_pod_list_"),
        "policy": policy,
        "tie": tie,
        "seed": seed,
        "allocation": r.allocation,
        "curve": r.curve,
        "p50_ms": 1e3 * ds[len(ds) // 2],
        "p99_ms": 1e3 * ds[int(len(ds) * 0.99)],
        "placed": r.placed,
        "failed": r.failed,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replay")
    ap.add_argument("--traces", default="", help="comma-separated names (default: all files)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--ties", default=",".join(TIES))
    ap.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 42,43")
    ap.add_argument("--workers", type=int, default=2)
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
    files = trace.trace_files()
    if a.traces:
        wanted = set(a.traces.split(","))
        files = [f for f in files if f.stem.removeprefix("openb_pod_list_") in wanted]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "results.jsonl"  # one line per finished run: a long run never loses work
    if a.report_only:
        report(_read(log), out)
        if a.markdown:
            markdown(_read(log))
        return 0
    done = _read(log) if a.resume else []
    if not a.resume:
        log.write_text("")
    have = {(r["trace"], r["policy"], r["tie"], r["seed"]) for r in done}
    jobs = [
        (str(f), p, t, s)
        for f in files
        for p in a.policies.split(",")
        for t in a.ties.split(",")
        for s in seeds
        if (f.stem.removeprefix("openb_pod_list_"), p, t, s) not in have
    ]
    results = list(done)
    with ProcessPoolExecutor(max_workers=a.workers) as ex, log.open("a") as f:
        for fut in as_completed([ex.submit(_job, j) for j in jobs]):
            r = fut.result()
            results.append(r)
            f.write(json.dumps(r) + "\n")
            f.flush()
    (out / "results.json").write_text(json.dumps(results))
    report(results, out)
    return 0


Groups = dict[tuple[str, str, str], list[dict[str, Any]]]


def _groups(results: list[dict[str, Any]]) -> Groups:
    """Runs by (trace, policy, tie-break)."""
    out: Groups = {}
    for r in results:
        out.setdefault((str(r["trace"]), str(r["policy"]), str(r["tie"])), []).append(r)
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
        plot(tr, {k: v for k, v in groups.items() if k[0] == tr}, out)
    sys.stdout.flush()


def markdown(results: list[dict[str, Any]]) -> None:
    """Allocation % at 100 % arrived per trace, policy and tie-break (mean of seeds)."""
    groups = _groups(results)
    cols = [(p, t) for p in POLICIES for t in TIES]
    print("\n| trace | seeds | " + " | ".join(f"{p} {t[:4]}." for p, t in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for tr in sorted({k[0] for k in groups}):
        cells, seeds = [], set()
        for p, t in cols:
            rs = groups.get((tr, p, t), [])
            if rs:
                seeds.add(len(rs))
            cells.append(f"{statistics.fmean(_at(r, 100) for r in rs):.2f}" if rs else "-")
        n = "/".join(str(x) for x in sorted(seeds))
        print(f"| {tr} | {n} | " + " | ".join(cells) + " |")
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
