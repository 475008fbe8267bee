"""L3: a pool switched from DRA back to device-plugin mode, against a real kube-apiserver
+ etcd. Claims prepared in DRA mode (agent.dra.claims: CDI spec, hami-core cache dir,
checkpoint) are read by agent.dra.leftovers through kube.resourceclaims: an allocated
claim keeps its files and holds its device; a deleted claim and a deallocated one lose
theirs, and the checkpoint goes with the last."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from pathlib import Path

import pytest

from gpu_share.agent.dra.claims import CHECKPOINT_FILE, DraClaimPreparer
from gpu_share.agent.dra.leftovers import DraLeftovers
from gpu_share.agent.dra.ports import ClaimRef
from gpu_share.config.model import AgentConfig
from gpu_share.devices.dummy import DummyBackend
from gpu_share.kube.resourceclaims import KubeClaimReader, claim_path
from gpu_share.kube.rest import MERGE_PATCH, RestClient
from gpu_share.sharing.inventory import Inventory
from tests.kube.test_l3_resourceclaims import NODE, allocate, make_claim, ns, rest

pytestmark = pytest.mark.apiserver
__all__ = ["ns", "rest"]  # the fixtures, shared with the claims tests


def _cfg(tmp: Path, dra: bool) -> AgentConfig:
    return AgentConfig.model_validate({
        "nodeName": NODE, "backend": "dummy", "dummy": {"deviceCount": 2},
        "runtime": {"enforcement": "hami-core", "hamiCore": {"cacheDir": str(tmp / "vgpu")}},
        "dra": {"enabled": dra, "pluginDir": str(tmp / "plugin"), "cdiDir": str(tmp / "cdi")},
    })


def _claim(rest: RestClient, ns: str, name: str, device: str) -> str:
    created = make_claim(rest, ns, name, {"allocationMode": "ExactCount", "count": 1,
                                         "capacity": {"requests": {"memory": "4Gi"}}})
    allocate(rest, ns, name, [{"device": device, "shareID": str(uuid.uuid4()),
                               "consumedCapacity": {"memory": "4Gi"}}])
    return str(created["metadata"]["uid"])


def test_claims_left_by_dra_mode_end_with_their_pods(
    rest: RestClient, ns: str, tmp_path: Path
) -> None:
    cfg = _cfg(tmp_path, dra=True)
    backend = DummyBackend(cfg.dummy, NODE)
    inv = Inventory.from_devices(backend.devices(), cfg.memory_unit_mib)
    uuids = [d.uuid for d in backend.devices()]
    reader = KubeClaimReader(rest)
    preparer = DraClaimPreparer(cfg, reader, lambda: inv, backend.naming())
    uid_a, uid_b = _claim(rest, ns, "left-a", "gpu-0"), _claim(rest, ns, "left-b", "gpu-1")
    for name, uid in (("left-a", uid_a), ("left-b", uid_b)):
        assert preparer.prepare([ClaimRef(ns, name, uid)])[uid].error == ""
    spec = {u: tmp_path / "cdi" / f"gpu-share.vendor.com-claim_{u}.json" for u in (uid_a, uid_b)}
    cache = {u: tmp_path / "vgpu" / f"claim_{u}" for u in (uid_a, uid_b)}
    assert all(p.exists() for p in [*spec.values(), *cache.values()])

    # The pool switched back to device-plugin mode: same dirs, DRA off.
    holds: list[frozenset[str]] = []

    def hold(devices: Collection[str]) -> None:
        holds.append(frozenset(devices))

    left = DraLeftovers(_cfg(tmp_path, dra=False), hold=hold, devices=lambda: uuids)
    assert left.load() and holds[-1] == frozenset(uuids)
    assert left.step(reader) is False  # both still allocated
    assert holds[-1] == frozenset(uuids)
    assert all(p.exists() for p in [*spec.values(), *cache.values()])

    rest.request("delete claim", "DELETE", claim_path(ns, "left-b"))
    assert left.step(reader) is False
    assert not spec[uid_b].exists() and not cache[uid_b].exists()
    assert spec[uid_a].exists() and cache[uid_a].exists()
    assert holds[-1] == frozenset({uuids[0]})

    # Deallocated (as the scheduler does once its pods are gone): nothing can use it.
    rest.patch("deallocate", claim_path(ns, "left-a") + "/status",
               {"status": {"allocation": None}}, content_type=MERGE_PATCH)
    assert left.step(reader) is True
    assert not spec[uid_a].exists() and not cache[uid_a].exists()
    assert not (tmp_path / "plugin" / CHECKPOINT_FILE).exists()
    assert holds[-1] == frozenset()
