from __future__ import annotations

import random

import pytest

from gpu_share.agent.response import build
from gpu_share.config.model import DeviceListStrategy, EnforcementMode, RuntimeConfig
from gpu_share.devices.base import DeviceNode, RuntimeNaming
from gpu_share.errors import AllocationError, IdentityError
from gpu_share.sharing.ids import parse_unit_id
from gpu_share.sharing.model import (
    ContainerKind,
    PodResourcesContainer,
    PodResourcesPod,
    PodResourcesView,
    ResourceKind,
)
from gpu_share.sharing.node.engine import CallContext
from gpu_share.sharing.node.ledger import EntrySource, EntryState, Ledger
from gpu_share.sharing.node.ledger_annotations import inventory_annotation, pod_assignment
from gpu_share.sharing.node.notes import NoteKind
from tests.sharing.helpers import NAMES, ctr, devices, engine, pod
from tests.sharing.kubesim import KubeletSim

MEM, CORE = ResourceKind.MEMORY, ResourceKind.CORE


def mem_ids(dev: str, n: int, start: int = 0) -> list[str]:
    return [f"{dev}::mem::{i}" for i in range(start, start + n)]


def core_ids(dev: str, n: int, start: int = 0) -> list[str]:
    return [f"{dev}::core::{i}" for i in range(start, start + n)]


def all_ids(kind: ResourceKind, n_dev: int = 3, units: int = 8) -> list[str]:
    per = units if kind is MEM else 100
    return [
        f"GPU-{d}::{'mem' if kind is MEM else 'core'}::{i}"
        for d in range(n_dev)
        for i in range(per)
    ]


def sim(eng=None, seed: int = 0) -> KubeletSim:  # type: ignore[no-untyped-def]
    return KubeletSim(eng or engine(), random.Random(seed))


def devs_of(s: KubeletSim, key: tuple[str, str], c: str) -> set[str]:
    return {parse_unit_id(i).device for ids in s.held[key][c].values() for i in ids}


# ---------------------------------------------------------------- happy paths
@pytest.mark.parametrize("seed", range(4))
def test_one_container_memory_and_cores_on_one_device(seed: int) -> None:
    s = sim(seed=seed)
    assert s.admit(pod("p", ctr("c", mem=3, cores=40)))
    assert len(devs_of(s, ("default", "p"), "c")) == 1
    e = s.engine.ledger.find("default", "p", "c", "uid-default-p")
    assert e is not None and e.state is EntryState.COMPLETE and e.source is EntrySource.NODE_AGENT
    s.check_invariants()


def test_best_fit_packs_and_keeps_big_blocks() -> None:
    s = sim()
    assert s.admit(pod("a", ctr("c", mem=6, cores=10)))
    assert s.admit(pod("b", ctr("c", mem=2, cores=10)))  # tight fit next to a
    assert devs_of(s, ("default", "a"), "c") == devs_of(s, ("default", "b"), "c")
    assert s.admit(pod("big", ctr("c", mem=8, cores=10)))  # a whole free device is left
    s.check_invariants()


def test_many_pods_fill_node_then_nofit_message() -> None:
    s = sim()
    for i in range(3):
        assert s.admit(pod(f"p{i}", ctr("c", mem=5, cores=10)))
    assert not s.admit(pod("x", ctr("c", mem=4, cores=10)))
    _key, why = s.rejected[-1]
    assert why.startswith("NoFit:")
    assert "largest free block is 3 memory units" in why


def test_memory_only_and_cores_only_containers() -> None:
    s = sim()
    assert s.admit(pod("m", ctr("c", mem=8)))
    assert s.admit(pod("k", ctr("c", cores=60)))
    e = s.engine.ledger.find("default", "m", "c", "")
    assert e is not None and e.shares[0].cores == 0
    s.check_invariants()


