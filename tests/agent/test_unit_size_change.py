"""L2: a memoryUnitMiB change (helm upgrade / rollback) while slices run. The whole agent
behind real gRPC on unix sockets, restarted on the same state dir with another unit size.

The agent keeps the unit size its running slices were cut in until none is left: read in
another size, their ids would count for more or fewer MiB than their containers were told
(after a rollback to smaller units a device was handed out beyond its memory).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpu_share.agent.state import LedgerStore
from gpu_share.config.model import AgentConfig
from tests.agent.served_agent import CORE, MEM, Rig, agent_config, pod_view, running_rig

DEVICE_MIB = 8192  # 2 devices: 8 units of 1 GiB or 4 of 2 GiB each


def _cfg(d: Path, unit_mib: int) -> AgentConfig:
    return agent_config(d, memory_mib=DEVICE_MIB, memoryUnitMiB=unit_mib)


@pytest.fixture
def rig() -> Iterator[Rig]:
    with running_rig(lambda d: _cfg(d, 1024)) as r:
        yield r


def _restart(rig: Rig, unit_mib: int) -> None:
    """helm upgrade/rollback of the pool's memoryUnitMiB: the agent pod is replaced."""
    rig.stop_agent()
    rig.cfg = _cfg(rig.dir, unit_mib)
    rig.start_agent()


def _events(rig: Rig, reason: str) -> list[str]:
    assert rig.agent is not None and rig.agent.flush(5)
    return [msg for _who, r, msg in rig.publisher.events if r == reason]


def _told(envs: dict[str, dict[str, list[tuple[str, str]]]]) -> tuple[str, int]:
    """(device, MiB) the container's Allocate answers told it."""
    env = dict(envs["main"][MEM])
    return env["DUMMY_VISIBLE_DEVICES"], int(env["GPU_SHARE_MEMORY_LIMIT_MIB"])


def _ledger_unit(rig: Rig) -> int:
    ledger, _torn = LedgerStore(str(rig.dir / "state")).read()  # snapshot + journal
    assert ledger is not None
    return ledger.unit_mib


def test_rollback_after_unit_upgrade_with_running_slices_never_overcommits(rig: Rig) -> None:
    rng = random.Random(3)
    told: dict[str, int] = {}

    def admit(name: str, memory: int, cores: int) -> None:
        device, mib = _told(rig.admit(pod_view(name, ("main", memory, cores)), rng))
        told[device] = told.get(device, 0) + mib

    admit("a", 4, 30)
    _restart(rig, 2048)  # helm upgrade: memoryUnitMiB 1024 -> 2048, "a" still runs
    upgraded_ids = len(rig.all_ids(MEM))
    deferred = _events(rig, "MemoryUnitChangeDeferred")
    admit("b", 3, 0)
    _restart(rig, 1024)  # helm rollback
    # Fill the node 1 unit at a time until the kubelet or the agent says nothing fits.
    for i in range(2 * 8 + 1):
        if not rig.free_ids(MEM):
            break
        try:
            admit(f"fill-{i}", 1, 0)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            break
    # No device's containers were told more MiB than it has.
    assert all(mib <= DEVICE_MIB for mib in told.values()), told
    assert sum(told.values()) == 2 * DEVICE_MIB
    # How: still 1 GiB units while "a" ran (b got 3 x 1 GiB), and the operator was told.
    assert upgraded_ids == 2 * 8
    assert len(deferred) == 1 and "2048" in deferred[0] and "1024" in deferred[0], deferred
    assert len(_events(rig, "MemoryUnitChangeDeferred")) == 1  # nothing to defer after
    assert len(rig.all_ids(MEM)) == 2 * 8
    assert _ledger_unit(rig) == 1024


def test_deferred_unit_size_applies_once_no_slice_is_left(rig: Rig) -> None:
    rng = random.Random(5)
    rig.admit(pod_view("a", ("main", 2, 10)), rng)
    _restart(rig, 2048)
    assert len(rig.all_ids(MEM)) == 2 * 8  # deferred while "a" runs
    assert _ledger_unit(rig) == 1024

    # "a" ends: the kubelet and the API server forget it; the next reconcile switches.
    del rig.held[("default", "a", "main")]
    del rig.pods.pods[("default", "a")]
    rig.publish_pr()
    assert rig.agent is not None
    rig.agent.reconcile()
    latest = rig.clients[MEM].wait_for_list(lambda ds: len(ds) == 2 * 4)
    assert len(latest) == 2 * 4
    assert _events(rig, "MemoryUnitChanged")
    assert _ledger_unit(rig) == 2048
    _device, mib = _told(rig.admit(pod_view("c", ("main", 2, 0)), rng))
    assert mib == 4096
    assert len(rig.all_ids(CORE)) == 2 * 100


def test_unit_size_change_without_slices_applies_at_once(rig: Rig) -> None:
    _restart(rig, 2048)
    assert len(rig.all_ids(MEM)) == 2 * 4
    assert not _events(rig, "MemoryUnitChangeDeferred")
    assert _ledger_unit(rig) == 2048
