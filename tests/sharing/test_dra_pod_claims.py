"""L1: sharing/dra/pod_claims.py: the devices a DRA pod's claims were allocated, read at
the extender's bind; tenant-written input never raises and reads as "not known"."""

from __future__ import annotations

from typing import Any

from gpu_share.sharing.dra.pod_claims import allocated_indices, claim_names


def pod(statuses: Any = None) -> dict[str, Any]:
    return {
        "spec": {
            "initContainers": [{"name": "i", "resources": {"claims": [{"name": "gpu-share-i"}]}}],
            "containers": [
                {"name": "c", "resources": {"claims": [{"name": "gpu-share-c"}, {"name": "x"}]}},
                {"name": "plain"},
            ],
            "resourceClaims": [
                {"name": "gpu-share-i", "resourceClaimTemplateName": "gpu-share-m1-c10"},
                {"name": "gpu-share-c", "resourceClaimTemplateName": "gpu-share-m4-c30"},
                {"name": "x", "resourceClaimTemplateName": "theirs"},
            ],
        },
        "status": {"resourceClaimStatuses": statuses if statuses is not None else [
            {"name": "gpu-share-i", "resourceClaimName": "p-i-1"},
            {"name": "gpu-share-c", "resourceClaimName": "p-c-2"},
            {"name": "x", "resourceClaimName": "p-x-3"},
        ]},
    }


def test_claim_names_per_container_ours_only() -> None:
    assert claim_names(pod()) == {"i": ("p-i-1",), "c": ("p-c-2",)}
    # A claim not made yet: that container is not known.
    assert claim_names(pod([{"name": "gpu-share-c", "resourceClaimName": "p-c-2"}])) == {
        "c": ("p-c-2",)}
    for junk in ({}, {"spec": []}, {"spec": {}, "status": "x"}, pod("nope"), pod([7])):
        assert claim_names(junk) in ({}, {"i": ("p-i-1",), "c": ("p-c-2",)})
    assert claim_names(pod([{"name": "gpu-share-c", "resourceClaimName": 5}])) == {}


def claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": list(results)}}}}


def r(device: Any, pool: str = "n1", driver: str = "d") -> dict[str, Any]:
    return {"request": "slice", "driver": driver, "pool": pool, "device": device}


def test_allocated_indices_of_our_driver_in_the_nodes_pool() -> None:
    got = claim(r("gpu-3"), r("gpu-0"), r("gpu-1", pool="n2"), r("gpu-2", driver="nvidia"))
    assert allocated_indices(got, "d", "n1") == (3, 0)
    assert allocated_indices(claim(), "d", "n1") == ()
    for junk in (None, {}, {"status": {}}, {"status": {"allocation": 1}},
                 claim(r("gpu-01")), claim(r(7)), claim(r("../x"))):
        assert allocated_indices(junk, "d", "n1") is None
