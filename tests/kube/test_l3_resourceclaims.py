"""L3: DRA claims against a real kube-apiserver + etcd (conftest.py, with the
DRAConsumableCapacity gate on): a DeviceClass and ResourceClaims created, their
status.allocation written through the status subresource as kube-scheduler does
(consumedCapacity and shareID for shares of a device), then read with
kube.resourceclaims and prepared by agent.dra.claims over dummy devices: the CDI spec on
disk, idempotency, a restart from the checkpoint, unprepare."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
from kube_fakes import ApiServer

from gpu_share.agent.dra.claims import CHECKPOINT_FILE, DraClaimPreparer
from gpu_share.agent.dra.ports import ClaimRef
from gpu_share.config.model import AgentConfig
from gpu_share.devices.dummy import DummyBackend
from gpu_share.kube.resourceclaims import ClaimNotFoundError, KubeClaimReader, claim_path
from gpu_share.kube.rest import MERGE_PATCH, ApiError, RestClient, make_rest_client
from gpu_share.sharing.inventory import Inventory

pytestmark = pytest.mark.apiserver

DRIVER = "gpu-share.vendor.com"
NODE = "node-dra"
RESOURCE = "/apis/resource.k8s.io/v1"


@pytest.fixture(scope="module")
def rest(apiserver: ApiServer) -> RestClient:
    return make_rest_client(apiserver.kubeconfig)


@pytest.fixture(scope="module")
def ns(rest: RestClient) -> str:
    name = f"dra-{uuid.uuid4().hex[:6]}"
    rest.create("create ns", "/api/v1/namespaces", {"metadata": {"name": name}})
    rest.create("create deviceclass", f"{RESOURCE}/deviceclasses", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"{DRIVER}-{name}"},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    })
    return name


def make_claim(rest: RestClient, ns: str, name: str, request: dict[str, Any],
               config: list[Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": [
        {"name": "slice", "exactly": {"deviceClassName": f"{DRIVER}-{ns}", **request}}]}}
    if config is not None:
        spec["devices"]["config"] = config
    obj: dict[str, Any] = rest.create(
        "create claim", f"{RESOURCE}/namespaces/{ns}/resourceclaims",
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": name, "namespace": ns}, "spec": spec},
    )
    return obj


def allocate(rest: RestClient, ns: str, name: str, results: list[dict[str, Any]],
             config: list[Any] | None = None) -> dict[str, Any]:
    """Write status.allocation as the scheduler does (status subresource)."""
    devices: dict[str, Any] = {"results": [
        {"request": "slice", "driver": DRIVER, "pool": NODE, **r} for r in results]}
    if config is not None:
        devices["config"] = config
    allocation = {
        "devices": devices,
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
    }
    obj: dict[str, Any] = rest.patch(
        "allocate claim", claim_path(ns, name) + "/status",
        {"status": {"allocation": allocation}}, content_type=MERGE_PATCH,
    )
    return obj


def cfg(tmp: Path) -> AgentConfig:
    return AgentConfig.model_validate({
        "nodeName": NODE, "backend": "dummy", "dummy": {"deviceCount": 2},
        "runtime": {"mps": {"pipeDir": str(tmp / "mps")}},
        "dra": {"enabled": True, "pluginDir": str(tmp / "plugin"), "cdiDir": str(tmp / "cdi")},
    })


def preparer(tmp: Path, reader: KubeClaimReader) -> DraClaimPreparer:
    c = cfg(tmp)
    backend = DummyBackend(c.dummy, NODE)
    inv = Inventory.from_devices(backend.devices(), c.memory_unit_mib)
    return DraClaimPreparer(c, reader, lambda: inv, backend.naming())


class Counting(KubeClaimReader):
    reads = 0

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        return super().get_claim(namespace, name)


def test_shared_claim_prepared_from_the_apiserver(
    rest: RestClient, ns: str, tmp_path: Path
) -> None:
    created = make_claim(rest, ns, "shared", {
        "allocationMode": "ExactCount", "count": 1,
        "capacity": {"requests": {"memory": "4Gi", "cores": "30"}}},
        config=[{"opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": f"{DRIVER}/v1alpha1", "kind": "SliceConfig", "enforcement": "mps"}}}])
    # The gate is on: the apiserver kept the capacity request.
    assert created["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"memory": "4Gi", "cores": "30"}}
    uid = created["metadata"]["uid"]
    allocated = allocate(rest, ns, "shared", [{
        "device": "gpu-1", "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"memory": "4Gi", "cores": "30"}}],
        config=[{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": f"{DRIVER}/v1alpha1", "kind": "SliceConfig", "enforcement": "mps"}}}])
    result = allocated["status"]["allocation"]["devices"]["results"][0]
    assert result["consumedCapacity"] == {"memory": "4Gi", "cores": "30"}
    assert result["shareID"]

    reader = Counting(rest)
    p = preparer(tmp_path, reader)
    ref = ClaimRef(ns, "shared", uid)
    # The claim raises the pool's mode to mps: the node must run MPS (its control socket).
    (tmp_path / "mps").mkdir()
    with socket.socket(socket.AF_UNIX) as daemon:
        daemon.bind(str(tmp_path / "mps" / "control"))
        daemon.listen(4)
        out = p.prepare([ref])[uid]
    assert out.error == ""
    assert [(d.device, d.pool, d.requests) for d in out.devices] == [("gpu-1", NODE, ("slice",))]
    assert out.devices[0].cdi_device_ids == (f"{DRIVER}/claim={uid}-gpu-1",)
    spec_file = tmp_path / "cdi" / f"{DRIVER}-claim_{uid}.json"
    spec = json.loads(spec_file.read_text())
    assert spec["kind"] == f"{DRIVER}/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-gpu-1"]
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    assert env["GPU_SHARE_MEMORY_LIMIT_MIB"] == "4096"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"

    # Idempotent, and after a restart answered from the checkpoint: one API read in all.
    assert p.prepare([ref])[uid] == out
    again = preparer(tmp_path, reader)
    assert again.prepare([ref])[uid] == out
    assert reader.reads == 1

    assert again.unprepare([ClaimRef("", "", uid)]) == {uid: ""}
    assert not spec_file.exists()
    ckpt = json.loads((tmp_path / "plugin" / CHECKPOINT_FILE).read_text())
    assert ckpt["claims"] == {}


def test_exclusive_claim_gets_whole_devices(rest: RestClient, ns: str, tmp_path: Path) -> None:
    created = make_claim(rest, ns, "whole", {
        "allocationMode": "ExactCount", "count": 2,
        "capacity": {"requests": {"cores": "100"}}})
    uid = created["metadata"]["uid"]
    full = {"memory": "16Gi", "cores": "100"}
    allocate(rest, ns, "whole", [
        {"device": "gpu-0", "shareID": str(uuid.uuid4()), "consumedCapacity": full},
        {"device": "gpu-1", "shareID": str(uuid.uuid4()), "consumedCapacity": full},
    ])
    out = preparer(tmp_path, KubeClaimReader(rest)).prepare([ClaimRef(ns, "whole", uid)])[uid]
    assert out.error == "" and [d.device for d in out.devices] == ["gpu-0", "gpu-1"]
    spec = json.loads((tmp_path / "cdi" / f"{DRIVER}-claim_{uid}.json").read_text())
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    assert env["GPU_SHARE_MEMORY_LIMIT_MIB"] == "16384,16384"


def test_recreated_claim_and_missing_claim_are_refused(
    rest: RestClient, ns: str, tmp_path: Path
) -> None:
    created = make_claim(rest, ns, "again", {"allocationMode": "ExactCount", "count": 1})
    allocate(rest, ns, "again", [{"device": "gpu-0"}])
    p = preparer(tmp_path, KubeClaimReader(rest))
    stale = str(uuid.uuid4())
    assert "uid" in p.prepare([ClaimRef(ns, "again", stale)])[stale].error
    uid = created["metadata"]["uid"]
    assert p.prepare([ClaimRef(ns, "again", uid)])[uid].error == ""  # no capacity: whole
    missing = p.prepare([ClaimRef(ns, "nope", stale)])[stale]
    assert "not found" in missing.error and not missing.devices
    with pytest.raises(ClaimNotFoundError):
        KubeClaimReader(rest).get_claim(ns, "nope")


def test_what_the_apiserver_accepts_in_a_result(
    rest: RestClient, ns: str, tmp_path: Path
) -> None:
    """shareID is optional next to consumedCapacity (1.34) but must be a UUID; we read
    the capacity either way."""
    created = make_claim(rest, ns, "noshare", {"allocationMode": "ExactCount", "count": 1,
                                               "capacity": {"requests": {"cores": "10"}}})
    allocate(rest, ns, "noshare", [{"device": "gpu-0", "consumedCapacity": {"cores": "10"}}])
    uid = created["metadata"]["uid"]
    out = preparer(tmp_path, KubeClaimReader(rest)).prepare([ClaimRef(ns, "noshare", uid)])
    assert out[uid].error == "" and out[uid].devices[0].device == "gpu-0"
    make_claim(rest, ns, "badshare", {"allocationMode": "ExactCount", "count": 1})
    with pytest.raises(ApiError) as info:
        allocate(rest, ns, "badshare", [{"device": "gpu-0", "shareID": "abc",
                                         "consumedCapacity": {"cores": "10"}}])
    assert info.value.status == 422 and "shareID" in info.value.detail