def test_exclusive_multi_device() -> None:
    s = sim(engine(devices(4, numa=(0, 1, 1, 0))))
    assert s.admit(pod("small", ctr("c", mem=1, cores=10)))  # lands on GPU-0
    assert s.admit(pod("x", ctr("c", mem=3, cores=200)))
    e = s.engine.ledger.find("default", "x", "c", "")
    assert e is not None and all(sh.exclusive for sh in e.shares)
    assert {sh.device for sh in e.shares} == {"GPU-1", "GPU-2"}  # one NUMA node
    assert sum(sh.memory_units for sh in e.shares) == 3
    # Nobody else may land on them now; only GPU-3 and GPU-0 are left.
    assert s.admit(pod("y", ctr("c", mem=8, cores=100)))
    assert not s.admit(pod("z", ctr("c", mem=1, cores=100)))  # kubelet: 90 core ids left
    assert not s.admit(pod("w", ctr("c", mem=1, cores=50, kind=ContainerKind.APP), ctr("v", mem=8)))
    assert s.rejected[-1][1].startswith("NoFit")
    s.check_invariants()


def test_cores_100_holds_device_exclusively() -> None:
    s = sim(engine(devices(1)))
    assert s.admit(pod("x", ctr("c", mem=1, cores=100)))
    assert not s.admit(pod("y", ctr("c", mem=1)))
    s.check_invariants()


def test_init_container_reuse_without_gpa() -> None:
    s = sim(engine(devices(2)))
    assert s.admit(pod("busy", ctr("c", mem=1, cores=10)))
    p = pod(
        "p",
        ctr("init", mem=4, cores=30, kind=ContainerKind.INIT),
        ctr("app", mem=2, cores=50),
    )
    calls_before = s.calls
    assert s.admit(p)
    key = ("default", "p")
    assert devs_of(s, key, "init") == devs_of(s, key, "app")
    # The app's memory was reused entirely (Allocate without GPA): fewer GPA calls.
    # init: 2 GPA + 2 Allocate; app: memory Allocate alone, cores GPA + Allocate.
    assert s.calls - calls_before == 7
    s.check_invariants()


def test_sidecar_keeps_its_devices() -> None:
    s = sim()
    p = pod(
        "p",
        ctr("init", mem=2, kind=ContainerKind.INIT),
        ctr("side", mem=1, cores=10, kind=ContainerKind.SIDECAR),
        ctr("app", mem=2, cores=20),
    )
    assert s.admit(p)
    key = ("default", "p")
    side = set(s.held[key]["side"][MEM])
    assert not side & set(s.held[key]["app"][MEM])
    s.check_invariants()


# ---------------------------------------------------------------- bad inputs
def ctx_for(e, *pods):  # type: ignore[no-untyped-def]
    pr = PodResourcesView(
        tuple(
            PodResourcesPod(
                p.namespace, p.name, tuple(PodResourcesContainer(c.name) for c in p.containers)
            )
            for p in pods
        )
    )
    return CallContext(pr, {(p.namespace, p.name): p for p in pods}, 10.0)


def test_bad_inputs_name_the_problem() -> None:
    e = engine()
    p = pod("p", ctr("c", mem=2, cores=20))
    ctx = ctx_for(e, p)
    with pytest.raises(AllocationError) as ex:
        e.preferred(MEM, all_ids(MEM), [], 0, ctx)
    assert ex.value.reason == "InvalidRequest"
    with pytest.raises(AllocationError) as ex:
        e.preferred(MEM, mem_ids("GPU-0", 2), [], 3, ctx)
    assert ex.value.reason == "InvalidRequest" and "only 2 are available" in str(ex.value)
    with pytest.raises(AllocationError) as ex:
        e.preferred(MEM, ["GPU-7::mem::0", *all_ids(MEM)[1:]], [], 2, ctx)
    assert ex.value.reason == "UnknownDevice" and "GPU-7" in str(ex.value)
    with pytest.raises(AllocationError) as ex:
        e.allocate(MEM, ["bogus"], ctx)
    assert ex.value.reason == "UnknownDevice" and "'bogus'" in str(ex.value)
    with pytest.raises(AllocationError) as ex:
        e.allocate(MEM, ["GPU-0::mem::99"], ctx)
    assert ex.value.reason == "UnknownDevice"
    with pytest.raises(AllocationError) as ex:
        e.allocate(MEM, ["GPU-0::mem::0", "GPU-1::mem::0"], ctx)
    assert ex.value.reason == "SplitAcrossDevices"


