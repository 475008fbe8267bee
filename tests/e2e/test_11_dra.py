"""Story 11: the DRA driver mode on the real kubelet, scheduler and controller-manager.

The local pool is switched (helm upgrade with a pool values file, as in story 10) to
``agentConfig.dra.enabled`` with the cluster's kubelet plugin dirs (its --root-dir is below
the cluster dir). Then, on the DRAConsumableCapacity-gated 1.34 cluster:

11a the node's ResourceSlice says what the contract says (devices, attributes, capacities);
11b a pod with a ``gpu-share-m4-c30`` claim is scheduled with consumedCapacity, prepared
    by the agent (one CDI spec per claim) and sees exactly its slice (env, /dev);
11c an exclusive (cores 100) and a cores-only claim (the whole memory), each alone, then a
    one-device mix created at once (memory-only, both, two containers, an init
    container): one device per container, each told its share, nothing over capacity;
11d shares spread over several devices (a second device once one is full, the mix over
    all 4 devices, and a pod that fits the node's free total but no single device
    staying Pending with FailedScheduling): an expected failure on kube-scheduler v1.34,
    which checks the first device's capacity for every allocation (SCHEDULER_BUG below);
11e the agent pod deleted, then the kubelet restarted: running pods keep running (the
    checkpoint keeps their claims), the slice comes back, new claim pods still prepare;
11f the pool switched back to device-plugin mode while a claim pod runs: the claim's
    device takes no device-plugin slice (the node offers the other devices' units, the
    node's ``DraClaimsHeld`` Event says why), the pod keeps running with its files;
    deleting the pod, the kubelet unprepares its claim through the agent (which keeps the
    DRA plugin registered for that), the files go and the device is offered again;
11g every claim of a deleted pod was unprepared (its CDI spec gone), the slice and the
    DeviceClass are gone, and the node advertises the extended resources again. A
    failure anywhere restores the pool too (module fixture), so stories 1-10 run green
    before or after this one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from gpu_share.devices.dummy import dummy_uuid
from gpu_share.sharing.dra.cdi import claim_spec_file_name
from gpu_share.sharing.dra.claim_translation import (
    REQUEST_NAME,
    ClaimShape,
    TranslationSettings,
    claim_name,
    template_body,
)
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.quantity import MIB, parse_quantity
from testkit.e2e import (
    AGENT_NS,
    CORE,
    DEVICES,
    MEM,
    UNITS_PER_DEVICE,
    Kube,
    container,
    dra_values,
    pod,
)
from testkit.harness import cluster_cmd, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DRIVER = "gpu-share.vendor.com"
UNIT_MIB = 1024  # the chart's default memoryUnitMiB (the local pool does not change it)
SETTLE_S = 400  # pods created at once: until every one runs (see _run_pods)
CDI_DIR = Path("/var/run/cdi")
NODE_PREFIX = "dummy-npu"
SETTINGS = TranslationSettings(ResourceNames(MEM, CORE), UNIT_MIB)


def _say(msg: str) -> None:
    print(f"[story 11] {msg}", flush=True)


# ---------------------------------------------------------------------- the pool


def _plugin_dir(kube: Kube) -> Path:
    return Path(kube.env["KUBELET_ROOT_DIR"]) / "plugins"


def _dra_values(kube: Kube, tmp: Path) -> str:
    """Only the local pool, in DRA mode (``dra_values``), as a values file."""
    return dra_values(kube, tmp / "pool-dra.yaml", DRIVER)


def _wait_rolled(kube: Kube, old_uid: str | None, timeout: float = 180) -> dict[str, Any]:
    """A Ready agent pod other than ``old_uid`` (in DRA mode Ready = registered with
    the kubelet)."""
    return wait_until(
        "a new ready agent pod",
        lambda: p if (p := kube.ready_agent()) and p["metadata"]["uid"] != old_uid else None,
        timeout,
    )


def _slices(kube: Kube) -> list[dict[str, Any]]:
    sel = f"spec.driver={DRIVER},spec.nodeName={kube.node}"
    return list(kube.get("resourceslices", "--field-selector", sel)["items"])


@dataclass
class DraPool:
    kube: Kube
    values: str
    restored: bool = False
    # Claim uids prepared in this module: their CDI specs must be gone at the end.
    claim_uids: set[str] = field(default_factory=set)

    def restore(self, *, serving: bool = True) -> None:
        """The pool's own values again (device-plugin mode); the agent exits cleanly.
        ``serving``: wait for every device to be offered again."""
        if self.restored:
            return
        self.restored = True
        old = self.kube.ready_agent()
        self.kube.install(action="upgrade")
        _wait_rolled(self.kube, old["metadata"]["uid"] if old else None)
        if serving:
            self.kube.wait_agent_serving()


@pytest.fixture(scope="module")
def dra(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraPool]:
    if not kube.installed():
        kube.install()
    kube.wait_agent_serving()
    pool = DraPool(kube, _dra_values(kube, tmp_path_factory.mktemp("dra")))
    old = kube.ready_agent()
    try:
        kube.install("-f", pool.values, action="upgrade")
        agent = _wait_rolled(kube, old["metadata"]["uid"] if old else None)
        _say(f"pool in DRA mode, agent {agent['metadata']['name']}")
        yield pool
    finally:
        pool.restore()


# ---------------------------------------------------------------------- claims and pods


def _template(ns: str, memory: int, cores: int) -> dict[str, Any]:
    """The ResourceClaimTemplate of one shape, as the webhook would write it."""
    return template_body(ClaimShape(memory, cores), ns, SETTINGS)


def _claim_pod(
    name: str,
    ns: str,
    containers: Sequence[tuple[str, ClaimShape]],
    inits: Sequence[tuple[str, ClaimShape]] = (),
) -> dict[str, Any]:
    """A pod whose containers each hold their own claim ``gpu-share-<C>`` from the
    template of their shape; each prints its SEEN line (init containers then exit)."""

    def with_claim(cname: str, *, sleep: bool) -> dict[str, Any]:
        c = container(cname, sleep=sleep)
        c["resources"] = {"claims": [{"name": claim_name(cname)}]}
        return c

    p = pod(
        name,
        ns,
        [with_claim(c, sleep=True) for c, _ in containers],
        [with_claim(c, sleep=False) for c, _ in inits],
    )
    p["spec"]["resourceClaims"] = [
        {"name": claim_name(c), "resourceClaimTemplateName": s.template_name}
        for c, s in [*inits, *containers]
    ]
    return p


def _apply_templates(kube: Kube, ns: str, shapes: Sequence[ClaimShape]) -> None:
    kube.apply([_template(ns, s.memory_units, s.cores) for s in set(shapes)])


@dataclass(frozen=True)
class Alloc:
    """One allocated result of our driver in a claim."""

    claim: str
    uid: str
    pool: str
    device: str  # gpu-<index>
    memory_mib: int
    cores: int


def _allocs(claim: Mapping[str, Any]) -> list[Alloc]:
    results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    out = []
    for r in results:
        if r.get("driver") != DRIVER:
            continue
        consumed = r.get("consumedCapacity") or {}
        mem = parse_quantity(consumed.get("memory", "0")) / MIB
        cores = parse_quantity(consumed.get("cores", "0"))
        assert mem.denominator == 1 and cores.denominator == 1, r
        out.append(
            Alloc(
                claim["metadata"]["name"],
                claim["metadata"]["uid"],
                r["pool"],
                r["device"],
                int(mem),
                int(cores),
            )
        )
    return out


def _pod_claims(kube: Kube, ns: str, name: str) -> dict[str, dict[str, Any]]:
    """pod claim name -> the ResourceClaim generated for it."""
    p = kube.get("pod", name, "-n", ns)
    out = {}
    for st in p.get("status", {}).get("resourceClaimStatuses", []):
        if st.get("resourceClaimName"):
            out[st["name"]] = kube.get("resourceclaim", st["resourceClaimName"], "-n", ns)
    return out


def _run_one_claim(dra: DraPool, ns: str, name: str, shape: ClaimShape) -> Alloc:
    """Pod ``name``, its container holding one claim of ``shape``, Ready: the claim's one
    allocation (its uid recorded: its CDI spec must be gone at the end)."""
    _apply_templates(dra.kube, ns, [shape])
    dra.kube.apply(_claim_pod(name, ns, [("main", shape)]))
    dra.kube.wait_ready(ns)
    (claim,) = _pod_claims(dra.kube, ns, name).values()
    (a,) = _allocs(claim)
    dra.claim_uids.add(a.uid)
    return a


def _node_allocs(kube: Kube) -> list[Alloc]:
    """Every allocated share of our driver on this node, from the claims' status."""
    return [
        a
        for c in kube.get("resourceclaims", "-A")["items"]
        for a in _allocs(c)
        if a.pool == kube.node
    ]


