"""Story 9: failures nothing else exercises, on the real local cluster.

9a  the API server goes away in the middle of a burst of admissions;
9b  a node reboot: the kubelet and the agent restart together under running pods;
9c  `helm rollback` after an upgrade that changed the memory unit size under running slices.

Each ends with the audit (testkit/e2e.py): nothing over-committed, every slice the
same in PodResources, the pod's annotation, the node inventory and the container's env.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.e2e import (
    AGENT_NS,
    CORE,
    DEVICE_MIB,
    DEVICES,
    MEM,
    RELEASE,
    UNITS_PER_DEVICE,
    Kube,
    agent_host_pid,
    assert_consistent,
    assert_pods_kept,
    container,
    env_commitment,
    env_matches_kubelet,
    kubelet_devices,
    overcommit,
    pod,
    pod_uids,
    pool_values,
    run_shapes,
    seen_on_host,
)
from testkit.harness import cluster_cmd, wait_until

pytestmark = pytest.mark.e2e

FULL = {MEM: DEVICES * UNITS_PER_DEVICE, CORE: DEVICES * 100}


def _say(msg: str) -> None:
    sys.stderr.write(f"\nstory 9: {msg}\n")


def _device_ids(kube: Kube) -> list[str]:
    return [d["id"] for d in sorted(kube.inventory()["devices"], key=lambda d: d["index"])]


def _ids(res: dict[str, tuple[str, ...]]) -> set[str]:
    return {i for ids in res.values() for i in ids}


# ------------------------------------------------------------------ 9a API server down

# (memory units, cores): memory-only, cores-only and both, 19 units / 145 cores before the
# outage and 13 / 65 after it: everything fits the node (64 / 400) with room to spare, so
# every pod must run.
BURST_BEFORE = [
    (2, 10), (0, 20), (3, 0), (1, 15), (4, 25), (0, 10),
    (2, 0), (2, 20), (1, 0), (0, 30), (3, 10), (1, 5),
]  # fmt: skip
BURST_AFTER = [(2, 10), (1, 0), (0, 15), (3, 20), (2, 5), (1, 10), (0, 5), (4, 0)]
OUTAGE_S = 30


@contextlib.contextmanager
def _agent_paused(pid: int) -> Iterator[None]:
    """SIGSTOP the agent process: the kubelet's admissions wait on its (deadline-less)
    GetPreferredAllocation/Allocate calls, so the pods bound meanwhile are admitted only
    after SIGCONT, i.e. while the API server is gone. Kept to a few seconds (liveness
    allows 60 s)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.timeout(420)
