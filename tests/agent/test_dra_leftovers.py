"""What a DRA pool leaves on the host, read and cleaned from device-plugin mode
(agent/dra/leftovers.py): a claim no pod can use loses its CDI spec, cache dir and
checkpoint entry; one that may be in use keeps them and holds its devices back; nothing
is deleted on a guess. The process wiring (held before any device is advertised) is
``test_a_leftover_claim_holds_its_devices_before_the_first_list``; the real API server,
tests/kube/test_l3_dra_leftovers.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpu_share.agent.dra.checkpoint import Checkpoint, PreparedClaim
from gpu_share.agent.dra.leftovers import DraLeftovers, released
from gpu_share.agent.dra.ports import CHECKPOINT_FILE, PreparedDevice
from gpu_share.config.model import AgentConfig
from gpu_share.errors import KubeAccessError
from gpu_share.kube.resourceclaims import ClaimNotFoundError
from gpu_share.sharing.model import DeviceShare
from testkit.harness.wait import poll
from testkit.kubelet_stub import FakePodResources, KubeletStub
from tests.agent.served_agent import kill_if_running, spawn_agent
from tests.dra.conftest import Kubelet as DraKubelet

DRIVER = "gpu-share.vendor.com"
UID_A = "0a000000-0000-4000-8000-00000000000a"
UID_B = "0b000000-0000-4000-8000-00000000000b"


class Claims:
    """ResourceClaims by (namespace, name): a dict, ClaimNotFoundError or KubeAccessError."""

    def __init__(self, objs: Mapping[tuple[str, str], Any]) -> None:
        self.objs = dict(objs)

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        got = self.objs.get((namespace, name))
        if got is None:
            raise ClaimNotFoundError(f"{namespace}/{name}: not found")
        if isinstance(got, Exception):
            raise got
        return dict(got)


def allocated(uid: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": []}}}}


def prepared(name: str, uid: str, device: str | None, host_dir: str = "") -> PreparedClaim:
    shares = (DeviceShare(device, 4, 30),) if device else ()
    return PreparedClaim(
        namespace="ns", name=name,
        devices=(PreparedDevice(("slice",), "node-a", "gpu-0", (f"{DRIVER}/claim={uid}-gpu-0",)),),
        spec={"cdiVersion": "0.6.0", "kind": f"{DRIVER}/claim", "devices": []},
        host_dir=host_dir, shares=shares,
    )


class Host:
    """A node's dirs as DRA mode left them, and the leftovers reader over them."""

    def __init__(self, tmp: Path, claims: Mapping[str, PreparedClaim]) -> None:
        self.cfg = AgentConfig.model_validate({
            "nodeName": "node-a", "backend": "dummy",
            "runtime": {"hamiCore": {"cacheDir": str(tmp / "vgpu")}},
            "dra": {"pluginDir": str(tmp / "plugin"), "cdiDir": str(tmp / "cdi")},
        })
        self.checkpoint = tmp / "plugin" / CHECKPOINT_FILE
        (tmp / "plugin").mkdir()
        (tmp / "cdi").mkdir()
        Checkpoint(self.checkpoint, DRIVER, lambda: 0.0).write(claims)
        self.specs, self.dirs = {}, {}
        for uid, c in claims.items():
            self.specs[uid] = tmp / "cdi" / f"{DRIVER}-claim_{uid}.json"
            self.specs[uid].write_text(json.dumps(c.spec))
            if c.host_dir:
                self.dirs[uid] = tmp / "vgpu" / c.host_dir
                self.dirs[uid].mkdir(parents=True)
                (self.dirs[uid] / "gpu-share.cache").write_bytes(b"\0" * 64)
        self.holds: list[frozenset[str]] = []
        self.events: list[tuple[str, str]] = []
        self.left = DraLeftovers(self.cfg, hold=self._hold, devices=lambda: ["dev-0", "dev-1"],
                                 event=lambda r, m: self.events.append((r, m)))

    def _hold(self, devices: Collection[str]) -> None:
        self.holds.append(frozenset(devices))

    def checkpoint_uids(self) -> set[str]:
        if not self.checkpoint.exists():
            return set()
        return set(json.loads(self.checkpoint.read_text())["claims"])


