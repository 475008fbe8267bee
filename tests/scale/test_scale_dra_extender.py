"""bench.scale's dra+extender path as a correctness test: kwok nodes from the openb node
list, the default trace's GPU pods up to all the GPUs, one at a time (the simulator's
order), each rewritten by the webhook's translation with ``--mark-for-extender`` (one
claim, the vcuda keys kept at "0"), through kube-scheduler v1.36 with DRA consumable
capacity and the gpu-share extender in its own process ranking the nodes.

Asserts what the path promises: no device over capacity in the claims (the allocator
picks the devices), the allocation equal to the first-fit simulator's (fgd's node for the
devices the allocator takes; within 0.3 pp: a tie between equally scored nodes is
kube-scheduler's to break), no unbound pod that would fit on a node at the end, and every
bound pod carries the extender's signed decision (its bind ran). No timing is asserted
(docs/scale.md).

Needs the local cluster, kwok and the v1.36 kube-scheduler (tests/scale/kwok.py). Removes
every node, namespace and process it made.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scale.kwok import dra_136_path

pytestmark = pytest.mark.cluster

def test_dra_pods_ranked_by_the_extender_place_as_the_first_fit_simulator(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # 40 openb nodes (174 GPUs), the stream's first 198 pods: under kube-scheduler's
    # 100-node floor for sampling, so every node is tried for every pod, as in the simulator.
    doc, drx = dra_136_path(
        request, tmp_path / "drx.json", "scale test (kwok, DRA + extender, kube-scheduler 1.36)",
        "--nodes", "40", "--paths", "dra+extender", "--rates", "seq", "--stream-timeout", "600",
    )
    notes = drx["notes"]
    assert drx["path"] == "dra+extender seq"
    assert any("kube-scheduler: Kubernetes v1.36." in n for n in notes), notes
    assert drx["pods"] > 0
    assert drx["bound"] > 0
    assert drx["misplaced"] == 0, notes  # devices over capacity in the claims
    assert drx["unbound_fit"] == 0, notes
    assert abs(drx["alloc_pct"] - doc["sim_first_fit_pct"]) <= 0.3, (
        drx["alloc_pct"], doc["sim_first_fit_pct"], doc["sim_alloc_pct"],
    )
    # The extender ranked and bound them: every bound pod has its signed decision, and
    # it answered filter and prioritize for each decided pod.
    assert f"{drx['bound']} of {drx['bound']} bound pods carry the extender's decision" in notes
    assert len(drx["filter_ms"]) >= drx["bound"]
    assert len(drx["bind_ms"]) == drx["bound"]