def test_story9a_apiserver_down_mid_burst_no_overcommit_then_reconciled(
    agent: Kube, namespace: str
) -> None:
    """Story 9a: 12 pods bound, then kube-apiserver stopped for 30 s while the kubelet
    admits them (the agent falls back to PodResources and its degraded rules); 8 more
    after it returns. Sampled every second: no device over-committed in the kubelet's
    PodResources, the agent's ledger or the containers' env. Afterwards every pod runs and
    the audit is clean within 150 s."""
    devices = _device_ids(agent)
    pid = agent_host_pid(agent)
    problems: list[str] = []
    samples = 0

    def sample() -> None:
        nonlocal samples
        samples += 1
        problems.extend(f"t={time.monotonic() - t0:.0f}s {p}" for p in overcommit(agent, devices))

    t0 = time.monotonic()
    down, up_s = False, 0.0
    admitted_while_down: set[str] = set()
    try:
        with _agent_paused(pid):
            agent.apply(
                pod(f"pre-{i}", namespace, [container("main", m, c)])
                for i, (m, c) in enumerate(BURST_BEFORE)
            )
            wait_until(
                "the first half bound by the scheduler",
                lambda: (
                    len(ps := agent.pods(namespace)) == len(BURST_BEFORE)
                    and all(p["spec"].get("nodeName") for p in ps)
                ),
                60,
                interval=0.5,
            )
            time.sleep(2)  # the kubelet's watch delivers them; admission waits on the agent
            cluster_cmd("stop-apiserver", timeout=60)
            down = True
        t_down = time.monotonic()
        while time.monotonic() - t_down < OUTAGE_S:
            sample()
            admitted_while_down |= {k[1] for k in agent.namespace_devices(namespace)}
            time.sleep(1)
    finally:
        if down:
            up_s = cluster_cmd("start-apiserver", timeout=240)
    _say(
        f"9a: {len(admitted_while_down)}/{len(BURST_BEFORE)} pods admitted while the API "
        f"server was down; it came back in {up_s:.0f}s"
    )
    assert len(admitted_while_down) == len(BURST_BEFORE), (
        f"only {sorted(admitted_while_down)} admitted during the outage"
    )

    agent.apply(
        pod(f"post-{i}", namespace, [container("main", m, c)])
        for i, (m, c) in enumerate(BURST_AFTER)
    )

    def settled() -> list[dict[str, Any]] | None:
        sample()
        ps = agent.pods(namespace)
        done = all(p["status"].get("phase") in ("Running", "Succeeded", "Failed") for p in ps)
        return ps if done and len(ps) == len(BURST_BEFORE) + len(BURST_AFTER) else None

    pods = wait_until("every pod of the burst settled", settled, 180, interval=2)
    not_running = {
        p["metadata"]["name"]: p["status"].get("message", p["status"].get("phase"))
        for p in pods
        if p["status"].get("phase") != "Running"
    }
    assert not not_running, f"pods refused although the node has room: {not_running}"
    t_audit = time.monotonic()
    try:
        assert_consistent(agent, timeout=150)
    except AssertionError as exc:
        log = _agent_calls_log(agent)
        raise AssertionError(f"{exc}\nagent log (allocation lines):\n{log}") from None
    _say(f"9a: audit clean {time.monotonic() - t_audit:.0f}s after the burst settled")
    sample()
    told = env_matches_kubelet(agent, namespace)
    assert not problems, (
        f"over-committed in {len(problems)} of {samples} samples:\n"
        + "\n".join(problems[:10])
        + "\ncontainers told other than what they hold:\n"
        + "\n".join(told)
    )
    assert not told, "\n".join(told)


def _agent_calls_log(kube: Kube, lines: int = 120) -> str:
    """The agent's log lines about kubelet calls (degraded decisions, pairing, refusals),
    to tell after a failed audit how a container's resources were decided."""
    a = kube.ready_agent()
    if a is None:
        return "(no agent pod)"
    out = kube.kubectl("-n", a["metadata"]["namespace"], "logs", a["metadata"]["name"], "-c",
                       "agent", "--tail", "3000", check=False).stdout
    keep = [ln for ln in out.splitlines()
            if any(w in ln for w in ("degraded decision", "allocation notes", "refused",
                                     "SplitAcross", "ledger reconciled"))]
    return "\n".join(keep[-lines:]) or "(no such line)"


# ------------------------------------------------------------------ 9b node reboot


