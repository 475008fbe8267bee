"""bench.scale in small, as a correctness test: 200 kwok nodes from the openb node list,
300 trace pods one at a time through kube-scheduler + gpu-share-extender (its own
process, the chart's scheduler configuration). No pod may land where no device fits,
and the allocation must equal the simulator's for the same nodes and pods. No timing
is asserted (docs/scale.md has the figures).

Needs the local cluster (hack/local-up-cluster.sh up) and kwok (hack/build-kwok.sh,
which hack/test.sh runs); removes every node, namespace and process it made.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from testkit.harness import live_cluster, loud_skip

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]


def test_extender_places_like_the_simulator_on_kwok_nodes(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    live_cluster(request, "scale test (kwok)")
    built = subprocess.run(
        ["bash", str(ROOT / "hack" / "build-kwok.sh"), "--print"], capture_output=True,
        text=True, check=False,
    )
    if built.returncode != 0:
        loud_skip("scale test (kwok)", "kwok is not built (hack/build-kwok.sh)")
    from bench.scale.__main__ import main

    out = tmp_path / "figures.json"
    rc = main([
        "--nodes", "200", "--pods", "300", "--paths", "extender", "--rates", "seq",
        "--settle", "20", "--stream-timeout", "240", "--lock-timeout", "60",
        "--out", str(out),
    ])
    assert rc == 0
    doc = json.loads(out.read_text())
    (ext,) = doc["paths"]
    assert ext["pods"] == 300
    assert ext["bound"] + ext["unschedulable"] == 300
    assert ext["misplaced"] == 0
    assert ext["alloc_pct"] == pytest.approx(doc["sim_alloc_pct"], abs=1e-9)
    assert ext["api_requests"] > 0  # the instrumented extender answered
