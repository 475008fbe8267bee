"""The pod and cluster-view watches run supervised: a line the parser
chokes on (a deeply nested array: RecursionError) or any other failure is counted per
loop, the watch relists after a pause and goes on; the loops beat their heartbeats.

Both run on ``kube.listwatch.ListWatch``, which pauses itself and reports a
failure to its owner's ``on_error`` (the supervisor's hook signature); the supervisor
keeps the heartbeats."""

from __future__ import annotations

import threading
from typing import Any

from kube_fakes import Call, FakeStream, fake_rest, pod_obj

from gpu_share.config.model import ResourcesConfig
from gpu_share.kube.cluster_view import KubeClusterView
from gpu_share.kube.pods import KubePodSource, NodePodCache
from gpu_share.observability.loops import Backoff, LoopSupervisor
from gpu_share.sharing.placement import Shape, Workload
from testkit.harness.wait import poll

FAST = Backoff(0.01, 0.05)



def _poisoned_then_fine(list_items: Any) -> tuple[Any, dict[str, int]]:
    """Handler: lists answer ``list_items(n)``; the first watch sends a nested array, the
    later ones block (a quiet, healthy watch)."""
    counts = {"lists": 0, "watches": 0}
    lock = threading.Lock()

    def handler(call: Call) -> Any:
        with lock:
            if call.query.get("watch") == "true":
                counts["watches"] += 1
                s = FakeStream(block=True)
                if counts["watches"] == 1:
                    s._q.put(b"[" * 100_000 + b"\n")
                return s
            counts["lists"] += 1
            return 200, {"metadata": {"resourceVersion": str(counts["lists"])},
                         "items": list_items(counts["lists"])}

    return handler, counts


def test_pod_watch_survives_a_nested_array_and_counts_it() -> None:
    handler, counts = _poisoned_then_fine(
        lambda n: [pod_obj("a")] if n == 1 else [pod_obj("a"), pod_obj("b")]
    )
    api, _ = fake_rest(handler)
    errors: list[str] = []
    sup = LoopSupervisor(backoff=FAST)
    cache = NodePodCache(
        KubePodSource.from_config(api, ResourcesConfig()), "node-a", loops=sup,
        on_error=errors.append, backoff_s=(0.01, 0.05),
    )
    cache.start()
    try:
        assert poll(lambda: counts["lists"] >= 2 and cache.synced)
        assert errors == ["pod-watch"]
        assert sorted(p.name for p in cache.list_node_pods("node-a")) == ["a", "b"]
        assert sup.alive()
    finally:
        cache.stop(timeout=5)
    assert cache._watch.thread is not None and not cache._watch.thread.is_alive()


def test_cluster_view_watches_survive_a_nested_array_and_count_it() -> None:
    handler, counts = _poisoned_then_fine(lambda n: [])
    api, _ = fake_rest(handler)
    errors: list[str] = []
    sup = LoopSupervisor(backoff=FAST)
    view = KubeClusterView(
        api,
        domain="vendor.com",
        memory_resource="vendor.com/vcuda-memory",
        core_resource="vendor.com/vcuda-core",
        default_workload=Workload([Shape(4, 25, 1.0)]),
        decision_key=b"k" * 32,
        on_error=errors.append,
    )
    view.start(sup)
    try:
        assert view.wait_synced(10)
        # One of the two watches got the poisoned line, failed once, relisted.
        assert poll(lambda: len(errors) == 1 and counts["lists"] >= 3)
        assert errors[0] in ("view-nodes", "view-pods")
        assert view.loops is sup and sup.alive()
    finally:
        view.stop()
