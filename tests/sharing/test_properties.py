"""Property tests: a kubelet simulator drives the engine through random workloads."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_share.config.model import PlacementPolicyName
from gpu_share.sharing.model import ContainerKind, ContainerView, ResourceKind
from gpu_share.sharing.node.engine import AllocationEngine
from gpu_share.sharing.node.ledger import Ledger
from tests.sharing.helpers import ctr, devices, engine, pod
from tests.sharing.kubesim import KubeletSim

CORES = st.sampled_from([0, 0, 10, 25, 30, 50, 60, 100, 200])
MEMS = st.integers(min_value=0, max_value=9)


@st.composite
def containers(draw: st.DrawFn) -> tuple[ContainerView, ...]:
    out: list[ContainerView] = []
    for i in range(draw(st.integers(0, 1))):
        out.append(ctr(f"init{i}", draw(MEMS), draw(CORES), ContainerKind.INIT))
    if draw(st.booleans()):
        out.append(
            ctr("side", draw(MEMS), draw(st.sampled_from([0, 10, 20])), ContainerKind.SIDECAR)
        )
    for i in range(draw(st.integers(1, 2))):
        out.append(ctr(f"app{i}", draw(MEMS), draw(CORES)))
    return tuple(out)


@dataclass(frozen=True)
class Op:
    what: str  # add | end | restart | lose | reconcile | flap
    containers: tuple[ContainerView, ...] = ()
    pick: int = 0


OPS = st.one_of(
    st.builds(Op, st.just("add"), containers()),
    st.builds(Op, st.just("add"), containers()),
    st.builds(Op, st.just("end"), pick=st.integers(0, 50)),
    st.builds(Op, st.just("restart")),
    st.builds(Op, st.just("lose")),
    st.builds(Op, st.just("reconcile")),
)

POLICIES = st.sampled_from(list(PlacementPolicyName))


def rebuild(old: AllocationEngine, ledger: Ledger) -> AllocationEngine:
    e = AllocationEngine(old.inventory, ledger, old.resources, old.policy)
    return e


def run(
    ops: list[Op],
    seed: int,
    policy: PlacementPolicyName,
    restart_every: int,
    degraded_every: int = 0,
    on_call: Callable[[KubeletSim], None] | None = None,
) -> KubeletSim:
    s = KubeletSim(engine(devices(3, numa=(0, 0, 1)), policy=policy), random.Random(seed))

    def hook(sim: KubeletSim) -> None:
        if on_call is not None:
            on_call(sim)
        if degraded_every:
            sim.pr_reachable = sim.calls % degraded_every != 0
        if restart_every and sim.calls % restart_every == 0:
            # Plugin restarts between two kubelet calls: rebuild from the persisted JSON.
            sim.engine = rebuild(sim.engine, Ledger.from_json(sim.engine.ledger.to_json()))
            sim.engine.reconcile(sim.pr(), dict(sim.api), sim.now)

    s.before_call = hook
    n = 0
    for op in ops:
        if op.what == "add":
            n += 1
            s.admit(pod(f"p{n}", *op.containers, created=float(n)))
        elif op.what == "end" and s.active:
            keys = sorted(s.active)
            s.end(keys[op.pick % len(keys)])
        elif op.what == "restart":
            s.engine = rebuild(s.engine, Ledger.from_json(s.engine.ledger.to_json()))
            s.reconcile()
        elif op.what == "lose":
            # State file lost: only PodResources + API server to rebuild from.
            s.engine = rebuild(s.engine, Ledger())
            s.reconcile()
        elif op.what == "reconcile":
            s.reconcile()
        s.check_invariants(colocated=not degraded_every)
    return s


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.lists(OPS, max_size=14), st.integers(0, 2**16), POLICIES)
def test_never_overcommit_and_colocated(
    ops: list[Op], seed: int, policy: PlacementPolicyName
) -> None:
    s = run(ops, seed, policy, restart_every=0)
    # Every admitted container's ledger entry mirrors what the kubelet holds.
    s.reconcile()
    for key, cs in s.held.items():
        for name, ks in cs.items():
            e = s.engine.ledger.find(key[0], key[1], name, "")
            assert e is not None
            for k, ids in ks.items():
                assert sorted(e.ids(k)) == sorted(ids)


@SETTINGS
@given(st.lists(OPS, max_size=12), st.integers(0, 2**16), POLICIES, st.integers(2, 7))
def test_restart_mid_stream_gives_nobody_twice(
    ops: list[Op], seed: int, policy: PlacementPolicyName, every: int
) -> None:
    run(ops, seed, policy, restart_every=every)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=10), st.integers(0, 2**16), st.integers(2, 5))
def test_degraded_calls_never_overcommit(ops: list[Op], seed: int, every: int) -> None:
    run(ops, seed, PlacementPolicyName.BEST_FIT, restart_every=0, degraded_every=every)


@settings(max_examples=30, deadline=None)
@given(st.lists(OPS, max_size=10), st.integers(0, 2**16))
def test_ledger_json_round_trip(ops: list[Op], seed: int) -> None:
    s = run(ops, seed, PlacementPolicyName.BEST_FIT, restart_every=0)
    text = s.engine.ledger.to_json()
    back = Ledger.from_json(text)
    assert back.entries == s.engine.ledger.entries
    assert back.to_json() == text


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=12), st.integers(0, 2**16), st.integers(2, 5))
def test_journal_replay_and_incremental_usage(ops: list[Op], seed: int, every: int) -> None:
    """Before every kubelet call: usage kept per change equals a recount, and the last
    snapshot with the journal records drained since gives this ledger back (what a
    restarted agent reads); every ``every`` calls a new snapshot (compaction)."""
    disk: dict[str, object] = {"ledger": None, "snapshot": "", "records": []}

    def on_call(sim: KubeletSim) -> None:
        led, inv = sim.engine.ledger, sim.engine.inventory
        assert led.usage(inv) == led.recount_usage(inv)
        records = disk["records"]
        assert isinstance(records, list)
        if disk["ledger"] is not led:  # a new ledger object (restart / lost state)
            led.drain_changes()
            disk.update(ledger=led, snapshot=led.to_json(), records=[])
            return
        record = led.drain_changes()
        if record is not None:
            records.append(record)
        snapshot = disk["snapshot"]
        assert isinstance(snapshot, str)
        back = Ledger.from_json(snapshot)
        for i, r in enumerate(records):
            back.apply_record(r, f"record {i}")
        assert back.to_json() == led.to_json()
        if sim.calls % every == 0:
            disk.update(snapshot=led.to_json(), records=[])

    run(ops, seed, PlacementPolicyName.BEST_FIT, restart_every=0, on_call=on_call)


def test_simulator_detects_split() -> None:
    # The invariant checker must be able to fail: hand the kubelet a split container.
    s = KubeletSim(engine(), random.Random(0))
    v = pod("p", ctr("c", 1, 10))
    s.active[("default", "p")] = v
    s.held[("default", "p")] = {
        "c": {
            ResourceKind.MEMORY: ["GPU-0::mem::0"],
            ResourceKind.CORE: [f"GPU-1::core::{i}" for i in range(10)],
        }
    }
    try:
        s.check_invariants()
    except AssertionError:
        return
    raise AssertionError("split container not detected")