def _over_capacity(allocs: Sequence[Alloc]) -> list[str]:
    mem: dict[str, int] = {}
    cores: dict[str, int] = {}
    for a in allocs:
        mem[a.device] = mem.get(a.device, 0) + a.memory_mib
        cores[a.device] = cores.get(a.device, 0) + a.cores
    device_mib = UNITS_PER_DEVICE * UNIT_MIB
    return [f"{d}: {n} MiB > {device_mib}" for d, n in mem.items() if n > device_mib] + [
        f"{d}: {n} cores > 100" for d, n in cores.items() if n > 100
    ]


def _uuid(kube: Kube, device: str) -> str:
    return dummy_uuid("NPU", kube.node, int(device.removeprefix("gpu-")))


def _check_container(kube: Kube, ns: str, name: str, cname: str, claim: Mapping[str, Any]) -> Alloc:
    """The container's claim is one share of one device, and its SEEN line says exactly
    that share: the device, its memory and (when asked) cores."""
    allocs = _allocs(claim)
    assert len(allocs) == 1, f"{ns}/{name}/{cname}: {allocs}"
    (a,) = allocs
    seen = wait_until(f"the SEEN line of {name}/{cname}", lambda: kube.seen(ns, name, cname), 60)
    want = {
        "visible": _uuid(kube, a.device),
        "ids": _uuid(kube, a.device),
        "mem": str(a.memory_mib),
        "cores": str(a.cores) if a.cores else "",
        "nodes": f"{NODE_PREFIX}{a.device.removeprefix('gpu-')}",  # only its own
    }
    assert seen == want, f"{ns}/{name}/{cname}: saw {seen}, claim {a}"
    return a


