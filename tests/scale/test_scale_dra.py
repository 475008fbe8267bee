"""bench.scale's DRA path on kube-scheduler v1.36 (hack/cluster/build.sh k8s-136), as a
correctness test: kwok nodes from the openb node list, the trace's multi-GPU pods (2, 4 and
8 whole GPUs, the claims whose device search made v1.35's allocator backtrack, see
docs/dra-allocator.md) streamed at once until they ask all the GPUs, each rewritten into
a claim by the webhook's translation. Every pod that fits must bind: at the end no unbound
pod fits on any node (CPU, memory and enough devices with room, from the claims), and no
device is over capacity. No timing is asserted (docs/scale.md).

Needs the local cluster, kwok and the v1.36 kube-scheduler, which the test command builds
in the background (tests/scale/kwok.py waits for it where the cluster is required).
Removes every node, namespace and process it made.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scale.kwok import dra_136_path

pytestmark = pytest.mark.cluster

# 40 openb nodes (15 with 8 GPUs, 2 with 4, 23 with 2: 174 GPUs) and the trace's pods that
# ask 2, 4 or 8 whole GPUs up to all of them (31 pods): 8-GPU claims tried on nodes with
# 6 or fewer free devices, where v1.35 walked every ordering (docs/dra-allocator.md).
NODES = "40"


def test_multi_gpu_claims_bind_wherever_they_fit_on_kube_scheduler_136(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    doc, dra = dra_136_path(
        request, tmp_path / "dra.json", "scale test (kwok, DRA on kube-scheduler 1.36)",
        "--nodes", NODES, "--min-gpus", "2", "--paths", "dra", "--rates", "0",
        "--stream-timeout", "300",
    )
    assert doc["dra_scheduler"] == "1.36"
    assert any("kube-scheduler: Kubernetes v1.36." in n for n in dra["notes"]), dra["notes"]
    assert dra["pods"] > 0
    assert dra["bound"] > 0
    assert dra["misplaced"] == 0  # devices over capacity in the claims
    assert dra["unbound_fit"] == 0, dra["notes"]
