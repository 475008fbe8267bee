"""The agent's ClaimPreparer (agent/dra/claims.py, DRA mode): the CDI spec per claim
from the device-plugin response builder, idempotent prepare (also after a restart, with
no second API read), unprepare by uid, a corrupt checkpoint set aside, concurrent calls."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpu_share.agent.dra.claims import CHECKPOINT_FILE, DraClaimPreparer
from gpu_share.agent.dra.ports import ClaimPreparer, ClaimRef
from gpu_share.agent.enforcement import EnforcementStatus
from gpu_share.agent.response import build
from gpu_share.config.model import AgentConfig, EnforcementMode
from gpu_share.devices.dummy import DummyBackend
from gpu_share.errors import KubeAccessError
from gpu_share.kube.resourceclaims import ClaimNotFoundError
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import ContainerRef, ContainerRequest, DeviceShare
from gpu_share.sharing.node.ledger import EntrySource, LedgerEntry
from tests.sharing.test_dra_claims import DRIVER, NODE, UID, claim, opaque, result

UID2 = "5e1d2c3b-aaaa-4bbb-8ccc-0123456789ab"


class Claims:
    """A ClaimSource: claims by (namespace, name), counting the reads."""

    def __init__(self) -> None:
        self.objs: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0
        self.fail: Exception | None = None
        self.unreadable: set[str] = set()  # names whose read fails (connection refused)
        self._lock = threading.Lock()

    def add(self, obj: dict[str, Any], name: str = "c", uid: str = UID) -> ClaimRef:
        obj["metadata"].update(name=name, uid=uid)
        self.objs[("ns", name)] = obj
        return ClaimRef("ns", name, uid)

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        with self._lock:
            self.reads += 1
        if self.fail is not None:
            raise self.fail
        if name in self.unreadable:
            raise KubeAccessError(f"read claim {namespace}/{name}: connection refused")
        try:
            return self.objs[(namespace, name)]
        except KeyError:
            raise ClaimNotFoundError(f"claim {namespace}/{name}: not found") from None


def config(tmp: Path, **runtime: Any) -> AgentConfig:
    return AgentConfig.model_validate({
        "nodeName": NODE,
        "backend": "dummy",
        "dummy": {"deviceCount": 3},
        "runtime": {"hamiCore": {"cacheDir": str(tmp / "vgpu")}, **runtime},
        "dra": {"enabled": True, "pluginDir": str(tmp / "plugin"), "cdiDir": str(tmp / "cdi")},
    })


def preparer(tmp: Path, source: Claims, **runtime: Any) -> DraClaimPreparer:
    cfg = config(tmp, **runtime)
    backend = DummyBackend(cfg.dummy, NODE)
    inv = Inventory.from_devices(backend.devices(), cfg.memory_unit_mib)
    return DraClaimPreparer(cfg, source, lambda: inv, backend.naming())


def spec_path(tmp: Path, uid: str = UID) -> Path:
    return tmp / "cdi" / f"{DRIVER}-claim_{uid}.json"


def read_spec(tmp: Path, uid: str = UID) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(spec_path(tmp, uid).read_text())
    return doc


def env(spec: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec["containerEdits"]["env"])


SHARED = {"memory": "4Gi", "cores": "30"}


def test_is_a_claim_preparer(tmp_path: Path) -> None:
    p: ClaimPreparer = preparer(tmp_path, Claims())
    assert p.prepare([]) == {} and p.unprepare([]) == {}


def test_prepare_writes_one_cdi_spec_from_the_device_plugin_builder(tmp_path: Path) -> None:
    src = Claims()
    ref = src.add(claim(result("gpu-1", consumedCapacity=SHARED)))
    p = preparer(tmp_path, src)
    out = p.prepare([ref])[UID]
    assert out.error == ""
    [dev] = out.devices
    assert (dev.requests, dev.pool, dev.device) == (("slice",), NODE, "gpu-1")
    assert dev.cdi_device_ids == (f"{DRIVER}/claim={UID}-gpu-1",)
    assert stat.S_IMODE(os.stat(spec_path(tmp_path)).st_mode) == 0o644
    spec = read_spec(tmp_path)
    assert spec["kind"] == f"{DRIVER}/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-1"]
    # The same response the device-plugin mode gives a container holding this share.
    cfg = config(tmp_path)
    backend = DummyBackend(cfg.dummy, NODE)
    d1 = backend.devices()[1]
    entry = LedgerEntry(
        ref=ContainerRef("ns", "c", "claim", UID), request=ContainerRequest(4, 30),
        shares=(DeviceShare(d1.uuid, 4, 30),), source=EntrySource.NODE_AGENT,
        created_at=0.0, updated_at=0.0,
    )
    dp = build(entry, ({d1.uuid: d1}).get, backend.naming(), cfg.runtime, 1024)
    assert env(spec) == dict(dp.envs)
    assert env(spec)["DUMMY_VISIBLE_DEVICES"] == d1.uuid
    assert env(spec)["GPU_SHARE_MEMORY_LIMIT_MIB"] == "4096"
    assert env(spec)["GPU_SHARE_CORE_PERCENT"] == "30"


def test_prepare_is_idempotent_and_survives_a_restart(tmp_path: Path) -> None:
    src = Claims()
    ref = src.add(claim(result("gpu-0", consumedCapacity=SHARED)))
    first = preparer(tmp_path, src).prepare([ref])
    spec = read_spec(tmp_path)
    p = preparer(tmp_path, src)  # a restarted agent
    assert p.prepare([ref]) == first
    assert p.prepare([ref]) == first
    assert src.reads == 1
    spec_path(tmp_path).unlink()  # /var/run after a reboot
    assert p.prepare([ref]) == first
    assert read_spec(tmp_path) == spec
    assert src.reads == 1


def test_unprepare_needs_only_the_uid(tmp_path: Path) -> None:
    src = Claims()
    ref = src.add(claim(result(consumedCapacity=SHARED)))
    p = preparer(tmp_path, src)
    p.prepare([ref])
    assert p.unprepare([ClaimRef("", "", UID)]) == {UID: ""}
    assert not spec_path(tmp_path).exists()
    ckpt = json.loads((tmp_path / "plugin" / CHECKPOINT_FILE).read_text())
    assert ckpt["claims"] == {}
    assert p.unprepare([ClaimRef("ns", "gone", UID2), ClaimRef("ns", "x", "../x")]) == {
        UID2: "", "../x": ""}
    # Prepared again after an unprepare: read again.
    assert p.prepare([ref])[UID].error == ""
    assert src.reads == 2


def test_exclusive_claim_gets_whole_devices(tmp_path: Path) -> None:
    src = Claims()
    full = {"memory": "16Gi", "cores": "100"}
    ref = src.add(claim(result("gpu-0", consumedCapacity=full),
                        result("gpu-2", consumedCapacity=full)))
    out = preparer(tmp_path, src).prepare([ref])[UID]
    assert [d.device for d in out.devices] == ["gpu-0", "gpu-2"]
    e = env(read_spec(tmp_path))
    assert e["GPU_SHARE_MEMORY_LIMIT_MIB"] == "16384,16384"
    assert e["GPU_SHARE_CORE_PERCENT"] == "100"
    assert len(e["DUMMY_VISIBLE_DEVICES"].split(",")) == 2


def _mps_daemon(pipe_dir: Path) -> socket.socket:
    """What the enforcement check sees of a running MPS control daemon."""
    pipe_dir.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(pipe_dir / "control"))
    s.listen(4)
    return s


def test_opaque_config_picks_mps(tmp_path: Path) -> None:
    """A tenant's config may raise the pool's mode (none -> mps) where the node runs
    MPS."""
    src = Claims()
    ref = src.add(claim(result(consumedCapacity=SHARED), config=[opaque({"enforcement": "mps"})]))
    with _mps_daemon(tmp_path / "mps"):
        out = preparer(tmp_path, src, mps={"pipeDir": str(tmp_path / "mps")}).prepare([ref])
    assert out[UID].error == ""
    e = env(read_spec(tmp_path))
    assert e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"


def test_a_tenants_config_cannot_lower_the_pools_mode(tmp_path: Path) -> None:
    """On a hami-core pool a claim's own config naming "none" would get no limit env and
    no preload: refused, nothing written. Its class (the admin) may choose it."""
    src = Claims()
    ref = src.add(claim(result(consumedCapacity=SHARED),
                        config=[opaque({"enforcement": "none"})]))
    out = preparer(tmp_path, src, enforcement="hami-core").prepare([ref])[UID]
    assert "ClaimEnforcementLowered" not in out.error  # the text says why, not the code
    assert "asks enforcement 'none', below the 'hami-core' in force" in out.error
    assert not spec_path(tmp_path).exists() and not (tmp_path / "vgpu" / f"claim_{UID}").exists()
    # A missing or unknown source is the tenant's too.
    for cfg in ({"source": "Whatever", "opaque": {"driver": DRIVER,
                                                  "parameters": {"enforcement": "none"}}},
                {"opaque": {"driver": DRIVER, "parameters": {"enforcement": "none"}}}):
        src.add(claim(result(consumedCapacity=SHARED), config=[cfg]))
        assert "below" in preparer(tmp_path, src, enforcement="hami-core").prepare(
            [ref])[UID].error
    # The admin's class config may, and a tenant's config cannot go below the class's.
    src.add(claim(result(consumedCapacity=SHARED),
                  config=[opaque({"enforcement": "none"}, source="FromClass")]))
    assert preparer(tmp_path, src, enforcement="hami-core").prepare([ref])[UID].error == ""


def test_a_tenant_cannot_raise_to_a_mode_the_node_cannot_enforce(tmp_path: Path) -> None:
    """mps asked on a node without the MPS daemon would run with neither HAMi-core nor
    MPS: refused."""
    src = Claims()
    ref = src.add(claim(result(consumedCapacity=SHARED), config=[opaque({"enforcement": "mps"})]))
    p = preparer(tmp_path, src, enforcement="hami-core", mps={"pipeDir": str(tmp_path / "no")})
    err = p.prepare([ref])[UID].error
    assert "enforcement 'mps' unavailable: MPS control daemon not running" in err
    assert not spec_path(tmp_path).exists()


def test_pool_hami_core_gets_a_cache_dir_per_claim(tmp_path: Path) -> None:
    src = Claims()
    ref = src.add(claim(result(consumedCapacity=SHARED)))
    p = preparer(tmp_path, src, enforcement="hami-core")
    p.prepare([ref])
    spec = read_spec(tmp_path)
    cache = tmp_path / "vgpu" / f"claim_{UID}"
    assert cache.is_dir()
    mounts = {m["containerPath"]: m for m in spec["containerEdits"]["mounts"]}
    assert mounts["/tmp/vgpu"]["hostPath"] == str(cache)
    assert env(spec)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    p.unprepare([ClaimRef("ns", "c", UID)])
    assert not cache.exists()


def test_cdi_pools_get_the_device_nodes_inline(tmp_path: Path) -> None:
    src = Claims()
    ref = src.add(claim(result("gpu-2", consumedCapacity=SHARED)))
    preparer(tmp_path, src, deviceListStrategy=["cdi-cri"]).prepare([ref])
    edits = read_spec(tmp_path)["containerEdits"]
    paths = [n["path"] for n in edits["deviceNodes"]]
    assert paths == ["/dev/dummy-npuctl", "/dev/dummy-npu2"]
    assert "DUMMY_VISIBLE_DEVICES" not in env(read_spec(tmp_path))


@pytest.mark.parametrize(
    ("setup", "word"),
    [
        (lambda s: setattr(s, "fail", KubeAccessError("get resourceclaim ns/c: timed out")),
         "timed out"),
        (lambda s: s.objs[("ns", "c")]["metadata"].update(uid="other"), "uid"),
        (lambda s: s.objs[("ns", "c")]["status"]["allocation"]["devices"]["results"][0]
         .update(device="gpu-9"), "not on this node"),
    ],
    ids=["unreachable", "uid", "device"],
)
def test_failures_are_per_claim_errors_and_leave_nothing(
    tmp_path: Path, setup: Any, word: str
) -> None:
    src = Claims()
    ref = src.add(claim(result(consumedCapacity=SHARED)))
    ok = src.add(claim(result(consumedCapacity=SHARED)), name="d", uid=UID2)
    setup(src)
    p = preparer(tmp_path, src)
    out = p.prepare([ref, ok] if src.fail is None else [ref])
    assert word in out[UID].error and not out[UID].devices
    assert not spec_path(tmp_path).exists()
    assert UID not in p.prepared()
    if src.fail is None:
        assert out[UID2].error == "" and out[UID2].devices


def _claim_doc(uid: str = "u-1", **fields: Any) -> bytes:
    """A checkpoint of one well-formed claim but for ``fields``."""
    entry = {"namespace": "ns", "name": "c", "devices": [], "spec": {}, "hostDir": "",
             "shares": [], **fields}
    return json.dumps({"version": "v1", "driver": "gpu-share.vendor.com",
                       "claims": {uid: entry}}).encode()


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"version": "v9", "driver": "gpu-share.vendor.com", "claims": {}}',
     b'{"version": "v1", "driver": "gpu-share.vendor.com", "claims": {"u": 3}}',
     b"[" * 100_000,
     _claim_doc(shares=[{"device": "gpu-0", "memoryUnits": "4", "cores": 0,
                         "exclusive": False}]),
     _claim_doc(shares=[{"device": "gpu-0", "memoryUnits": 4, "cores": 0,
                         "exclusive": "false"}]),
     _claim_doc(devices={"pool": "p"}),
     _claim_doc(namespace="n" * 100_000),
     _claim_doc(uid="../../etc")],
    ids=["json", "list", "version", "entry", "deep", "count-text", "flag-text",
         "devices-object", "namespace-huge", "uid-path"],
)
def test_a_corrupt_checkpoint_is_set_aside(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / CHECKPOINT_FILE).write_bytes(content)
    src = Claims()
    ref = src.add(claim(result(consumedCapacity=SHARED)))
    with caplog.at_level(logging.ERROR):
        p = preparer(tmp_path, src)
    assert "checkpoint" in caplog.text and "unusable" in caplog.text
    aside = list((tmp_path / "plugin").glob(f"{CHECKPOINT_FILE}.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == content
    assert p.prepare([ref])[UID].error == ""
    ckpt = json.loads((tmp_path / "plugin" / CHECKPOINT_FILE).read_text())
    assert list(ckpt["claims"]) == [UID]


def test_concurrent_calls(tmp_path: Path) -> None:
    src = Claims()
    refs = [src.add(claim(result(f"gpu-{i % 3}", consumedCapacity={"memory": "1Gi"})),
                    name=f"c{i}", uid=f"{i:08d}-0000-4000-8000-000000000000")
            for i in range(12)]
    p = preparer(tmp_path, src)
    errors: list[str] = []

    def work(k: int) -> None:
        for _ in range(5):
            for r in refs[k % 3::3]:
                errors.extend(v.error for v in p.prepare([r]).values() if v.error)
        if k % 2:
            errors.extend(v for v in p.unprepare(refs[k % 3::3]).values() if v)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    p.prepare(refs)
    ckpt = json.loads((tmp_path / "plugin" / CHECKPOINT_FILE).read_text())
    assert sorted(ckpt["claims"]) == sorted(r.uid for r in refs)
    assert all(spec_path(tmp_path, r.uid).exists() for r in refs)
    assert len(list((tmp_path / "cdi").iterdir())) == len(refs)  # no temp files left


def test_a_claim_that_would_over_commit_a_device_is_refused_until_the_other_goes(
    tmp_path: Path,
) -> None:
    """The scheduler never allocates beyond a device's capacity, but a forged or stale
    claim status must not either: a claim that, with those prepared on the node, would
    give a device more than it has is refused (the kubelet retries), also after a
    restart (the checkpoint keeps every claim's shares)."""
    src = Claims()
    first = src.add(claim(result("gpu-0", consumedCapacity={"memory": "10Gi", "cores": "70"})))
    second = src.add(claim(result("gpu-0", consumedCapacity={"memory": "4Gi", "cores": "40"})),
                     name="d", uid=UID2)
    p = preparer(tmp_path, src)
    assert p.prepare([first])[UID].error == ""
    refused = p.prepare([second])[UID2]
    assert "110/100 cores" in refused.error and refused.devices == ()
    assert not spec_path(tmp_path, UID2).exists()
    again = preparer(tmp_path, src)  # a restarted agent: shares from the checkpoint
    assert "110/100 cores" in again.prepare([second])[UID2].error
    assert again.unprepare([first]) == {UID: ""}
    assert again.prepare([second])[UID2].error == ""


def test_a_whole_device_claim_is_not_prepared_next_to_a_share(tmp_path: Path) -> None:
    src = Claims()
    share = src.add(claim(result("gpu-2", consumedCapacity={"memory": "1Gi", "cores": "0"})))
    whole = src.add(claim(result("gpu-2")), name="d", uid=UID2)  # no consumedCapacity: all
    p = preparer(tmp_path, src)
    assert p.prepare([share])[UID].error == ""
    assert "held whole" in p.prepare([whole])[UID2].error


BIG = {"memory": "14Gi", "cores": "80"}  # most of gpu-0 (dummy: 16 GiB)


def _churn(tmp_path: Path) -> tuple[Claims, DraClaimPreparer, ClaimRef, ClaimRef]:
    """A claim holding most of gpu-0 is prepared; a new one asks more than is left."""
    src = Claims()
    old = src.add(claim(result("gpu-0", consumedCapacity=dict(BIG))))
    new = src.add(claim(result("gpu-0", consumedCapacity=dict(SHARED))), name="d", uid=UID2)
    p = preparer(tmp_path, src)
    assert p.prepare([old])[UID].error == ""
    return src, p, old, new


def test_a_holder_deleted_in_the_api_frees_its_capacity_before_its_unprepare(
    tmp_path: Path,
) -> None:
    """The kubelet unprepares a finished pod's claims only after the API deallocated and
    deleted them (seen on the local cluster: the next pod's prepare came ~2 s before the
    old claim's unprepare, and the kubelet's retry 40 s later). A holder that is gone
    from the API no longer counts; it stays prepared until its unprepare."""
    src, p, old, new = _churn(tmp_path)
    refused = p.prepare([new])[UID2]
    assert "18/16 memory units" in refused.error  # the old claim is still in the API
    del src.objs[("ns", old.name)]
    assert p.prepare([new])[UID2].error == ""
    assert spec_path(tmp_path, UID).exists() and UID in p.prepared()  # until its unprepare
    assert p.unprepare([old]) == {UID: ""}
    assert not spec_path(tmp_path, UID).exists()
    assert set(p.prepared()) == {UID2}


@pytest.mark.parametrize("change", ["no allocation", "another claim of that name"])
def test_a_holder_deallocated_or_replaced_in_the_api_frees_its_capacity(
    tmp_path: Path, change: str
) -> None:
    src, p, old, new = _churn(tmp_path)
    obj = src.objs[("ns", old.name)]
    if change == "no allocation":
        obj["status"] = {}  # deallocated, deletion pending
    else:
        obj["metadata"]["uid"] = "0badc0de-1111-4222-8333-444455556666"
    assert p.prepare([new])[UID2].error == ""


def test_a_holder_that_cannot_be_read_keeps_its_capacity(tmp_path: Path) -> None:
    src, p, old, new = _churn(tmp_path)
    del src.objs[("ns", old.name)]
    src.unreadable.add(old.name)
    refused = p.prepare([new])[UID2]
    assert "18/16 memory units" in refused.error and refused.devices == ()
    assert not spec_path(tmp_path, UID2).exists()


def test_a_holder_still_allocated_keeps_its_capacity_and_a_restart_rechecks(
    tmp_path: Path,
) -> None:
    src, p, old, new = _churn(tmp_path)
    reads = src.reads
    assert "18/16 memory units" in p.prepare([new])[UID2].error
    assert src.reads == reads + 2  # the new claim, then its holder once
    del src.objs[("ns", old.name)]
    again = preparer(tmp_path, src)  # restarted: the old claim comes from the checkpoint
    assert again.prepare([new])[UID2].error == ""
    assert set(again.prepared()) == {UID, UID2}


def test_no_new_claim_while_the_node_cannot_enforce_but_prepared_ones_stay(
    tmp_path: Path,
) -> None:
    """The pool's enforcement is checked (agent/enforcement.py); while it is unavailable
    a new claim is refused with the reason, and a claim prepared before is answered."""
    src = Claims()
    first = src.add(claim(result("gpu-0", consumedCapacity=SHARED)))
    second = src.add(claim(result("gpu-1", consumedCapacity=SHARED)), name="d", uid=UID2)
    cfg = config(tmp_path, enforcement="hami-core")
    backend = DummyBackend(cfg.dummy, NODE)
    inv = Inventory.from_devices(backend.devices(), cfg.memory_unit_mib)
    status = [EnforcementStatus(EnforcementMode.HAMI_CORE)]
    p = DraClaimPreparer(cfg, src, lambda: inv, backend.naming(),
                         enforcement=lambda: status[0])
    assert p.prepare([first])[UID].error == ""
    status[0] = EnforcementStatus(EnforcementMode.HAMI_CORE, ("library /x missing",))
    err = p.prepare([second])[UID2].error
    assert "enforcement 'hami-core' unavailable: library /x missing" in err
    assert p.prepare([first])[UID].error == ""  # kubelet restart: answered again
    status[0] = EnforcementStatus(EnforcementMode.HAMI_CORE)
    assert p.prepare([second])[UID2].error == ""


def test_a_cordoned_device_takes_no_new_claim_whatever_the_taint_gate(tmp_path: Path) -> None:
    """The API server drops the cordon's slice taint without the DRADeviceTaints gate, so
    the scheduler may allocate a cordoned device: prepare refuses it."""
    src = Claims()
    ref = src.add(claim(result("gpu-2", consumedCapacity=SHARED)))
    cfg = config(tmp_path)
    backend = DummyBackend(cfg.dummy, NODE)
    devs = backend.devices()
    inv = Inventory.from_devices(devs, cfg.memory_unit_mib).with_cordons([devs[2].uuid])
    refused: list[str] = []
    p = DraClaimPreparer(cfg, src, lambda: inv, backend.naming(), on_refused=refused.append)
    err = p.prepare([ref])[UID].error
    assert "gpu-2" in err and "cordoned" in err
    assert p.prepared() == {}
    assert refused == ["DeviceCordoned"]  # the metric's label


def test_an_auto_pool_prepares_claims_in_the_mode_in_force(tmp_path: Path) -> None:
    """``auto``: a claim gets the mode the agent resolved for the node (here HAMi-core),
    and a tenant's config may raise it but not lower it below that mode."""
    src = Claims()
    ref = src.add(claim(result("gpu-0", consumedCapacity=SHARED)))
    low = src.add(claim(result("gpu-1", consumedCapacity=SHARED),
                        config=[opaque({"enforcement": "none"})]), name="d", uid=UID2)
    cfg = config(tmp_path, enforcement="auto")
    backend = DummyBackend(cfg.dummy, NODE)
    inv = Inventory.from_devices(backend.devices(), cfg.memory_unit_mib)
    status = [EnforcementStatus(EnforcementMode.AUTO, ("not checked yet",))]
    p = DraClaimPreparer(cfg, src, lambda: inv, backend.naming(),
                         enforcement=lambda: status[0])
    assert "not checked yet" in p.prepare([ref])[UID].error
    status[0] = EnforcementStatus(EnforcementMode.HAMI_CORE, (), EnforcementMode.AUTO)
    assert p.prepare([ref])[UID].error == ""
    assert env(read_spec(tmp_path))["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert (tmp_path / "vgpu" / f"claim_{UID}").is_dir()
    assert "below the 'hami-core' in force" in p.prepare([low])[UID2].error


def test_a_claim_may_burst_to_its_memory_limit_under_driver_limits(tmp_path: Path) -> None:
    """Placement counts the 4Gi claimed; the toolkit's hook gets it as the soft limit
    (REQUEST) and the config's memoryLimit as the hard one (LIMIT)."""
    src = Claims()
    ref = src.add(claim(result("gpu-0", consumedCapacity=SHARED),
                        config=[opaque({"memoryLimit": "8Gi"})]))
    out = preparer(tmp_path, src, enforcement="nvidia-memory-limits").prepare([ref])[UID]
    assert out.error == ""
    e = env(read_spec(tmp_path))
    assert (e["NVIDIA_GPU_MEMORY_REQUEST"], e["NVIDIA_GPU_MEMORY_LIMIT"]) == ("4096", "8192")
    assert e["GPU_SHARE_MEMORY_LIMIT_MIB"] == "4096"  # what the slice holds


@pytest.mark.parametrize(("mode", "says"), [
    ("hami-core", "needs enforcement 'nvidia-memory-limits'; in force here: 'hami-core'"),
    ("mps", "in force here: 'mps'"),
])
def test_a_memory_limit_above_the_claim_is_refused_where_nothing_can_let_it_burst(
    tmp_path: Path, mode: str, says: str
) -> None:
    src = Claims()
    ref = src.add(claim(result("gpu-0", consumedCapacity=SHARED),
                        config=[opaque({"memoryLimit": "8Gi"})]))
    with _mps_daemon(tmp_path / "mps"):
        p = preparer(tmp_path, src, enforcement=mode, mps={"pipeDir": str(tmp_path / "mps")})
        out = p.prepare([ref])[UID]
        assert says in out.error and not spec_path(tmp_path).exists()
        # Equal to what it claims: nothing to burst, fine in any mode.
        src.add(claim(result("gpu-0", consumedCapacity=SHARED),
                      config=[opaque({"memoryLimit": "4Gi"})]))
        assert p.prepare([ref])[UID].error == ""


def test_a_claim_just_prepared_counts_once_for_one_reserving_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a claim's checkpoint record and the end of its prepare call, another
    claim may reserve (the kubelet prepares several pods' claims at once): the first
    one's shares count once, so two claims that fill gpu-0 exactly both prepare. (Seen
    on the local cluster: a 2-unit claim counted twice refused its neighbour with
    "14/16 memory units and 120/100 cores".)"""
    src = Claims()
    first = src.add(claim(result("gpu-0", consumedCapacity={"memory": "4Gi", "cores": "30"})))
    second = src.add(claim(result("gpu-0", consumedCapacity={"memory": "12Gi", "cores": "70"})),
                     name="d", uid=UID2)
    p = preparer(tmp_path, src)
    record = p._record
    seen: list[str] = []

    def record_then_another_prepares(uid: str, prepared: Any) -> None:
        record(uid, prepared)
        if uid == UID:  # still inside the first claim's prepare call
            seen.append(p.prepare([second])[UID2].error)

    monkeypatch.setattr(p, "_record", record_then_another_prepares)
    assert p.prepare([first])[UID].error == ""
    assert seen == [""]
    assert set(p.prepared()) == {UID, UID2}
