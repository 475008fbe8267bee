"""A tiny replay (a few hand-written nodes and pods) through the bench code."""

from __future__ import annotations

from pathlib import Path

from bench.replay import restrict, sim, trace


def test_tiny_replay(tmp_path: Path) -> None:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "n0,32000,131072,2,T4\nn1,32000,131072,4,V100M16\nn2,8000,32768,1,P100\n"
    )
    pods = tmp_path / "openb_pod_list_tiny.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "p0,4000,8192,1,500,\np1,4000,8192,1,500,\np2,8000,16384,2,1000,\n"
        "p3,2000,4096,1,250,\np4,1000,1024,0,0,\np5,4000,8192,1,1200,P100\n"
    )
    nodes = trace.load_nodes(tmp_path / "openb_node_list_gpu_node.csv")
    loaded = trace.load_pods(pods)
    assert loaded[5].gpu_milli == 1000  # capped
    capacity = sum(len(n.devices) for n in nodes) * 1000
    order = trace.arrival_order(loaded, 42, capacity)
    assert sum(p.gpu_request for p in order) >= 1.3 * capacity
    for policy in ("fgd", sim.UNPRICED, "best-fit", "packing", "random", "dotprod", "clustering"):
        r = sim.run(nodes, order, sim.workload_of(loaded), policy, "deterministic", 42)
        assert r.placed + r.failed == len(order)
        assert set(r.allocation) == set(sim.CHECKPOINTS)
        assert all(0 < v <= 100 for v in r.allocation.values())


def test_model_restricted_variant_is_seeded_and_satisfiable(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "n0,32000,131072,2,T4\nn1,64000,262144,8,G2\nn2,8000,32768,1,P100\n"
    )
    nodes = trace.load_nodes(tmp_path / "nodes.csv")
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"]
    rows += [
        f"g{i:03d},4000,8192,{8 if i % 10 == 0 else 1},{1000 if i % 3 else 500},"
        for i in range(200)
    ]
    rows += [f"c{i:03d},1000,1024,0,0," for i in range(20)]
    (tmp_path / "pods.csv").write_text("\n".join(rows) + "\n")
    pods = trace.load_pods(tmp_path / "pods.csv")
    a = restrict.restrict(pods, nodes, 0.25)
    assert a == restrict.restrict(pods, nodes, 0.25)  # seeded: one fixed variant
    assert a != restrict.restrict(pods, nodes, 0.25, seed=1)
    bound = [p for p in a if p.gpu_spec]
    assert len(bound) == 50  # 25 % of the 200 GPU pods, none of the GPU-free ones
    for p in bound:
        assert p.gpu_spec in {"T4", "G2", "P100"}
        if p.num_gpu == 8:
            assert p.gpu_spec == "G2"  # only a G2 node holds 8 GPUs
    # Drawn by GPU count: G2 (8 of 11 GPUs) dominates the 1-GPU pods' requirements.
    ones = [p.gpu_spec for p in bound if p.num_gpu == 1]
    assert ones.count("G2") > ones.count("T4") > 0
