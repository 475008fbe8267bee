"""``gpu-share-extender`` as its own process, instrumented for the bench:

    python -m bench.scale.extender_proc STATS_FILE [--workload FILE] -- <extender flags>

Runs the extender's own ``main`` (the console script's code) after wrapping
``Extender.filter``/``prioritize``/``bind`` with a timer, counting every request its
Kubernetes client sends (a watch counts once), and noting the RSS just before and just
after the cluster view's first list+watch sync (the view's memory). On SIGUSR1 it writes
everything to STATS_FILE (JSON, atomically), so the bench can read it between phases.
``--workload FILE`` (JSON ``[[memory units, cores, weight, cpu m, memory Mi], ...]``)
fixes fgd's target mix to the simulator's.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_DUR: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}
_API: dict[str, int] = {}
_MARK: dict[str, float] = {}
_NAMES: list[int] = []  # node names kube-scheduler sent in each filter call
_LOCK = threading.Lock()
_ASK = threading.Event()  # set by SIGUSR1: write the stats file


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            ms = 1e3 * (time.perf_counter() - t0)
            with _LOCK:
                _DUR[name].append(ms)

    return wrapper


def _names_counted(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``Extender.filter``: how many nodes kube-scheduler asked about (its sampling)."""
    def wrapper(self: Any, args: Any, *a: Any, **kw: Any) -> Any:
        names = args.get("NodeNames") if isinstance(args, dict) else None
        with _LOCK:
            _NAMES.append(len(names) if isinstance(names, list) else -1)
        return fn(self, args, *a, **kw)

    return wrapper


def _count(key: str) -> None:
    with _LOCK:
        _API[key] = _API.get(key, 0) + 1


def _counted(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``RestClient.request``: one count per call, by method and kind."""
    def wrapper(self: Any, op: str, method: str, path: str, *a: Any, **kw: Any) -> Any:
        _count(f"{method} {_kind(path)}")
        return fn(self, op, method, path, *a, **kw)

    return wrapper


def _counted_watch(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``RestClient.watch``: a watch counts once."""
    def wrapper(self: Any, *a: Any, **kw: Any) -> Any:
        _count("GET watch")
        return fn(self, *a, **kw)

    return wrapper


def _kind(url: str) -> str:
    """``/api/v1/namespaces/x/pods/y/binding`` -> ``pods/binding`` (no names)."""
    parts = url.split("?")[0].split("/")
    known = ("pods", "nodes", "binding", "bindings", "events", "leases", "resourceclaims")
    return "/".join(p for p in parts if p in known) or "other"


def _write(path: Path) -> None:
    with _LOCK:
        doc = {
            "durations_ms": {k: list(v) for k, v in _DUR.items()},
            "api": dict(_API),
            "marks": dict(_MARK),
            "filter_names": list(_NAMES),
            "rss_mib": rss_mib(),
            "cpu_s": sum(os.times()[:2]),
            "written": time.time(),
        }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def _instrument() -> None:
    from gpu_share.extender.core import Extender
    from gpu_share.kube.cluster_view import KubeClusterView
    from gpu_share.kube.rest import RestClient

    for verb in ("filter", "prioritize", "bind"):
        setattr(Extender, verb, _timed(verb, getattr(Extender, verb)))
    Extender.filter = _names_counted(Extender.filter)
    RestClient.request = _counted(RestClient.request)  # type: ignore[method-assign]
    RestClient.watch = _counted_watch(RestClient.watch)  # type: ignore[method-assign]

    start, synced = KubeClusterView.start, KubeClusterView.wait_synced

    def start_marked(self: Any, *a: Any, **kw: Any) -> Any:
        _MARK["rss_before_sync_mib"] = rss_mib()
        return start(self, *a, **kw)

    def synced_marked(self: Any, *a: Any, **kw: Any) -> Any:
        ok = synced(self, *a, **kw)
        _MARK["rss_synced_mib"] = rss_mib()
        _MARK["synced_at"] = time.time()
        _ASK.set()  # the bench waits for this first write
        return ok

    KubeClusterView.start = start_marked  # type: ignore[method-assign]
    KubeClusterView.wait_synced = synced_marked  # type: ignore[method-assign]


def fixed_policy(workload_file: Path) -> None:
    """The policy on one fixed mix (the simulator's) instead of the mix of pods seen, as
    testkit/scheduler.py runs it: the allocation is then comparable."""
    from gpu_share.cli import extender_main
    from gpu_share.sharing.placement import Shape, Workload, make_policy

    shapes = json.loads(workload_file.read_text())
    wl = Workload(
        Shape(int(m), int(c), float(w), int(cpu), int(mem)) for m, c, w, cpu, mem in shapes
    )

    def factory(name: str) -> Callable[[Any], Any]:
        pol = make_policy(name, wl if name == "fgd" else None)
        return lambda _view: pol

    extender_main._policy_factory = factory  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    """``STATS_FILE [--workload FILE] -- <extender flags>``."""
    workload = None
    if len(argv) > 2 and argv[1] == "--workload":
        workload = Path(argv[2])
        argv = [argv[0], *argv[3:]]
    if len(argv) < 2 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    stats = Path(argv[0])
    _instrument()
    if workload is not None:
        fixed_policy(workload)
    signal.signal(signal.SIGUSR1, lambda *_: _ASK.set())

    def writer() -> None:
        while True:
            _ASK.wait()
            _ASK.clear()
            _write(stats)

    threading.Thread(target=writer, daemon=True).start()
    from gpu_share.cli.extender_main import main as extender_main

    return extender_main(argv[2:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