@pytest.mark.timeout(420)
def test_story9b_node_reboot_kubelet_and_agent_restart_slices_kept(
    agent: Kube, namespace: str
) -> None:
    """Story 9b: with 5 pods running, stop the kubelet, kill the agent process (SIGKILL,
    as a power cut would), start the kubelet: the kubelet restarts the agent container,
    which re-registers; running pods keep uid, restart count 0 and exactly their device
    ids; 4 new pods get ids disjoint from theirs; audit clean."""
    shapes = [(4, 30), (2, 0), (0, 40), (6, 20), (3, 10)]
    before = run_shapes(agent, namespace, shapes)
    assert len(before) == len(shapes)
    uids = pod_uids(agent, namespace)
    old_agent = agent.ready_agent()
    assert old_agent is not None
    old_restarts = old_agent["status"]["containerStatuses"][0]["restartCount"]
    pid = agent_host_pid(agent)

    t0 = time.monotonic()
    cluster_cmd("stop-kubelet", timeout=60)
    try:
        os.kill(pid, signal.SIGKILL)
        wait_until("the agent process gone", lambda: not Path(f"/proc/{pid}").exists(), 30, 0.2)
    finally:
        cluster_cmd("start-kubelet", timeout=240)
    t_kubelet = time.monotonic() - t0

    def agent_back() -> bool:
        p = agent.ready_agent()
        if p is None:
            return False
        restarts = p["status"]["containerStatuses"][0]["restartCount"]
        return p["metadata"]["uid"] != old_agent["metadata"]["uid"] or restarts > old_restarts

    wait_until("the agent container restarted and ready", agent_back, 180)
    agent.wait_agent_serving()
    _say(
        f"9b: kubelet back after {t_kubelet:.0f}s, agent serving "
        f"{time.monotonic() - t0:.0f}s after the 'reboot' began"
    )
    assert_pods_kept(agent, namespace, before, uids, "the node reboot")

    agent.apply(pod(f"new-{i}", namespace, [container("main", 4, 20)]) for i in range(4))
    settled = agent.wait_pods_settled(namespace, timeout=180)
    assert all(p["status"]["phase"] == "Running" for p in settled), [
        (p["metadata"]["name"], p["status"].get("message")) for p in settled
    ]
    held = kubelet_devices(agent.env["POD_RESOURCES_SOCKET"])
    old_ids = {i for res in before.values() for i in _ids(res)}
    for i in range(4):
        new = _ids(held[(namespace, f"new-{i}", "main")])
        assert new and not new & old_ids, f"new-{i} got ids in use: {sorted(new & old_ids)}"
    assert_consistent(agent)
    assert not (bad := env_matches_kubelet(agent, namespace)), "\n".join(bad)
    assert not (bad := overcommit(agent, _device_ids(agent))), "\n".join(bad)


# ------------------------------------------------------------------ 9c helm rollback




def _revision(kube: Kube) -> int:
    hist = json.loads(kube.helm("history", RELEASE, "-n", AGENT_NS, "-o", "json").stdout)
    return int(hist[-1]["revision"])


def _node_events(kube: Kube, reason: str) -> list[str]:
    items = kube.get(
        "events",
        "-A",
        "--field-selector",
        f"involvedObject.kind=Node,involvedObject.name={kube.node},reason={reason}",
    )["items"]
    return [str(e.get("message", "")) for e in items]


def _rolled(kube: Kube, old_uid: str) -> Any:
    return lambda: (p := kube.ready_agent()) and p["metadata"]["uid"] != old_uid