def _spec_path(uid: str) -> Path:
    return CDI_DIR / claim_spec_file_name(DRIVER, uid)


def _checkpoint(kube: Kube) -> dict[str, Any]:
    path = _plugin_dir(kube) / DRIVER / "checkpoint.json"
    return dict(json.loads(path.read_text()).get("claims", {})) if path.exists() else {}


def _pending_unschedulable(kube: Kube, ns: str, name: str) -> list[str] | None:
    p = kube.get("pod", name, "-n", ns)
    if p["status"].get("phase") != "Pending" or p["spec"].get("nodeName"):
        raise AssertionError(f"{name} left Pending or was bound: {p['status']}")
    events = [e for e in kube.events(ns, name) if e.startswith("FailedScheduling")]
    return events or None


# ---------------------------------------------------------------------- the stories


def test_story11a_resource_slice_matches_the_contract(dra: DraPool) -> None:
    kube = dra.kube
    (s,) = wait_until("the node's ResourceSlice", lambda: _slices(kube), 60)
    spec = s["spec"]
    assert s["metadata"]["name"].startswith(f"{kube.node}-gpu-share-")
    assert spec["nodeName"] == kube.node and spec["driver"] == DRIVER
    assert spec["pool"]["name"] == kube.node
    assert spec["pool"]["resourceSliceCount"] == 1 and spec["pool"]["generation"] >= 1
    devices = {d["name"]: d for d in spec["devices"]}
    assert sorted(devices) == [f"gpu-{i}" for i in range(DEVICES)], sorted(devices)
    for i in range(DEVICES):
        d = devices[f"gpu-{i}"]
        attrs = d["attributes"]
        assert attrs["uuid"] == {"string": dummy_uuid("NPU", kube.node, i)}
        assert attrs["index"] == {"int": i}
        assert attrs["memoryUnitMiB"] == {"int": UNIT_MIB}
        assert isinstance(attrs["model"]["string"], str)
        assert isinstance(attrs["driverVersion"]["string"], str)
        assert isinstance(attrs["numaNode"]["int"], int)  # the dummy backend knows it
        assert d["allowMultipleAllocations"] is True
        mem, cores = d["capacity"]["memory"], d["capacity"]["cores"]
        full = Fraction(UNITS_PER_DEVICE * UNIT_MIB * MIB)
        unit = Fraction(UNIT_MIB * MIB)
        # The API server rewrites quantities canonically ("16384Mi" -> "16Gi").
        assert parse_quantity(mem["value"]) == full
        assert parse_quantity(mem["requestPolicy"]["default"]) == full
        assert parse_quantity(mem["requestPolicy"]["validRange"]["min"]) == unit
        assert parse_quantity(mem["requestPolicy"]["validRange"]["step"]) == unit
        assert parse_quantity(cores["value"]) == 100
        assert parse_quantity(cores["requestPolicy"]["default"]) == 0
        assert parse_quantity(cores["requestPolicy"]["validRange"]["min"]) == 0
        assert parse_quantity(cores["requestPolicy"]["validRange"]["step"]) == 1
    dc = kube.get("deviceclass", DRIVER)
    assert dc["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]


def test_story11b_one_claim_pod_sees_exactly_its_slice(dra: DraPool, namespace: str) -> None:
    kube = dra.kube
    shape = ClaimShape(4, 30)
    _apply_templates(kube, namespace, [shape])
    rct = kube.get("resourceclaimtemplate", shape.template_name, "-n", namespace)
    assert rct["spec"]["spec"]["devices"]["requests"][0]["name"] == REQUEST_NAME
    kube.apply(_claim_pod("slice", namespace, [("main", shape)]))
    kube.wait_ready(namespace)
    (claim,) = _pod_claims(kube, namespace, "slice").values()
    (a,) = _allocs(claim)
    dra.claim_uids.add(a.uid)
    assert (a.memory_mib, a.cores) == (4 * UNIT_MIB, 30), a
    assert claim["status"]["allocation"]["devices"]["results"][0]["pool"] == kube.node
    index = int(a.device.removeprefix("gpu-"))
    uuid = _uuid(kube, a.device)

    # The claim's CDI device names its device, nothing of the others.
    kube.assert_sees_one_device(namespace, "slice", (index, uuid), 4 * UNIT_MIB, 30)

    # The agent prepared it: the per-claim spec and the checkpoint entry.
    spec = json.loads(_spec_path(a.uid).read_text())
    assert spec["kind"] == f"{DRIVER}/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{a.uid}-{a.device}"]
    assert _spec_path(a.uid).stat().st_mode & 0o777 == 0o644
    assert a.uid in _checkpoint(kube)
    logs = kube.kubectl(
        "-n", AGENT_NS, "logs", "-l", "app.kubernetes.io/component=agent", "--tail=-1"
    ).stdout
    assert f"prepared claim {namespace}/{claim['metadata']['name']} ({a.uid})" in logs