def test_cores_150_is_invalid() -> None:
    e = engine()
    p = pod("p", ctr("c", mem=1, cores=150))
    with pytest.raises(AllocationError) as ex:
        e.preferred(CORE, all_ids(CORE), [], 150, ctx_for(e, p))
    assert ex.value.reason == "InvalidRequest" and "150" in str(ex.value)


def test_decision_mismatch_and_unhealthy() -> None:
    e = engine()
    p = pod("p", ctr("c", mem=2, cores=20))
    ctx = ctx_for(e, p)
    pref = e.preferred(MEM, all_ids(MEM), [], 2, ctx)
    dev = parse_unit_id(pref.ids[0]).device
    other = "GPU-2" if dev != "GPU-2" else "GPU-1"
    e.allocate(MEM, pref.ids, ctx)
    with pytest.raises(AllocationError) as ex:
        e.allocate(CORE, core_ids(other, 20), ctx)
    assert ex.value.reason == "DecisionMismatch" and other in str(ex.value)
    assert e.set_health(dev, False) and not e.set_health(dev, False)
    with pytest.raises(AllocationError) as ex:
        e.allocate(CORE, core_ids(dev, 20), ctx)
    assert ex.value.reason == "DeviceUnhealthy"


def test_exclusive_conflict_on_allocate() -> None:
    e = engine(devices(1))
    x = pod("x", ctr("c", cores=100))
    ctx = ctx_for(e, x)
    e.allocate(CORE, core_ids("GPU-0", 100), ctx)
    y = pod("y", ctr("c", mem=1))
    with pytest.raises(AllocationError) as ex:
        e.allocate(MEM, mem_ids("GPU-0", 1), ctx_for(e, x, y))
    assert ex.value.reason in ("ExclusiveConflict", "NoFit")


def test_ambiguity_prefers_open_entry_then_oldest() -> None:
    e = engine()
    old = pod("old", ctr("c", mem=2), created=1.0)
    new = pod("new", ctr("c", mem=2), created=2.0)
    pref = e.preferred(MEM, all_ids(MEM), [], 2, ctx_for(e, new, old))
    assert pref.entry.ref.pod_name == "old" and pref.ambiguity == 1
    assert any(n.kind is NoteKind.AMBIGUOUS for n in pref.notes)


# ---------------------------------------------------------------- degraded
def test_degraded_single_device_pairs_memory_and_cores() -> None:
    e = engine()
    s = sim(e)
    s.pr_reachable = False
    assert s.admit(pod("p", ctr("c", mem=3, cores=30)))
    assert len(devs_of(s, ("default", "p"), "c")) == 1
    assert all(x.source is EntrySource.DEGRADED for x in e.ledger.entries)
    assert len(e.ledger.entries) == 1  # paired into one entry
    s.pr_reachable = True
    s.reconcile()
    (entry,) = e.ledger.entries
    assert entry.ref.pod_name == "p" and entry.source is EntrySource.RECONCILED


def test_degraded_refuse() -> None:
    e = engine(degraded_mode="refuse")
    with pytest.raises(IdentityError, match="PodResources unreachable"):
        e.preferred(MEM, all_ids(MEM), [], 2, CallContext(None, None, 1.0))


def test_degraded_never_uses_exclusive_device() -> None:
    e = engine(devices(2))
    s = sim(e)
    assert s.admit(pod("x", ctr("c", cores=100)))
    s.pr_reachable = False
    for i in range(2):
        assert s.admit(pod(f"m{i}", ctr("c", mem=4)))
    assert not s.admit(pod("m2", ctr("c", mem=1)))
    s.check_invariants()


