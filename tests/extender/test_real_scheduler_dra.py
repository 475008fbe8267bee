"""DRA pods ranked by the extender on the real kube-scheduler (L4 without kubelets).

24 openb GPU nodes with the agent's ResourceSlices and a DeviceClass; the trace's GPU
pods (seed 42, up to 100 % of the GPUs asked), each as the admission webhook leaves it
with ``--mark-for-extender`` (claims from templates, vcuda keys at 0), one at a time
through a second kube-scheduler (DRA with consumable capacity) calling the extender
(in this process). kube-scheduler's allocator picks the devices; the extender ranks
the nodes by fgd's score of that first fit and records the claims' devices at bind.
Checked: allocation within 0.3 pp of the simulator of that path
(``simulate_first_fit``), every pod bound where that simulator puts it but for a few
ties, no device over capacity in the claims, and each bound pod's decision annotation
naming the device its claim was allocated.

Needs the local cluster (hack/local-up-cluster.sh up); cleans up what it made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import dra_placement as dp
from bench import dra_stream as ds
from bench.replay import trace
from gpu_share.sharing.decision import decision_key, decode_unverified
from testkit.scheduler import live_space

pytestmark = pytest.mark.cluster

N_NODES = 24


def test_dra_pods_ranked_by_the_extender_place_as_simulated(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from kubernetes import client as k8s

    from testkit.kube_admin import admin_client

    space = live_space(request, "DRA + extender test", "drx")
    kubeconfig = space.env["KUBECONFIG"]
    binary = Path(space.env["K8S_BIN_DIR"]) / "kube-scheduler"
    nodes = ds.renamed(ds.sample_nodes(trace.load_nodes(units=ds.UNITS), N_NODES),
                       f"gsx{space.tag}-")
    cap = ds.capacity_milli(nodes)
    dp._CAP.update(milli=cap, devices=sum(len(n.devices) for n in nodes))
    trace_pods = trace.load_pods(trace.trace_dir() / "openb_pod_list_default.csv")
    pods = ds.sample_pods(trace_pods, 42, cap, 400)
    load = ds.workload(trace_pods)
    expected = ds.simulate_first_fit(nodes, pods, load)

    api = admin_client(kubeconfig)
    env = dp.Env(api, k8s.CoreV1Api(api), k8s.CustomObjectsApi(api), kubeconfig, space.tag,
                 tmp_path)
    o = dp.Options(pod_timeout=30.0, phase_timeout=600.0, modes=("seq",))
    # The session holds the cluster lock (testkit.pytest_cluster).
    with dp.registered(env, nodes, f"gs-test-{space.tag}"):
        detail: dict[str, Any] = {}
        run = dp.run_dra_extender(env, binary, pods, f"gs-test-{space.tag}", load, o,
                                  detail)["seq"]
    placed, annotations, claims = detail["nodes"], detail["annotations"], detail["devices"]
    index_of = {d.uuid: d.index for n in nodes for d in n.devices}
    sim_pct = ds.allocation_pct(pods, expected, cap)
    assert run.claims is not None and run.claims.devices_over == 0
    assert abs(run.alloc_pct - sim_pct) <= 0.3, (run.alloc_pct, sim_pct)
    same = sum(1 for a, b in zip(placed, expected, strict=True) if a == b)
    assert same >= len(pods) - 5, f"{same} of {len(pods)} pods where the simulator puts them"
    # Each bound pod's decision names the device its claim was allocated.
    checked = 0
    for name, ann in annotations.items():
        text = ann.get(decision_key("vendor.com"))
        assert text, f"{name}: no decision recorded"
        devices = decode_unverified(text).containers["main"].devices
        indices = sorted(index_of[d] for d in devices)
        assert indices == sorted(claims[name]), (name, devices, claims[name])
        checked += 1
    assert checked == run.bound