@pytest.mark.parametrize(
    ("answer", "gone"),
    [
        (None, True),  # not found
        (allocated(UID_B), True),  # a new claim under the name
        ({"metadata": {"uid": UID_A}, "status": {}}, True),  # deallocated
        ({"metadata": {"uid": UID_A}}, True),
        (allocated(UID_A), False),
        (KubeAccessError("unreachable"), False),  # cannot know: kept
    ],
)
def test_a_claim_is_released_only_when_no_pod_can_use_it(answer: Any, gone: bool) -> None:
    objs = {} if answer is None else {("ns", "a"): answer}
    assert released(UID_A, prepared("a", UID_A, "dev-0"), Claims(objs)) is gone


def test_without_an_api_server_every_claim_is_kept() -> None:
    assert released(UID_A, prepared("a", UID_A, "dev-0"), None) is False


def test_devices_are_held_at_load_and_given_back_as_claims_end(tmp_path: Path) -> None:
    host = Host(tmp_path, {UID_A: prepared("a", UID_A, "dev-0", f"claim_{UID_A}"),
                           UID_B: prepared("b", UID_B, "dev-1", f"claim_{UID_B}")})
    assert host.left.load()
    # Before any API read: both claims' devices held, nothing removed.
    assert host.holds == [frozenset({"dev-0", "dev-1"})]
    assert host.events and host.events[0][0] == "DraClaimsHeld"
    assert "ns/a" in host.events[0][1] and "dev-0, dev-1" in host.events[0][1]

    claims = Claims({("ns", "a"): allocated(UID_A), ("ns", "b"): allocated(UID_B)})
    assert host.left.step(None) is False  # no API server: kept
    assert host.left.step(claims) is False
    assert all(p.exists() for p in [*host.specs.values(), *host.dirs.values()])
    assert host.checkpoint_uids() == {UID_A, UID_B}
    assert len(host.events) == 1  # said once while the held set stays the same

    del claims.objs[("ns", "b")]  # b's pod and claim are gone
    assert host.left.step(claims) is False
    assert not host.specs[UID_B].exists() and not host.dirs[UID_B].exists()
    assert host.specs[UID_A].exists() and host.dirs[UID_A].exists()
    assert host.checkpoint_uids() == {UID_A}
    assert host.holds[-1] == frozenset({"dev-0"})
    assert host.left.pending == 1

    claims.objs[("ns", "a")] = {"metadata": {"uid": UID_A}, "status": {}}  # deallocated
    assert host.left.step(claims) is True
    assert not host.specs[UID_A].exists() and not host.dirs[UID_A].exists()
    assert not host.checkpoint.exists()
    assert host.holds[-1] == frozenset()
    assert not [p for p in (tmp_path / "vgpu").iterdir()]  # trash swept too


def test_a_claim_without_recorded_shares_holds_every_device(tmp_path: Path) -> None:
    host = Host(tmp_path, {UID_A: prepared("a", UID_A, None)})
    assert host.left.load()
    assert host.holds == [frozenset({"dev-0", "dev-1"})]


def test_no_checkpoint_or_an_empty_one_holds_nothing(tmp_path: Path) -> None:
    host = Host(tmp_path, {})
    assert host.left.load() is False
    assert not host.checkpoint.exists() and host.holds == []


def test_a_corrupt_checkpoint_is_set_aside_and_holds_nothing(tmp_path: Path) -> None:
    host = Host(tmp_path, {UID_A: prepared("a", UID_A, "dev-0")})
    host.checkpoint.write_bytes(b"{not json")
    assert host.left.load() is False
    (aside,) = [p.name for p in (tmp_path / "plugin").iterdir()]
    assert aside.startswith(f"{CHECKPOINT_FILE}.corrupt-") and host.holds == []