# ---------------------------------------------------------------- reconcile
def test_reconcile_adopts_from_podresources_after_ledger_loss() -> None:
    s = sim()
    assert s.admit(pod("a", ctr("c", mem=3, cores=30)))
    held = {k: sorted(v) for k, v in s.held[("default", "a")]["c"].items()}
    s.engine = engine(ledger=Ledger())
    s.reconcile()
    (entry,) = s.engine.ledger.entries
    assert entry.source is EntrySource.RECONCILED
    assert sorted(entry.memory_ids) == held[MEM] and sorted(entry.core_ids) == held[CORE]
    assert entry.ref.pod_uid == "uid-default-a"


def test_reconcile_releases_after_grace_or_when_gone() -> None:
    s = sim()
    assert s.admit(pod("a", ctr("c", mem=3)))
    assert s.admit(pod("b", ctr("c", mem=3)))
    # Kubelet restarted: PodResources forgets both, API server still has them.
    active, held = dict(s.active), dict(s.held)
    s.active.clear()
    s.held.clear()
    r = s.engine.reconcile(s.pr(), dict(s.api), 100.0)
    assert not r.released and set(r.waiting) == {("default", "a"), ("default", "b")}
    s.active, s.held = active, held
    s.engine.reconcile(s.pr(), dict(s.api), 130.0)  # back: absence forgotten
    s.end(("default", "a"))
    r = s.engine.reconcile(s.pr(), dict(s.api), 131.0)
    assert [x.pod_name for x in r.released] == ["a"]
    s.active.clear()
    r = s.engine.reconcile(s.pr(), {}, 140.0)  # API unknown: wait for the grace period
    assert not r.released
    r = s.engine.reconcile(s.pr(), {}, 200.0)
    assert [x.pod_name for x in r.released] == ["b"]


# ---------------------------------------------------------------- views
def test_inventory_and_assignment_views() -> None:
    s = sim()
    assert s.admit(pod("a", ctr("c", mem=3, cores=30)))
    inv = inventory_annotation("node-1", s.engine.inventory, s.engine.usage())
    used = [(d.memory_used, d.cores_used) for d in inv.devices]
    assert sorted(used) == [(0, 0), (0, 0), (3, 30)]
    a = pod_assignment(s.engine.ledger, "default", "a")
    assert a is not None and a.containers["c"].devices[0].memory_units == 3
    assert pod_assignment(s.engine.ledger, "default", "nope") is None


# ---------------------------------------------------------------- response
NAMING = RuntimeNaming(
    "NVIDIA_VISIBLE_DEVICES",
    shared_nodes=(DeviceNode("/dev/nvidiactl", "/dev/nvidiactl"),),
)


def _entry_for(mem: int, cores: int):  # type: ignore[no-untyped-def]
    s = sim()
    assert s.admit(pod("a", ctr("c", mem=mem, cores=cores)))
    (e,) = s.engine.ledger.entries
    return e


def test_response_envvar_none() -> None:
    e = _entry_for(3, 30)
    spec = build(e, ({d.uuid: d for d in devices()}).get, NAMING, RuntimeConfig(), 1024)
    dev = e.shares[0].device
    assert spec.envs["NVIDIA_VISIBLE_DEVICES"] == dev
    assert spec.envs["GPU_SHARE_MEMORY_LIMIT_MIB"] == "3072"
    assert spec.envs["GPU_SHARE_CORE_PERCENT"] == "30"
    assert spec.devices == () and spec.cdi_devices == ()
    assert '"cores":30' in spec.annotations["gpu-share.vendor.com/slice"]
    again = build(e, ({d.uuid: d for d in devices()}).get, NAMING, RuntimeConfig(), 1024)
    assert again == spec


