"""L1: the cordon parts of kubectl gpu-share: DEVICE as index, gpu-N or uuid; who writes
the cordon (refused when the name cannot be written), and what nodes shows of it (the
agent's "cordoned" apart from health, who and why from the annotation)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_share.cli import kubectl_cordon as kc
from gpu_share.cli import kubectl_format as fmt
from gpu_share.cli.kubectl_snapshot import Settings, Snapshot
from gpu_share.cli.kubectl_view import node_rows
from gpu_share.kube.rest import RestClient
from gpu_share.sharing.annotations import InventoryAnnotation, InventoryDevice, inventory_key
from gpu_share.sharing.cordon import Cordon, cordon_key, parse_cordon
from tests.cli.objects import DOMAIN, node_obj


def _inventory(cordoned: bool = False) -> str:
    return InventoryAnnotation("n1", 1024, (
        InventoryDevice("GPU-n1-0", 0, "T4", 16, 0, 100, 0, True, 0),
        InventoryDevice("GPU-n1-1", 1, "T4", 16, 4, 100, 20, True, 0, cordoned=cordoned),
    )).encode()


class FakeApi:
    """get node / patch node / SelfSubjectReview, recorded."""

    def __init__(self, annotations: dict[str, str], user: str = "alice") -> None:
        self.annotations = annotations
        self.user = user
        self.patches: list[dict[str, Any]] = []

    def get(self, op: str, path: str, query: Any = None) -> Any:
        return {"metadata": {"name": "n1", "annotations": dict(self.annotations)}}

    def patch(self, op: str, path: str, body: Any, content_type: str = "") -> Any:
        assert content_type == kc.MERGE_PATCH and path == "/api/v1/nodes/n1"
        self.patches.append(body)
        for k, v in body["metadata"]["annotations"].items():
            if v is None:
                self.annotations.pop(k, None)
            else:
                self.annotations[k] = v
        return {}

    def create(self, op: str, path: str, body: Any) -> Any:
        assert path.endswith("/selfsubjectreviews") and body["kind"] == "SelfSubjectReview"
        return {"status": {"userInfo": {"username": self.user}}}


def _api(fake: FakeApi) -> RestClient:
    return fake  # type: ignore[return-value]


@pytest.mark.parametrize("spec", ["1", "gpu-1", "GPU-n1-1"])
def test_device_named_three_ways(spec: str) -> None:
    fake = FakeApi({inventory_key(DOMAIN): _inventory()})
    line = kc.cordon(_api(fake), "n1", spec, DOMAIN, "ECC", now=lambda: "2026-11-24T06:00:00Z")
    assert line == "node/n1 gpu 1 (GPU-n1-1) cordoned"
    value = fake.annotations[cordon_key(DOMAIN, "GPU-n1-1")]
    assert parse_cordon(value) == Cordon("alice", "ECC", "2026-11-24T06:00:00Z")
    assert kc.cordon(_api(fake), "n1", spec, DOMAIN, "ECC").endswith("already cordoned")
    assert len(fake.patches) == 1
    assert kc.uncordon(_api(fake), "n1", spec, DOMAIN).endswith(" uncordoned")
    assert kc.uncordon(_api(fake), "n1", spec, DOMAIN).endswith("already uncordoned")


def test_refusals_name_the_problem() -> None:
    fake = FakeApi({inventory_key(DOMAIN): _inventory()})
    with pytest.raises(kc.CordonCommandError, match=r"no device '5'; devices: 0 \(GPU-n1-0\)"):
        kc.cordon(_api(fake), "n1", "5", DOMAIN, "")
    with pytest.raises(kc.CordonCommandError, match="one line"):
        kc.cordon(_api(fake), "n1", "0", DOMAIN, "two\nlines")
    with pytest.raises(kc.CordonCommandError, match="cannot be written"):
        kc.cordon(_api(FakeApi(fake.annotations, user='ev"il')), "n1", "0", DOMAIN, "")
    with pytest.raises(kc.CordonCommandError, match="no gpu-share inventory"):
        kc.cordon(_api(FakeApi({})), "n1", "0", DOMAIN, "")
    assert fake.patches == []


def test_wait_until_the_agent_honours_it() -> None:
    fake = FakeApi({inventory_key(DOMAIN): _inventory(False)})
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        fake.annotations[inventory_key(DOMAIN)] = _inventory(True)

    kc.wait_honoured(_api(fake), "n1", "1", DOMAIN, True, 5.0, sleep=sleep)
    assert len(sleeps) == 1
    with pytest.raises(kc.CordonCommandError, match="did not report gpu 1 uncordoned"):
        kc.wait_honoured(_api(fake), "n1", "1", DOMAIN, False, 0.0, sleep=sleep)


def test_nodes_shows_cordoned_apart_from_health_and_who_and_why() -> None:
    node = node_obj("n1", None)
    node["metadata"]["annotations"] = {
        inventory_key(DOMAIN): _inventory(True),
        cordon_key(DOMAIN, "GPU-n1-1"): Cordon("alice", "ECC errors, RMA 1234").encode(),
        cordon_key(DOMAIN, "GPU-n1-7"): Cordon("bob", "no such device").encode(),
    }
    snap = Snapshot.from_lists([node], [], Settings())
    (row,) = node_rows(snap)
    d0, d1 = row.devices
    assert (d0.healthy, d0.cordoned, d0.cordon) == (True, False, None)
    assert (d1.healthy, d1.cordoned) == (True, True) and d1.cordon is not None
    assert row.largest_free == (16, 100)  # the cordoned device offers no room
    (only,) = node_rows(snap, cordoned_only=True)
    assert [d.index for d in only.devices] == [1]
    table = fmt.nodes_table([row]).splitlines()
    assert "Healthy,Cordoned" in table[2] and "Cordoned" not in table[1]
    wide = fmt.nodes_table([row], wide=True).splitlines()
    assert "alice: ECC errors, RMA 1234" in wide[2] and "<none>" in wide[1]
    doc = json.loads(fmt.document(fmt.nodes_doc([row]), "json"))
    dev = doc["items"][0]["devices"][1]
    assert dev["cordoned"] is True and dev["healthy"] is True
    assert dev["cordon"] == {"by": "alice", "reason": "ECC errors, RMA 1234", "at": None}