@pytest.mark.timeout(600)
def test_story9c_rollback_after_unit_size_upgrade_with_running_slices(
    agent: Kube, namespace: str, tmp_path: Path
) -> None:
    """Story 9c: slices run (1024 MiB units); `helm upgrade` to memoryUnitMiB 2048: the
    agent keeps 1024 while slices run (node still 64 units, Warning Event
    MemoryUnitChangeDeferred); a new pod gets 1024 MiB units; `helm rollback`: node
    advertises the rolled-back 64 units, running pods untouched; every device then filled
    to what the agent calls free: no device's containers were told more than 16 GiB in
    total; audit clean."""
    rev = _revision(agent)
    agent.apply(pod(f"a-{i}", namespace, [container("main", 4, 25)]) for i in range(2))
    agent.wait_ready(namespace)
    before = agent.namespace_devices(namespace)

    old = agent.ready_agent()
    assert old is not None
    agent.install("-f", pool_values(tmp_path, {"memoryUnitMiB": 2048}), action="upgrade")
    wait_until("the agent pod rolled (upgrade)", _rolled(agent, old["metadata"]["uid"]), 180)
    cfg = agent.agent_exec("cat", "/etc/gpu-share/config.yaml").stdout
    assert "2048" in cfg, cfg
    # The old agent's SIGTERM reports every device going (allocatable 0) and the kubelet
    # posts node status only every ~10 s: wait for the new agent's first answer to land,
    # then a little longer so that a wrong later answer would show too.
    wait_until(
        "the new agent's devices on the node",
        lambda: agent.node_resources()["allocatable"][MEM] > 0,
        90,
        fail=False,
    )
    time.sleep(12)
    upgraded = agent.node_resources()["allocatable"]
    upgraded_unit = agent.inventory().get("unitMiB")
    deferred = wait_until(
        "a MemoryUnitChangeDeferred event",
        lambda: _node_events(agent, "MemoryUnitChangeDeferred"),
        30,
        fail=False,
    ) or [""]
    agent.apply([pod("b", namespace, [container("main", 6, 0)])])
    agent.kubectl(
        "-n", namespace, "wait", "--for=condition=Ready", "pod/b", "--timeout=120s", timeout=150
    )
    b_seen = wait_until("b's env", lambda: seen_on_host(agent, [(namespace, "b", "main")]), 60)[
        (namespace, "b", "main")
    ]
    _say(
        f"9c: after the upgrade: allocatable {upgraded}, inventory unit {upgraded_unit} MiB, "
        f"pod b (6 units) told mem={b_seen.get('mem')}, event {deferred[0][:120]!r}"
    )

    old = agent.ready_agent()
    assert old is not None
    agent.helm(
        "rollback", RELEASE, str(rev), "-n", AGENT_NS, "--wait", "--timeout", "300s", timeout=330
    )
    wait_until("the agent pod rolled (rollback)", _rolled(agent, old["metadata"]["uid"]), 180)
    agent.wait_agent_serving()
    assert agent.inventory().get("unitMiB") == 1024
    for p in agent.pods(namespace):
        assert p["status"]["phase"] == "Running"
        assert all(cs["restartCount"] == 0 for cs in p["status"]["containerStatuses"])
    now = agent.namespace_devices(namespace)
    assert {k: v for k, v in now.items() if k in before} == before
    assert_consistent(agent)  # the inventory's free counts are current

    # Fill every device to what the agent calls free, one pod at a time (best-fit puts a
    # pod of exactly a device's free units on that device). A unit size misread across the
    # upgrade/rollback shows as a device whose containers were told more than it has.
    free = sorted(
        d["memoryUnits"]["total"] - d["memoryUnits"]["used"] for d in agent.inventory()["devices"]
    )
    for i, units in enumerate(u for u in free if u > 0):
        agent.apply([pod(f"fill-{i}", namespace, [container("main", units, 0)])])
        agent.kubectl(
            "-n",
            namespace,
            "wait",
            "--for=condition=Ready",
            f"pod/fill-{i}",
            "--timeout=120s",
            timeout=150,
        )
    held = agent.namespace_devices(namespace)
    mib, _ = env_commitment(seen_on_host(agent, held))
    _say(f"9c: after the rollback and the fill, MiB told per device: {mib}")
    over = {d: n for d, n in mib.items() if n > DEVICE_MIB}
    assert not over, f"devices over-committed (MiB told to their containers): {over}"

    # What the agent did across the upgrade: it kept the unit size of the running slices.
    assert upgraded == FULL and upgraded_unit == 1024, (
        f"after the upgrade with running slices: allocatable {upgraded}, unit {upgraded_unit}"
    )
    assert "1024" in deferred[0] and "2048" in deferred[0], deferred
    assert b_seen.get("mem") == "6144", b_seen
    wait_until("allocatable full", lambda: agent.node_resources()["allocatable"] == FULL, 60)
    assert_consistent(agent)
    assert not (bad := env_matches_kubelet(agent, namespace)), "\n".join(bad)
