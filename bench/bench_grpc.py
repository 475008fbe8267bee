"""Latency of GetPreferredAllocation and Allocate over real unix sockets.

    python -m bench.bench_grpc [--calls 2000] [--concurrency 8]

Serves a handler through ``PluginServer`` exactly as the agent does and calls it as the
kubelet does: N sequential calls, then the same number spread over C concurrent callers.
The handler is injectable: ``run(handler_factory=...)`` (default: a trivial in-memory
handler), so the lead can point it at the real agent.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpu_share.plugin.handler import ResourceHandler
from gpu_share.plugin.server import PluginServer, ServeOptions
from testkit.fake_handler import FakeHandler
from testkit.kubelet_stub import PluginClient


def _percentiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return p50, p99, ordered[-1]


def _time_calls(call: Callable[[], object], count: int) -> list[float]:
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def _concurrent(
    make_call: Callable[[], Callable[[], object]], total: int, workers: int
) -> list[float]:
    per = max(1, total // workers)
    results: list[list[float]] = [[] for _ in range(workers)]
    start = threading.Barrier(workers)

    def worker(i: int) -> None:
        call = make_call()
        start.wait(30)
        results[i] = _time_calls(call, per)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return [s for r in results for s in r]


def run(
    calls: int = 2000,
    concurrency: int = 8,
    handler_factory: Callable[[], ResourceHandler] = FakeHandler,
) -> dict[str, tuple[float, float, float]]:
    """Return {label: (p50_s, p99_s, max_s)} and print a table."""
    tmp = Path(tempfile.mkdtemp(prefix="gsb-", dir="/tmp"))
    handler = handler_factory()
    server = PluginServer(
        handler, tmp / handler.endpoint, ServeOptions(max_workers=concurrency + 4)
    )
    server.start()
    clients: list[PluginClient] = []
    available = [f"dev-{i}" for i in range(64)]

    def client() -> PluginClient:
        c = PluginClient(server.socket_path)
        clients.append(c)
        return c

    def gpa_call() -> Callable[[], object]:
        c = client()
        return lambda: c.preferred_allocation(available, [], 4)

    def alloc_call() -> Callable[[], object]:
        c = client()
        return lambda: c.allocate(available[:4])

    figures: dict[str, tuple[float, float, float]] = {}
    try:
        for name, make in (("GetPreferredAllocation", gpa_call), ("Allocate", alloc_call)):
            warm = make()
            _time_calls(warm, min(100, calls))
            figures[f"{name} x{calls} sequential"] = _percentiles(_time_calls(warm, calls))
            figures[f"{name} x{calls} over {concurrency} callers"] = _percentiles(
                _concurrent(make, calls, concurrency)
            )
    finally:
        for c in clients:
            c.close()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    width = max(len(k) for k in figures)
    print(f"{'call':<{width}}  {'p50 ms':>8}  {'p99 ms':>8}  {'max ms':>8}")
    for label, (p50, p99, worst) in figures.items():
        print(f"{label:<{width}}  {p50 * 1e3:8.3f}  {p99 * 1e3:8.3f}  {worst * 1e3:8.3f}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    ns = parser.parse_args(argv)
    run(ns.calls, ns.concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
