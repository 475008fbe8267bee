"""A ResourceClaim's allocation read as our device shares (sharing/dra/claims.py, DRA
mode): shares, whole devices, the opaque SliceConfig, and every refusal typed and
bounded. Hypothesis: arbitrary JSON never raises anything but ClaimError."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_share.config.model import DummyConfig, EnforcementMode
from gpu_share.devices.base import Device, DeviceNode
from gpu_share.devices.dummy import DummyBackend
from gpu_share.sharing.cdi import ENV_CDI_DEVICE_PREFIX
from gpu_share.sharing.dra.cdi import claim_cdi_device_id, claim_cdi_spec, claim_spec_file_name
from gpu_share.sharing.dra.claims import over_capacity, parse_claim
from gpu_share.sharing.dra.reading import ClaimError, ClaimReason
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import AllocateSpec, DeviceShare, Mount

DRIVER = "gpu-share.vendor.com"
NODE = "node-a"
UID = "0b7c1a52-5d3e-4f57-9a65-0c1c3d7e2f10"
UNIT = 1024  # MiB; dummy devices have 16 GiB: 16 units


def inventory(unhealthy: tuple[int, ...] = ()) -> Inventory:
    devs = DummyBackend(DummyConfig(device_count=3), NODE).devices()
    devs = [replace(d, healthy=d.index not in unhealthy) for d in devs]
    return Inventory.from_devices(devs, UNIT)


def result(device: str = "gpu-0", request: str = "slice", **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": NODE, "device": device}
    r.update(extra)
    return r


def claim(*results: dict[str, Any], config: list[Any] | None = None,
          uid: str = UID) -> dict[str, Any]:
    devices: dict[str, Any] = {"results": list(results)}
    if config is not None:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "slice"}]}},
        "status": {"allocation": {"devices": devices}},
    }


def opaque(params: Any, requests: list[str] | None = None, driver: str = DRIVER,
           source: str = "FromClaim") -> dict[str, Any]:
    c: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        c["requests"] = requests
    return c


def parse(obj: Any, inv: Inventory | None = None, uid: str = UID) -> Any:
    return parse_claim(obj, uid=uid, driver=DRIVER, pool=NODE, inventory=inv or inventory())


def refused(obj: Any, reason: ClaimReason, inv: Inventory | None = None,
            uid: str = UID) -> ClaimError:
    with pytest.raises(ClaimError) as info:
        parse(obj, inv, uid)
    assert info.value.reason == reason.value, info.value
    assert len(str(info.value)) < 400
    return info.value


# ---------------------------------------------------------------- shares


def test_a_shared_slice() -> None:
    c = parse(claim(result("gpu-1", consumedCapacity={"memory": "4Gi", "cores": "30"})))
    uuid = inventory().devices[1].uuid
    assert (c.uid, c.namespace, c.name, c.enforcement) == (UID, "ns", "c", None)
    assert [(d.name, d.requests, d.index) for d in c.devices] == [("gpu-1", ("slice",), 1)]
    assert c.shares == (DeviceShare(uuid, 4, 30, exclusive=False),)
    assert (c.request.memory_units, c.request.cores) == (4, 30)


@pytest.mark.parametrize("memory", ["4096Mi", "4294967296", "4Gi", "0.00390625Ti"])
def test_memory_in_any_exact_quantity(memory: str) -> None:
    c = parse(claim(result(consumedCapacity={"memory": memory, "cores": "0"})))
    assert c.shares[0].memory_units == 4 and c.shares[0].cores == 0


def test_no_memory_named_is_the_whole_memory() -> None:
    c = parse(claim(result(consumedCapacity={"cores": "20"})))
    assert c.shares[0] == DeviceShare(inventory().devices[0].uuid, 16, 20, exclusive=False)


def test_exclusive_request_gets_whole_devices() -> None:
    full = {"memory": "16Gi", "cores": "100"}
    c = parse(claim(result("gpu-2", consumedCapacity=full), result("gpu-0",
                                                                  consumedCapacity=full)))
    assert [d.name for d in c.devices] == ["gpu-0", "gpu-2"]  # index order
    assert all(s.exclusive and s.memory_units == 16 and s.cores == 100 for s in c.shares)


def test_without_consumed_capacity_the_device_is_whole() -> None:
    c = parse(claim(result()))
    assert c.shares[0].exclusive and c.shares[0].memory_units == 16


def test_cores_100_with_part_of_the_memory_is_a_slice_not_a_whole_device() -> None:
    c = parse(claim(result(consumedCapacity={"memory": "8Gi", "cores": "100"})))
    assert not c.shares[0].exclusive and c.shares[0].memory_units == 8


def test_two_shares_of_one_device_add_up() -> None:
    c = parse(claim(
        result(request="a", consumedCapacity={"memory": "2Gi", "cores": "10"}, shareID="x"),
        result(request="b", consumedCapacity={"memory": "3Gi", "cores": "20"}, shareID="y"),
    ))
    assert len(c.devices) == 1
    assert c.devices[0].requests == ("a", "b")
    assert (c.shares[0].memory_units, c.shares[0].cores) == (5, 30)


def test_other_drivers_results_are_not_ours() -> None:
    other = {"request": "x", "driver": "gpu.nvidia.com", "pool": "p", "device": "gpu-7"}
    c = parse(claim(other, result(consumedCapacity={"memory": "1Gi"})))
    assert [d.name for d in c.devices] == ["gpu-0"]


# ---------------------------------------------------------------- refusals


def test_uid_mismatch() -> None:
    e = refused(claim(result(), uid="other-uid"), ClaimReason.UID_MISMATCH)
    assert "other-uid" in str(e) and UID in str(e)


def test_not_allocated() -> None:
    obj = claim(result())
    del obj["status"]
    refused(obj, ClaimReason.NOT_ALLOCATED)
    other = {"request": "x", "driver": "gpu.nvidia.com", "pool": "p", "device": "gpu-0"}
    refused(claim(other), ClaimReason.NOT_ALLOCATED)
    refused(claim(), ClaimReason.NOT_ALLOCATED)


def test_wrong_pool() -> None:
    refused(claim(result(pool="node-b")), ClaimReason.WRONG_POOL)


@pytest.mark.parametrize("device", ["gpu-3", "gpu-01", "npu-0", "gpu--1", "gpu-0 ", "x" * 5000])
def test_unknown_device(device: str) -> None:
    refused(claim(result(device)), ClaimReason.UNKNOWN_DEVICE)


def test_unhealthy_device() -> None:
    e = refused(claim(result("gpu-1")), ClaimReason.DEVICE_UNHEALTHY, inventory(unhealthy=(1,)))
    assert "gpu-1" in str(e)


@pytest.mark.parametrize(
    "consumed",
    [
        {"memory": "1.5Gi"},  # not a whole unit
        {"memory": "1000M"},
        {"memory": "0"},
        {"memory": "17Gi"},  # more than the device
        {"memory": "-1Gi"},
        {"memory": 4294967296},  # quantities are strings
        {"memory": "lots"},
        {"memory": "1e99"},
        {"cores": "101"},
        {"cores": "50.5"},
        {"cores": "500m"},
        {"cores": "-1"},
        {"cores": None},
        {"vram": "1Gi"},  # not a capacity of ours
        "16Gi",
    ],
    ids=repr,
)
def test_malformed_capacities(consumed: Any) -> None:
    with pytest.raises(ClaimError) as info:
        parse(claim(result(consumedCapacity=consumed)))
    assert info.value.reason in (ClaimReason.BAD_CAPACITY.value, ClaimReason.MALFORMED.value)


def test_shares_over_the_device_refused() -> None:
    refused(claim(
        result(request="a", consumedCapacity={"memory": "10Gi", "cores": "10"}),
        result(request="b", consumedCapacity={"memory": "10Gi", "cores": "10"}),
    ), ClaimReason.BAD_CAPACITY)


@pytest.mark.parametrize(
    "obj",
    [None, [], "claim", {"metadata": None}, {"metadata": {"uid": UID}},
     {"metadata": {"uid": UID, "name": "c", "namespace": "ns"}, "status": {"allocation": 3}}],
    ids=repr,
)
def test_malformed_claims(obj: Any) -> None:
    with pytest.raises(ClaimError):
        parse(obj)


def test_too_many_results() -> None:
    refused(claim(*[result() for _ in range(65)]), ClaimReason.MALFORMED)


def test_invalid_uid() -> None:
    refused(claim(result(), uid="../../etc"), ClaimReason.MALFORMED, uid="../../etc")


def test_messages_are_bounded() -> None:
    e = refused(claim(result(consumedCapacity={"memory": "9" * 10_000})),
                ClaimReason.BAD_CAPACITY)
    assert len(str(e)) < 300


# ---------------------------------------------------------------- opaque config


SLICE = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "SliceConfig"}


@pytest.mark.parametrize("mode", [m for m in EnforcementMode if m is not EnforcementMode.AUTO])
def test_slice_config_picks_the_enforcement(mode: EnforcementMode) -> None:
    c = parse(claim(result(), config=[opaque({**SLICE, "enforcement": mode.value})]))
    assert c.enforcement is mode


def test_a_claim_cannot_ask_auto() -> None:
    """``auto`` is a pool's choice of the strongest mode its node has; a claim names the
    mode it wants in force (a tenant's "auto" could land below its class's floor)."""
    with pytest.raises(ClaimError, match="'auto' is not one of") as err:
        parse(claim(result(), config=[opaque({**SLICE, "enforcement": "auto"})]))
    assert err.value.reason == ClaimReason.BAD_CONFIG


def test_every_field_is_optional() -> None:
    assert parse(claim(result(), config=[opaque({})])).enforcement is None
    assert parse(claim(result(), config=[opaque({"enforcement": "mps"})])).enforcement is (
        EnforcementMode.MPS)


def test_the_claims_config_wins_over_the_class() -> None:
    cfg = [opaque({"enforcement": "mps"}, source="FromClass"),
           opaque({"enforcement": "hami-core"})]
    assert parse(claim(result(), config=cfg)).enforcement is EnforcementMode.HAMI_CORE


def test_config_for_other_requests_and_drivers_is_ignored() -> None:
    cfg = [opaque({"enforcement": "mps"}, requests=["other"]),
           opaque({"anything": ["goes"]}, driver="gpu.nvidia.com"),
           {"source": "FromClaim"}]
    assert parse(claim(result(), config=cfg)).enforcement is None
    sub = [opaque({"enforcement": "mps"}, requests=["slice"])]
    assert parse(claim(result(request="slice/big"), config=sub)).enforcement is (
        EnforcementMode.MPS)


@pytest.mark.parametrize(
    ("params", "word"),
    [
        ({**SLICE, "extra": 1}, "unknown fields"),
        ({**SLICE, "kind": "GpuConfig"}, "kind"),
        ({**SLICE, "apiVersion": f"{DRIVER}/v1"}, "apiVersion"),
        ({**SLICE, "apiVersion": "other.com/v1alpha1"}, "apiVersion"),
        ({"enforcement": "strict"}, "enforcement"),
        ({"enforcement": ["mps"]}, "enforcement"),
        ({"enforcement": {"x": 1}}, "enforcement"),
    ],
    ids=repr,
)
def test_bad_slice_config(params: dict[str, Any], word: str) -> None:
    e = refused(claim(result(), config=[opaque(params)]), ClaimReason.BAD_CONFIG)
    assert word in str(e)


def test_slice_config_not_an_object() -> None:
    refused(claim(result(), config=[opaque("enforcement=mps")]), ClaimReason.MALFORMED)


def test_one_enforcement_per_claim() -> None:
    cfg = [opaque({"enforcement": "mps"}, requests=["a"]),
           opaque({"enforcement": "none"}, requests=["b"])]
    obj = claim(result("gpu-0", request="a"), result("gpu-1", request="b"), config=cfg)
    e = refused(obj, ClaimReason.BAD_CONFIG)
    assert "mps" in str(e) and "none" in str(e)


# ---------------------------------------------------------------- CDI spec


def test_claim_cdi_spec() -> None:
    inv = inventory()
    c = parse(claim(result("gpu-0", consumedCapacity={"memory": "2Gi", "cores": "10"}),
                    result("gpu-2", consumedCapacity={"memory": "2Gi", "cores": "10"})))
    response = AllocateSpec(
        envs={"A": "1", "B": "x=y"},
        mounts=(Mount("/c", "/h", read_only=True), Mount("/w", "/hw", read_only=False)),
        devices=(DeviceNode("/dev/null", "/dev/x"),),
        annotations={"ignored": "yes"},
        cdi_devices=("vendor.com/gpu=ignored",),
    )
    spec = claim_cdi_spec(DRIVER, c, {d.uuid: d.device for d in inv.devices}, response)
    assert spec["kind"] == f"{DRIVER}/claim"
    assert spec["cdiVersion"] == "0.5.0"
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-0", f"{UID}-gpu-2"]
    assert spec["devices"][1]["containerEdits"] == {
        "env": [f"{ENV_CDI_DEVICE_PREFIX}2={inv.devices[2].uuid}"]}
    assert spec["containerEdits"] == {
        "env": ["A=1", "B=x=y"],
        "deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/null", "permissions": "rw"}],
        "mounts": [
            {"hostPath": "/h", "containerPath": "/c", "type": "bind", "options": ["rbind", "ro"]},
            {"hostPath": "/hw", "containerPath": "/w", "type": "bind",
             "options": ["rbind", "rw"]},
        ],
    }
    assert claim_cdi_device_id(DRIVER, UID, "gpu-0") == f"{DRIVER}/claim={UID}-gpu-0"
    assert claim_spec_file_name(DRIVER, UID) == f"{DRIVER}-claim_{UID}.json"


# ---------------------------------------------------------------- arbitrary input

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=30,
)
QUANTITY = st.one_of(JSON, st.from_regex(r"-?[0-9]{0,25}(\.[0-9]{0,6})?([eE]-?[0-9]{1,3}|"
                                          r"Ki|Mi|Gi|Ti|m|k|M|G)?", fullmatch=True))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_arbitrary_json_only_raises_claim_error(obj: Any) -> None:
    try:
        parse(obj)
    except ClaimError as e:
        assert len(str(e)) < 400


def _mutations() -> st.SearchStrategy[dict[str, Any]]:
    """A real claim with one part replaced by arbitrary JSON (reaches the deep checks)."""
    base = claim(result(consumedCapacity={"memory": "4Gi", "cores": "30"}),
                 config=[opaque({**SLICE, "enforcement": "mps"})])
    paths = [
        ("status", "allocation", "devices", "results", 0, "consumedCapacity", "memory"),
        ("status", "allocation", "devices", "results", 0, "consumedCapacity", "cores"),
        ("status", "allocation", "devices", "results", 0, "consumedCapacity"),
        ("status", "allocation", "devices", "results", 0, "device"),
        ("status", "allocation", "devices", "results", 0, "request"),
        ("status", "allocation", "devices", "results", 0),
        ("status", "allocation", "devices", "config", 0, "opaque", "parameters"),
        ("status", "allocation", "devices", "config", 0, "opaque", "parameters", "enforcement"),
        ("status", "allocation", "devices", "config", 0, "requests"),
        ("status", "allocation", "devices", "config"),
        ("status", "allocation", "devices"),
        ("metadata", "uid"),
    ]

    def put(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
        doc = copy.deepcopy(base)
        node: Any = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return doc

    return st.builds(put, st.sampled_from(paths), QUANTITY)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutations())
def test_mutated_claims_only_raise_claim_error(obj: dict[str, Any]) -> None:
    try:
        c = parse(obj)
    except ClaimError as e:
        assert len(str(e)) < 400
        return
    for s in c.shares:  # whatever is accepted is within the device
        assert 1 <= s.memory_units <= 16 and 0 <= s.cores <= 100


@settings(max_examples=200, deadline=None)
@given(
    held=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 16), st.integers(0, 100)),
                  max_size=6),
    new=st.tuples(st.integers(0, 2), st.integers(0, 16), st.integers(0, 100), st.booleans()),
)
def test_over_capacity_accepts_exactly_what_fits(
    held: list[tuple[int, int, int]], new: tuple[int, int, int, bool]
) -> None:
    """over_capacity (the prepare-time guard): a share is refused exactly when, with the
    shares held on its device, memory or cores would exceed the device, or a whole-device
    share would meet another share."""
    inv = Inventory.from_devices(
        [Device(uuid=f"GPU-{i}", index=i, minor=i, memory_mib=16 * 1024, model="T4")
         for i in range(3)], 1024,
    )
    shares = [DeviceShare(f"GPU-{d}", m, c) for d, m, c in held]
    d, m, c, whole = new
    share = DeviceShare(f"GPU-{d}", m, c, whole)
    mine = [h for h in shares if h.device == share.device]
    fits = (
        m + sum(h.memory_units for h in mine) <= 16
        and c + sum(h.cores for h in mine) <= 100
        and not (whole and mine)
    )
    assert (over_capacity(shares, [share], inv) is None) == fits
