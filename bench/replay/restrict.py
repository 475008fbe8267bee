"""Model-restricted variants of the default trace (``model10`` ... ``model33``).

In the production cluster behind openb about a third of GPU pods require specific GPU
models (``gpu_spec``; FGD paper, Weng et al. ATC'23, §6.5), but every openb file has
``gpu_spec`` empty. These variants add requirements to the default trace:

* the GPU pods (``num_gpu * gpu_milli > 0``), sorted by name; a ``random.Random`` seeded
  with ``"models:<share>:<seed>"`` picks ``round(share * count)`` of them;
* each picked pod gets ONE model, drawn with that generator with probability
  proportional to the model's GPU count in the cluster (the cluster's model mix; the
  ``nodemix`` stress variants weigh a model by its node count instead), among
  the models that have at least one node able to hold the pod (enough GPUs, CPU and
  memory on one node), so no requirement is unsatisfiable by construction.

So every model is asked for about ``share`` of its capacity by pods that can only use
it, and the rest of the demand may go anywhere. The generator seed is fixed (0) by
default: a variant is one file, like the paper's, and the replay's seeds vary only the
arrival order. ``python -m bench.replay.restrict --share 0.2 [--seed 0] > FILE.csv``
writes a variant out (keep it out of the repository).
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from collections.abc import Sequence
from dataclasses import replace

from bench.replay import trace
from gpu_share.sharing.placement import NodeSlots

# name -> (share of GPU pods restricted, what a model's weight is: its GPUs or nodes)
VARIANTS = {
    "model10": (0.10, "gpus"),
    "model20": (0.20, "gpus"),
    "model25": (0.25, "gpus"),
    "model33": (0.33, "gpus"),
    # Stress: weights by node count ask more of the models with small nodes (T4, P100).
    "nodemix20": (0.20, "nodes"),
    "nodemix33": (0.33, "nodes"),
}
BASE = "default"
GEN_SEED = 0


NodeKind = tuple[int, int | None, int | None]  # GPUs, CPU milli, memory MiB


def _fits(p: trace.TracePod, k: NodeKind) -> bool:
    gpus, cpu, mem = k
    return (
        gpus >= p.num_gpu
        and (cpu is None or p.cpu_milli <= cpu)
        and (mem is None or p.memory_mib <= mem)
    )


def restrict(
    pods: Sequence[trace.TracePod],
    nodes: Sequence[NodeSlots],
    share: float,
    seed: int = GEN_SEED,
    by: str = "gpus",
) -> list[trace.TracePod]:
    """``pods`` with ``share`` of the GPU pods bound to one model each (see above);
    ``by="nodes"``: a model's weight is its node count instead of its GPU count."""
    rng = random.Random(f"models:{share}:{seed}" + ("" if by == "gpus" else f":{by}"))
    gpus: dict[str, int] = {}
    kinds: dict[str, set[NodeKind]] = {}
    for n in nodes:
        gpus[n.model] = gpus.get(n.model, 0) + (len(n.devices) if by == "gpus" else 1)
        kinds.setdefault(n.model, set()).add((len(n.devices), n.cpu_total, n.host_memory_total))
    models = sorted(gpus)
    gpu_pods = sorted(p.name for p in pods if p.gpu_request > 0)
    picked = set(rng.sample(gpu_pods, round(share * len(gpu_pods))))
    out = []
    for p in sorted(pods, key=lambda x: x.name):
        if p.name in picked:
            ok = [m for m in models if any(_fits(p, k) for k in kinds[m])]
            if ok:
                p = replace(p, gpu_spec=rng.choices(ok, weights=[gpus[m] for m in ok])[0])
        out.append(p)
    return out


def variant_pods(name: str, nodes: Sequence[NodeSlots]) -> list[trace.TracePod]:
    base = trace.load_pods(trace.trace_dir() / f"openb_pod_list_{BASE}.csv")
    share, by = VARIANTS[name]
    return restrict(base, nodes, share, by=by)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replay.restrict")
    ap.add_argument("--share", type=float, required=True, help="e.g. 0.2")
    ap.add_argument("--seed", type=int, default=GEN_SEED)
    ap.add_argument("--by", choices=["gpus", "nodes"], default="gpus")
    a = ap.parse_args(argv)
    nodes = trace.load_nodes()
    base = trace.load_pods(trace.trace_dir() / f"openb_pod_list_{BASE}.csv")
    w = csv.writer(sys.stdout)
    w.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"])
    for p in restrict(base, nodes, a.share, a.seed, a.by):
        w.writerow([p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
