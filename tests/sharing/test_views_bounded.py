"""The engine remembers the pod specs of what the node has, not every pod it ever saw:
10,000 pods of churn (GPU pods that ended, pods without our resources) leave only the
views of the pods the kubelet and the ledger have now."""

from __future__ import annotations

from gpu_share.sharing.model import PodResourcesPod, PodResourcesView
from tests.sharing.helpers import ctr, engine, pod


def test_views_are_pruned_to_what_the_node_has() -> None:
    e = engine()
    running = pod("kept", ctr("main", 0, 0))
    for i in range(10_000):
        e.reconcile(PodResourcesView(()), {("default", f"p{i}"): pod(f"p{i}", ctr("c"))}, 1.0)
    e.reconcile(PodResourcesView((PodResourcesPod("default", "kept", ()),)),
                {("default", "kept"): running}, 2.0)
    # The last merge is kept one more pass (a pod being admitted), then only the node's.
    e.reconcile(PodResourcesView((PodResourcesPod("default", "kept", ()),)), None, 3.0)
    assert set(e._views.views) == {("default", "kept")}


def test_a_view_merged_since_the_last_pass_survives_it() -> None:
    e = engine()
    e.reconcile(PodResourcesView(()), {("default", "new"): pod("new", ctr("c", 2))}, 1.0)
    assert ("default", "new") in e._views.views  # being admitted: not in the list yet
    e.reconcile(PodResourcesView(()), None, 2.0)
    assert ("default", "new") not in e._views.views