def _check_pods(
    kube: Kube, dra: DraPool, ns: str, pods: Mapping[str, PodShape]
) -> dict[str, list[Alloc]]:
    """Each container of ``pods`` holds one share of one device, sized as its shape asks
    (no memory asked: the device's whole memory), and was told exactly that; returns
    device -> shares."""
    by_device: dict[str, list[Alloc]] = {}
    for name, (cs, ins) in pods.items():
        claims = _pod_claims(kube, ns, name)
        for cname, shape in (*ins, *cs):
            a = _check_container(kube, ns, name, cname, claims[claim_name(cname)])
            dra.claim_uids.add(a.uid)
            by_device.setdefault(a.device, []).append(a)
            want_mib = (
                shape.memory_units * UNIT_MIB
                if shape.memory_units and not shape.exclusive
                else UNITS_PER_DEVICE * UNIT_MIB
            )
            want_cores = 100 if shape.exclusive else shape.cores
            assert (a.memory_mib, a.cores) == (want_mib, want_cores), (name, cname, a)
    # Every container (the two of a pod too, init containers too) has its own claim.
    n = sum(len(cs) + len(ins) for cs, ins in pods.values())
    assert len({a.claim for al in by_device.values() for a in al}) == n, by_device
    assert not (over := _over_capacity(_node_allocs(kube))), over
    _say(
        "placed: "
        + "; ".join(
            f"{d}: {sum(a.memory_mib for a in al)} MiB {sum(a.cores for a in al)} cores"
            f" ({len(al)} claims)"
            for d, al in sorted(by_device.items())
        )
    )
    return by_device