def test_response_memory_only_and_cores_only() -> None:
    devs = {d.uuid: d for d in devices()}
    m = build(
        _entry_for(2, 0), devs.get, NAMING, RuntimeConfig(enforcement=EnforcementMode.MPS), 1024
    )
    assert "GPU_SHARE_CORE_PERCENT" not in m.envs
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in m.envs
    assert m.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    # Cores-only under an enforcing mode: refused (tests/agent/test_response_modes.py).
    with pytest.raises(AllocationError) as ex:
        build(
            _entry_for(0, 40), devs.get, NAMING,
            RuntimeConfig(enforcement=EnforcementMode.HAMI_CORE), 1024,
        )
    assert ex.value.reason == "MemoryRequired"
    c = build(_entry_for(0, 40), devs.get, NAMING, RuntimeConfig(), 1024)
    assert "GPU_SHARE_MEMORY_LIMIT_MIB" not in c.envs
    assert c.envs["GPU_SHARE_CORE_PERCENT"] == "40"


def test_response_strategies_and_device_specs() -> None:
    e = _entry_for(1, 10)
    dev = e.shares[0].device
    rt = RuntimeConfig(
        device_list_strategy=[
            DeviceListStrategy.VOLUME_MOUNTS,
            DeviceListStrategy.CDI_ANNOTATIONS,
            DeviceListStrategy.CDI_CRI,
        ],
        pass_device_specs=True,
        enforcement=EnforcementMode.HAMI_CORE,
    )
    spec = build(e, ({d.uuid: d for d in devices()}).get, NAMING, rt, 1024)
    assert spec.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    paths = {m.container_path: m for m in spec.mounts}
    assert paths[f"/var/run/nvidia-container-devices/{dev}"].host_path == "/dev/null"
    assert paths["/etc/ld.so.preload"].read_only
    assert not paths["/tmp/vgpu"].read_only
    assert spec.annotations["cdi.k8s.io/gpu-share_slice"] == f"nvidia.com/gpu={dev}"
    assert spec.cdi_devices == (f"nvidia.com/gpu={dev}",)
    assert [d.container_path for d in spec.devices] == ["/dev/nvidiactl", f"/dev/nvidia{dev[-1]}"]
    assert spec.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"


def test_response_exclusive_two_devices_mps() -> None:
    e = _entry_for(3, 200)
    spec = build(
        e,
        ({d.uuid: d for d in devices()}).get,
        NAMING,
        RuntimeConfig(enforcement=EnforcementMode.MPS),
        1024,
    )
    assert spec.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0,GPU-1"
    assert spec.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M,1=8192M"
    assert spec.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert spec.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps"


def test_names_helper() -> None:
    assert NAMES.kind_of("vendor.com/vcuda-core") is CORE and NAMES.kind_of("x") is None


# The API server comes back between a container's two calls (e2e story 9a): the first
# was decided blind, the second knows the pod. The second must extend the blind decision
# on its device, not decide the container anew (which split memory and cores).
@pytest.mark.parametrize("seed", range(40))
def test_api_back_between_a_containers_calls_keeps_it_on_one_device(seed: int) -> None:
    rng = random.Random(seed)
    s = sim(seed=seed)
    for i in range(rng.randint(1, 5)):  # some load, so that devices differ
        s.admit(pod(f"load-{i}", ctr("c", mem=rng.randint(1, 4), cores=rng.randint(0, 60))))

    def api_back_after_first_call(k: KubeletSim) -> None:
        k.api_reachable = k.calls > first_call

    first_call = s.calls + 1
    s.api_reachable = False
    s.before_call = api_back_after_first_call
    if s.admit(pod("p", ctr("c", mem=rng.randint(1, 3), cores=rng.randint(10, 40)))):
        assert len(devs_of(s, ("default", "p"), "c")) == 1, s.held[("default", "p")]
    else:
        # The blind device has too few cores left: refused, never split over two devices.
        ((_, why),) = s.rejected
        assert why.startswith("NoFit"), why
    s.before_call = None
    s.reconcile()
    s.check_invariants()
