"""Offline packing estimates for the replay: ``python -m bench.replay.bound [--traces ..]``.

What could any placement do with the pods that have arrived by 100 % of capacity, if it
saw them all at once? Shares (< 1000 milli, one device) are packed best-fit decreasing
into devices; whole-device pods take whole devices. Host CPU/memory and node boundaries
are ignored, so both figures are estimates, neither of them a bound (best-fit
decreasing is not optimal). The proven upper bound, with share-level integrality, host
CPU/memory and node boundaries, is ``python -m bench.replay.hostbound``.

* ``fill``: allocation % if the cluster's devices were filled as densely as the offline
  packing fills its devices on average (a placer that refuses nothing that fits);
* ``drop``: allocation % when the packing needs more devices than exist and the
  emptiest devices are the ones left out (an oracle that turns away the most wasteful
  pods, e.g. 810-milli ones whose 190-milli remainder almost nothing can use).

``waste>500`` is the part of the packing's waste on devices holding a share above 500
milli (their remainder fits only small pods).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.replay import trace


def pack(shares: list[int], size: int = trace.GPU_MILLI) -> list[tuple[int, int]]:
    """Best-fit decreasing; returns (largest item, free left) per device used."""
    by_free: dict[int, list[int]] = {}  # free amount -> device ids
    bins: list[list[int]] = []  # [largest, free]
    for s in sorted(shares, reverse=True):
        fits = [f for f in by_free if f >= s and by_free[f]]
        if fits:
            f = min(fits)
            i = by_free[f].pop()
            bins[i][1] -= s
        else:
            i = len(bins)
            bins.append([s, size - s])
        by_free.setdefault(bins[i][1], []).append(i)
    return [(b[0], b[1]) for b in bins]


def estimate(pods: list[trace.TracePod], devices: int) -> dict[str, float]:
    cap = devices * trace.GPU_MILLI
    shares = [p.gpu_milli for p in pods if p.num_gpu == 1 and p.gpu_milli < trace.GPU_MILLI]
    whole = sum(p.num_gpu for p in pods if p.gpu_milli >= trace.GPU_MILLI)
    bins = pack(shares)
    asked = sum(p.gpu_request for p in pods)
    used = len(bins) + whole
    waste = sum(f for _, f in bins)
    big = sum(f for top, f in bins if top > trace.GPU_MILLI // 2)
    fill = asked / (used * trace.GPU_MILLI)  # mean fill of a device in the packing
    contents = sorted(trace.GPU_MILLI - f for _, f in bins)
    over = max(0, used - devices)
    dropped = sum(contents[:over])
    return {
        "arrived": 100 * asked / cap,
        "devices_needed": used,
        "waste": 100 * waste / cap,
        "waste_big": 100 * big / cap,
        "fill": 100 * min(asked, fill * cap) / cap,
        "drop": 100 * (asked - dropped) / cap,
    }


def arrived_by(pods: list[trace.TracePod], seed: int, cap: int, pct: float) -> list[trace.TracePod]:
    out, total = [], 0
    for p in trace.arrival_order(pods, seed, cap):
        if total + p.gpu_request > cap * pct / 100:
            break
        total += p.gpu_request
        out.append(p)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replay.bound")
    ap.add_argument("--traces", default="")
    ap.add_argument("--seeds", default="42-51")
    a = ap.parse_args(argv)
    lo, _, hi = a.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    nodes = trace.load_nodes()
    devices = sum(len(n.devices) for n in nodes)
    cap = devices * trace.GPU_MILLI
    files = trace.trace_files()
    if a.traces:
        files = [f for f in files if f.stem.removeprefix("openb_pod_list_") in a.traces.split(",")]
    print("offline packing of the pods arrived by 100 % (mean of seeds; see module doc)")
    cols = f"{'needed':>7} {'waste%':>7} {'>500%':>6} {'fill%':>6} {'drop%':>6}"
    print(f"{'trace':<12} {'n':>2} {cols}")
    for f in files:
        pods = trace.load_pods(Path(f))
        rs = [estimate(arrived_by(pods, s, cap, 100), devices) for s in seeds]

        def m(k: str, rs: list[dict[str, float]] = rs) -> float:
            return statistics.fmean(r[k] for r in rs)

        name = f.stem.removeprefix("openb_pod_list_")
        print(
            f"{name:<12} {len(rs):>2} {m('devices_needed'):7.0f} {m('waste'):7.2f} "
            f"{m('waste_big'):6.2f} {m('fill'):6.2f} {m('drop'):6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