def _run_pods(kube: Kube, ns: str, pods: Mapping[str, PodShape]) -> None:
    shapes = [s for cs, ins in pods.values() for _, s in (*cs, *ins)]
    _apply_templates(kube, ns, shapes)
    kube.apply([_claim_pod(n, ns, cs, ins) for n, (cs, ins) in pods.items()])
    # On a loaded machine the node authorizer can learn of a pod's claim after the
    # kubelet first asks for it; the kubelet then retries with a growing back-off (tens
    # of seconds). The condition is the same (every pod settled, none failed); the bound
    # leaves room for a few such retries.
    settled = kube.wait_pods_settled(ns, SETTLE_S)
    bad = {
        p["metadata"]["name"]: kube.events(ns, p["metadata"]["name"])[-3:]
        for p in settled
        if p["status"]["phase"] != "Running"
    }
    assert not bad, bad
    kube.wait_ready(ns)


def _delete_pods(kube: Kube, ns: str) -> None:
    """Every pod of ``ns`` gone, and their claims (deallocated) with them."""
    kube.kubectl("-n", ns, "delete", "pods", "--all", "--wait=true", timeout=150)
    wait_until(
        f"the claims of {ns} gone",
        lambda: not kube.get("resourceclaims", "-n", ns)["items"],
        90,
    )


def _run_and_check(
    kube: Kube, dra: DraPool, ns: str, pods: Mapping[str, PodShape]
) -> dict[str, list[Alloc]]:
    _run_pods(kube, ns, pods)
    return _check_pods(kube, dra, ns, pods)


PodShape = tuple[list[tuple[str, ClaimShape]], list[tuple[str, ClaimShape]]]
# One device's worth (12 of 16 units, 100 of 100 cores), created at once.
MIX_ONE_DEVICE: dict[str, PodShape] = {
    "mem-only": ([("main", ClaimShape(2, 0))], []),
    "both": ([("main", ClaimShape(3, 30))], []),
    "two": ([("a", ClaimShape(2, 20)), ("b", ClaimShape(2, 20))], []),
    "init": ([("main", ClaimShape(2, 20))], [("setup", ClaimShape(1, 10))]),
}
# 4 devices of 16 units: the exclusive claim takes one, the cores-only one the whole
# memory of another, the rest (18 units, 100 cores) fits the other two in any order.
MIX_ALL_DEVICES: dict[str, PodShape] = {
    "exclusive": ([("main", ClaimShape(0, 100))], []),
    "cores-only": ([("main", ClaimShape(0, 40))], []),
    "mem-only": ([("main", ClaimShape(4, 0))], []),
    "both": ([("main", ClaimShape(4, 30))], []),
    "two": ([("a", ClaimShape(2, 20)), ("b", ClaimShape(2, 20))], []),
    "init": ([("main", ClaimShape(4, 20))], [("setup", ClaimShape(2, 10))]),
}


