"""Story 3: pairing under load. 42 pods of mixed shapes created at once on 4 dummy
devices: every container's memory and cores are on one device, no device is
over-committed, and every pod either runs or fails admission with a clear Event."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from testkit.e2e import (
    Kube,
    assert_consistent,
    assignment,
    container,
    pod,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _sidecar(name: str, memory: int, cores: int) -> dict[str, Any]:
    c = container(name, memory, cores)
    c["restartPolicy"] = "Always"  # native sidecar (init container that keeps running)
    return c


def _init(name: str, memory: int, cores: int) -> dict[str, Any]:
    return container(name, memory, cores, sleep=False)


def workload(ns: str) -> list[dict[str, Any]]:
    """42 pods; their totals fit the node's allocatable (the scheduler admits all) but
    not always one device (the kubelet/agent refuses some at admission)."""
    pods: list[dict[str, Any]] = []

    def add(prefix: str, count: int, **kw: Any) -> None:
        for i in range(count):
            pods.append(pod(f"{prefix}-{i}", ns, **kw))

    for m, n in [(1, 14), (2, 6), (3, 2)]:  # memory only
        add(f"mem{m}", n, containers=[container("main", m)])
    for c, n in [(5, 4), (10, 3)]:  # cores only
        add(f"core{c}", n, containers=[container("main", 0, c)])
    for m, c, n in [(1, 10, 4), (2, 20, 2)]:  # both
        add(f"both{m}x{c}", n, containers=[container("main", m, c)])
    add("multi", 2, containers=[container("main", 1, 10), container("helper", 1, 5)])
    add("init", 2, init_containers=[_init("setup", 2, 10)], containers=[container("main", 1, 5)])
    add(
        "sidecar",
        2,
        init_containers=[_sidecar("proxy", 1, 0)],
        containers=[container("main", 1, 10)],
    )
    add("whole2", 1, containers=[container("main", 0, 200)])
    return pods


def test_story3_pairing_under_load_no_split_no_overcommit(agent: Kube, namespace: str) -> None:
    """Story 3: 42 mixed pods at once; mismatches (split, over-commit, annotation vs
    kubelet, inventory vs kubelet) must be 0; refused pods carry a clear Event."""
    pods = workload(namespace)
    assert len(pods) >= 40
    agent.apply(pods)
    settled = agent.wait_pods_settled(namespace, timeout=420)
    running = [p for p in settled if p["status"]["phase"] == "Running"]
    failed = [p for p in settled if p["status"]["phase"] == "Failed"]
    sys.stderr.write(f"\nstory 3: {len(running)} running, {len(failed)} refused at admission\n")
    assert running, "no pod runs"
    for p in failed:
        name = p["metadata"]["name"]
        assert p["status"].get("reason") == "UnexpectedAdmissionError", p["status"]
        msg = p["status"].get("message", "") + " ".join(agent.events(namespace, name))
        sys.stderr.write(f"story 3: {name} refused: {p['status'].get('message', '')}\n")
        # The agent's answer names the container and what no device has free.
        assert f"{namespace}/{name}/" in msg and "free" in msg, (
            f"{name}: refusal without a clear reason: {msg}"
        )
    a = assert_consistent(agent, timeout=90)
    ours = {k: v for k, v in a.placement.items() if k[0] == namespace}
    running_names = {p["metadata"]["name"] for p in running}
    index_of = {d["id"]: d["index"] for d in agent.inventory()["devices"]}
    assert {k[1] for k in ours} == running_names
    checked = 0
    for p in running:
        name = p["metadata"]["name"]
        ann = assignment(agent.get("pod", "-n", namespace, name))
        inits = [c["name"] for c in p["spec"].get("initContainers", [])]
        for c in p["spec"]["containers"] + p["spec"].get("initContainers", []):
            seen = agent.seen(namespace, name, c["name"])
            want = ours.get((namespace, name, c["name"]))
            if want is None and c["name"] in inits:
                # Finished init containers are not in PodResources: their annotation is.
                want = {d["id"] for d in ann[c["name"]]["devices"]}
            assert want, (name, c["name"], "holds nothing")
            assert set(seen.get("visible", "").split(",")) == want, (name, c["name"], seen, want)
            nodes = {f"dummy-npu{index_of[d]}" for d in want}
            assert set(seen.get("nodes", "").split(",")) == nodes, (name, c["name"], seen)
            checked += 1
    assert checked >= len(running)