def test_a_spec_that_cannot_be_removed_is_retried(tmp_path: Path) -> None:
    host = Host(tmp_path, {UID_A: prepared("a", UID_A, "dev-0")})
    assert host.left.load()
    spec = host.specs[UID_A]
    spec.unlink()
    spec.mkdir()  # unlink() of a dir fails: the claim stays, its device held
    (spec / "x").write_text("")
    assert host.left.step(Claims({})) is False
    assert host.checkpoint_uids() == {UID_A} and host.holds[-1] == frozenset({"dev-0"})
    (spec / "x").unlink()
    spec.rmdir()
    assert host.left.step(Claims({})) is True


def test_a_leftover_claim_holds_its_devices_until_the_kubelet_unprepares_it(
    tmp_path: Path,
) -> None:
    """The agent process in device-plugin mode, no API server (so the claim cannot be
    checked there): the checkpoint a DRA pool left names a claim. Every unit the kubelet
    sees is unhealthy from the first list (old code: healthy, the claim's share
    over-committed), and the agent serves the DRA plugin for it: a new claim is refused,
    the left one is answered from the checkpoint, and once the kubelet unprepares it (its
    pod torn down) the files go, the plugin is gone and the devices are offered again."""
    plugin, reg = tmp_path / "plugin", tmp_path / "reg"
    plugin.mkdir()
    claim = prepared("a", UID_A, None)
    Checkpoint(plugin / CHECKPOINT_FILE, DRIVER, lambda: 0.0).write({UID_A: claim})
    spec = tmp_path / "cdi" / f"{DRIVER}-claim_{UID_A}.json"
    kubelet = KubeletStub(tmp_path / "dp").start()
    pr = FakePodResources(tmp_path / "pr.sock").start()
    proc: subprocess.Popen[str] = spawn_agent(tmp_path, env_extra={
        "GPU_SHARE_DRA__PLUGIN_DIR": str(plugin), "GPU_SHARE_DRA__REGISTRATION_DIR": str(reg),
        "GPU_SHARE_DRA__CDI_DIR": str(tmp_path / "cdi")})
    dra = DraKubelet(reg / f"{DRIVER}-reg.sock")
    try:
        kubelet.wait_for_registrations(2, timeout_s=30)
        client = kubelet.plugin("gpu-share-vcuda-memory.sock").watch()
        first = client.wait_for_list(lambda ds: len(ds) > 0, 15)
        assert not any(d.healthy for d in first), [d.id for d in first if d.healthy]
        assert (plugin / CHECKPOINT_FILE).exists()  # nothing deleted on a guess

        info = dra.register()
        assert info.name == DRIVER
        new = dra.prepare("v1", info.endpoint, [("ns", "new", UID_B)]).claims[UID_B]
        assert "device-plugin mode" in new.error
        old = dra.prepare("v1", info.endpoint, [("ns", "a", UID_A)]).claims[UID_A]
        assert old.error == "" and [d.device_name for d in old.devices] == ["gpu-0"]
        assert spec.exists()  # written again from the checkpoint (/var/run after a reboot)

        got = dra.unprepare("v1", info.endpoint, [("ns", "a", UID_A)]).claims[UID_A]
        assert got.error == ""
        assert not spec.exists() and not (plugin / CHECKPOINT_FILE).exists()
        healthy = client.wait_for_list(lambda ds: len(ds) > 0 and all(d.healthy for d in ds), 15)
        assert healthy
        assert poll(lambda: not (reg / f"{DRIVER}-reg.sock").exists(), 45)
    finally:
        dra.close()
        kill_if_running(proc)
        out = proc.communicate(timeout=10)[0] if proc.stdout else ""
        pr.stop()
        kubelet.stop()
    assert "DRA leftovers: 1 claim(s)" in out, out[-3000:]