@pytest.mark.timeout(3 * SETTLE_S + 600)  # three rounds of pods, each may need the bound
def test_story11c_shapes_and_a_one_device_mix_at_once(dra: DraPool, namespace: str) -> None:
    """Exclusive (cores 100) and cores-only (the whole memory) claims, each alone; then a
    mix of memory-only, both, a two-container pod and an init container created at once:
    one device per container, each told its own share, nothing over capacity."""
    kube = dra.kube
    excl = _run_and_check(kube, dra, namespace, {"exclusive": ([("main", ClaimShape(0, 100))], [])})
    (a,) = [a for al in excl.values() for a in al]
    assert (a.memory_mib, a.cores) == (UNITS_PER_DEVICE * UNIT_MIB, 100), a
    _delete_pods(kube, namespace)
    _run_and_check(kube, dra, namespace, {"cores-only": ([("main", ClaimShape(0, 40))], [])})
    _delete_pods(kube, namespace)
    _run_and_check(kube, dra, namespace, MIX_ONE_DEVICE)
    # Each step took over gpu-0 from the last one's claims, which the kubelet unprepares
    # only after the API deleted them: the agent must not refuse the newcomers meanwhile
    # (it did, and the kubelet's retry cost ~40 s per hand-over).
    refused = [
        f"{e.get('reason')}: {e.get('message')}"
        for e in kube.get("events", "-n", namespace)["items"]
        if "NodePrepareResources failed" in str(e.get("message"))
    ]
    assert not refused, refused[:3]


def _placed_or_refused(kube: Kube, ns: str, name: str) -> str | None:
    """The pod's phase when Running, else its last FailedScheduling event (or None)."""
    p = kube.get("pod", name, "-n", ns)
    if p["status"].get("phase") == "Running":
        return "Running"
    events = [e for e in kube.events(ns, name) if e.startswith("FailedScheduling")]
    return events[-1] if events else None


def _server_minor(kube: Kube) -> int:
    doc = json.loads(kube.kubectl("version", "-o", "json").stdout)
    return int(doc["serverVersion"]["minor"].rstrip("+"))


# kube-scheduler v1.34 checks the remaining consumable capacity of the slice's device at
# index r.deviceIndex (the request's device counter, 0 for count 1) instead of the device
# it is allocating (allocateDevice in
# k8s.io/dynamic-resource-allocation/structured/internal/experimental, v0.34.4): once
# gpu-0 cannot take a share, no share is placed on any device of the slice.
SCHEDULER_BUG = (
    "kube-scheduler v1.34 with DRAConsumableCapacity checks the capacity of the slice's "
    "first device for every allocation (kubernetes/kubernetes#133705, fixed by #133706, "
    "not in v1.34.4): a share cannot go to a second device"
)


def test_story11d_shares_across_devices_and_no_single_device_fit_pending(
    dra: DraPool, namespace: str
) -> None:
    """A full device, then a share that must go to another device; the mix spread over
    all 4 devices at once; then 4 pods of 10 units (one per device) and an 8-unit pod:
    24 units are free on the node but at most 6 on any device, so it stays Pending
    (FailedScheduling), it is not bound and refused at admission."""
    kube = dra.kube
    full, four = ClaimShape(UNITS_PER_DEVICE, 0), ClaimShape(4, 0)
    _apply_templates(kube, namespace, [full, four])
    kube.apply(_claim_pod("full", namespace, [("main", full)]))
    kube.wait_ready(namespace)
    kube.apply(_claim_pod("next", namespace, [("main", four)]))
    outcome = wait_until(
        "the 4-unit pod placed or refused",
        lambda: _placed_or_refused(kube, namespace, "next"),
        90,
        interval=2,
    )
    if outcome != "Running" and _server_minor(kube) == 34:
        _say(f"second device refused: {outcome}")
        pytest.xfail(f"{SCHEDULER_BUG}; the pod got: {outcome[:160]}")
    assert outcome == "Running", outcome
    _check_pods(
        kube, dra, namespace, {n: ([("main", s)], []) for n, s in [("full", full), ("next", four)]}
    )
    _delete_pods(kube, namespace)

    by_device = _run_and_check(kube, dra, namespace, MIX_ALL_DEVICES)
    (excl,) = [a for al in by_device.values() for a in al if a.cores == 100]
    assert [a.claim for a in by_device[excl.device]] == [excl.claim], by_device
    _delete_pods(kube, namespace)

    ten, eight = ClaimShape(10, 0), ClaimShape(8, 0)
    tens = {f"ten-{i}": ([("main", ten)], []) for i in range(DEVICES)}
    assert len(_run_and_check(kube, dra, namespace, tens)) == DEVICES
    _apply_templates(kube, namespace, [eight])
    kube.apply(_claim_pod("eight", namespace, [("main", eight)]))
    events = wait_until(
        "FailedScheduling of the 8-unit pod",
        lambda: _pending_unschedulable(kube, namespace, "eight"),
        90,
        interval=2,
    )
    _say(f"8-unit pod: {events[-1][:200]}")
    time.sleep(5)  # and it stays so (not bound and failed at admission)
    assert _pending_unschedulable(kube, namespace, "eight")
    assert not (over := _over_capacity(_node_allocs(kube))), over


def _running(kube: Kube, ns: str) -> dict[str, tuple[str, int, str]]:
    """pod -> (uid, restart count, phase)."""
    return {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", [])),
            p["status"].get("phase", ""),
        )
        for p in kube.pods(ns)
    }


def test_story11e_agent_and_kubelet_restarts_keep_prepared_claims(
    dra: DraPool, namespace: str
) -> None:
    kube = dra.kube
    shapes = {"a": ClaimShape(4, 30), "b": ClaimShape(2, 0), "c": ClaimShape(3, 10)}
    _apply_templates(kube, namespace, list(shapes.values()))
    kube.apply([_claim_pod(f"before-{n}", namespace, [("main", shapes[n])]) for n in "ab"])
    kube.wait_ready(namespace)
    seen = {}
    for n in "ab":
        (claim,) = _pod_claims(kube, namespace, f"before-{n}").values()
        a = _check_container(kube, namespace, f"before-{n}", "main", claim)
        dra.claim_uids.add(a.uid)
        seen[f"before-{n}"] = a
    before = _running(kube, namespace)
    assert all(v[1:] == (0, "Running") for v in before.values()), before

    def still(step: str) -> None:
        now = _running(kube, namespace)
        for name, v in before.items():
            assert now[name] == v, f"after {step}: {name} {now[name]} (was {v})"
        assert set(_checkpoint(kube)) >= {a.uid for a in seen.values()}, step
        for a in seen.values():
            assert _spec_path(a.uid).exists(), f"after {step}: spec of {a.claim} gone"

    def new_pod(name: str, shape: ClaimShape) -> None:
        kube.apply(_claim_pod(name, namespace, [("main", shape)]))
        kube.kubectl(
            "-n",
            namespace,
            "wait",
            "--for=condition=Ready",
            f"pod/{name}",
            "--timeout=120s",
            timeout=150,
        )
        (claim,) = _pod_claims(kube, namespace, name).values()
        a = _check_container(kube, namespace, name, "main", claim)
        dra.claim_uids.add(a.uid)
        before.update({name: _running(kube, namespace)[name]})
        seen[name] = a

    # The agent pod deleted: the DaemonSet starts a new one, which serves the claims
    # of the running pods from its checkpoint.
    old = kube.ready_agent()
    assert old is not None
    kube.kubectl("-n", AGENT_NS, "delete", "pod", old["metadata"]["name"], "--wait=true")
    _wait_rolled(kube, old["metadata"]["uid"])
    wait_until("the slice after the agent restart", lambda: _slices(kube), 60)
    still("agent restart")
    new_pod("after-agent", shapes["c"])
    assert not (over := _over_capacity(_node_allocs(kube))), over

    # The kubelet restarted: it wipes the node's slices at start and registers the
    # driver again; the agent publishes its slice again.
    cluster_cmd("restart-kubelet", timeout=240)
    wait_until("a ready agent pod after the kubelet restart", kube.ready_agent, 120)
    wait_until("the slice after the kubelet restart", lambda: _slices(kube), 90)
    # The kubelet's start-up wipe may land after the first republish: it must stay.
    time.sleep(10)
    wait_until("the slice 10 s later", lambda: _slices(kube), 60)
    still("kubelet restart")
    new_pod("after-kubelet", shapes["b"])
    still("a new pod after the kubelet restart")
    assert not (over := _over_capacity(_node_allocs(kube))), over


def _specs_left(uids: set[str]) -> list[str]:
    return sorted(u for u in uids if _spec_path(u).exists())


def test_story11f_switched_back_with_a_claim_pod_running(
    dra: DraPool, kube: Kube, namespace: str
) -> None:
    """Runs after the other stories' namespaces are gone: each of their claims was
    unprepared while the driver still ran. Then a claim pod starts, and the pool goes
    back to device-plugin mode under it."""
    assert dra.claim_uids, "no claim was prepared by the stories before"
    before = set(dra.claim_uids)
    wait_until("the deleted pods' claims unprepared", lambda: not _specs_left(before), 120,
               interval=2, fail=False)
    assert not (left := _specs_left(before)), f"CDI specs of {len(left)} claims left: {left}"
    assert not set(_checkpoint(kube)) & before, _checkpoint(kube)

    a = _run_one_claim(dra, namespace, "holder", ClaimShape(4, 30))
    dra.restore(serving=False)

    held = {MEM: (DEVICES - 1) * UNITS_PER_DEVICE, CORE: (DEVICES - 1) * 100}
    wait_until(f"the claim's device held back: allocatable {held}",
               lambda: kube.node_resources()["allocatable"] == held, 120)
    assert kube.get("pod", "holder", "-n", namespace)["status"]["phase"] == "Running"
    assert _spec_path(a.uid).exists() and a.uid in _checkpoint(kube)
    events = kube.events("default", kube.node)
    assert any(e.startswith("DraClaimsHeld:") and _uuid(kube, a.device) in e for e in events), (
        events)
    _say(f"switched back with {a.claim} on {a.device}: held; events {events[-1:]}")

    kube.kubectl("-n", namespace, "delete", "pod", "holder", "--wait=true", "--timeout=120s")
    kube.wait_agent_serving(120)  # every device offered again
    wait_until("the claim's files gone",
               lambda: not _spec_path(a.uid).exists() and a.uid not in _checkpoint(kube), 60)
    _say("the pod deleted: its claim unprepared by the agent, every device offered again")


def test_story11g_back_to_device_plugin_mode_nothing_left(dra: DraPool, kube: Kube) -> None:
    """After 11f (or alone): every claim prepared here was unprepared; the pool is in
    device-plugin mode with nothing of DRA left."""
    assert dra.claim_uids, "no claim was prepared by the stories before"
    wait_until("the deleted pods' claims unprepared", lambda: not _specs_left(dra.claim_uids),
               120, interval=2, fail=False)
    assert not (left := _specs_left(dra.claim_uids)), f"CDI specs of {len(left)} claims left"
    assert not set(_checkpoint(kube)) & dra.claim_uids, _checkpoint(kube)
    dra.restore()
    wait_until("the node's ResourceSlice removed", lambda: not _slices(kube), 60)
    assert kube.kubectl("get", "deviceclass", DRIVER, check=False).returncode != 0
    assert not list(CDI_DIR.glob(f"{DRIVER}-claim_*"))
    res = kube.node_resources()["allocatable"]
    assert res == {MEM: DEVICES * UNITS_PER_DEVICE, CORE: DEVICES * 100}, res
