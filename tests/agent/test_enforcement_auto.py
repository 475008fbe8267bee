"""``enforcement: auto``: each node takes the strongest mode it can enforce. L1: the
choice among the modes the pool can use (agent/enforcement.py ``resolve_auto``), never
lowered while the agent lives. L2 (real gRPC, kubelet stub): an auto pool on a node with
HAMi-core installed hands out HAMi-core slices and says what it found; when an MPS
control daemon starts answering, new slices get MPS; when the daemon goes, the node
holds its devices back instead of falling back to HAMi-core, and takes slices again once
it answers."""

from __future__ import annotations

import json
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_share.agent import enforcement
from gpu_share.agent.enforcement import EnforcementStatus, auto_candidates, resolve_auto
from gpu_share.cli.plugin_main import PrometheusAgentMetrics
from gpu_share.config.model import AgentConfig, DeviceListStrategy, EnforcementMode, RuntimeConfig
from gpu_share.observability.metrics import Metrics
from gpu_share.sharing.annotations import enforcement_key
from testkit.harness.wait import until
from tests.agent.served_agent import MEM, Rig, hami_core_install, pod_view, rig_with

AUTO = EnforcementMode.AUTO
NONE, HAMI, MPS = EnforcementMode.NONE, EnforcementMode.HAMI_CORE, EnforcementMode.MPS
NML = EnforcementMode.NVIDIA_MEMORY_LIMITS


def _runtime(d: Path, strategy: str = "envvar") -> RuntimeConfig:
    os.makedirs(d / "cache", exist_ok=True)
    os.makedirs(d / "mps", exist_ok=True)
    return RuntimeConfig.model_validate({
        "enforcement": "auto", "deviceListStrategy": [strategy],
        "hamiCore": hami_core_install(d), "mps": {"pipeDir": str(d / "mps")},
        "nvidiaMemoryLimits": {"hookPath": str(d / "no-hook")},
    })


def _mps_daemon(runtime: RuntimeConfig) -> socket.socket:
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(os.path.join(runtime.mps.pipe_dir, "control"))
    srv.listen(8)
    return srv


def _stop(srv: socket.socket) -> None:
    path = srv.getsockname()
    srv.close()
    os.unlink(path)


def test_driver_limits_are_a_candidate_only_where_their_hook_can_reach_the_container(
) -> None:
    envvar = RuntimeConfig(enforcement=AUTO)
    cdi = RuntimeConfig(enforcement=AUTO, device_list_strategy=[DeviceListStrategy.CDI_CRI])
    assert auto_candidates(envvar, dra=False) == (MPS, HAMI, NONE)
    assert auto_candidates(envvar, dra=True) == (NML, MPS, HAMI, NONE)
    assert auto_candidates(cdi, dra=False) == (NML, MPS, HAMI, NONE)


def test_an_auto_pool_takes_the_strongest_mode_the_node_has(tmp_path: Path) -> None:
    rt = _runtime(tmp_path, "cdi-cri")
    cands = auto_candidates(rt, dra=False)
    st = resolve_auto(rt, cands, None)
    assert (st.mode, st.ready, st.configured) == (HAMI, True, AUTO)
    found = dict(st.found)
    assert found[HAMI] == () and "not running" in found[MPS][0]
    assert "no-hook is missing" in found[NML][0]
    doc = st.as_doc()
    assert doc["mode"] == "hami-core" and doc["configured"] == "auto"
    assert set(doc["found"]) == {"nvidia-memory-limits", "mps", "hami-core"}  # type: ignore[arg-type]
    srv = _mps_daemon(rt)
    try:
        assert resolve_auto(rt, cands, st).mode is MPS  # raised while running
    finally:
        _stop(srv)


def test_a_node_with_nothing_enforces_none_and_raises_it_when_it_can(tmp_path: Path) -> None:
    rt = _runtime(tmp_path)
    os.unlink(rt.hami_core.library_path)
    st = resolve_auto(rt, auto_candidates(rt, dra=False), None)
    assert (st.mode, st.ready) == (NONE, True)
    assert "missing" in dict(st.found)[HAMI][0]
    srv = _mps_daemon(rt)
    try:
        assert resolve_auto(rt, auto_candidates(rt, dra=False), st).mode is MPS
    finally:
        _stop(srv)


def test_the_mode_in_force_is_never_lowered_while_the_agent_lives(tmp_path: Path) -> None:
    rt = _runtime(tmp_path)
    cands = auto_candidates(rt, dra=False)
    srv = _mps_daemon(rt)
    st = resolve_auto(rt, cands, None)
    assert (st.mode, st.ready) == (MPS, True)
    _stop(srv)
    gone = resolve_auto(rt, cands, st)  # HAMi-core is ready, but weaker: held back
    assert (gone.mode, gone.ready) == (MPS, False)
    assert "not running" in gone.problems[0]
    assert "'auto' in force as 'mps' unavailable" in gone.describe()
    srv = _mps_daemon(rt)
    try:
        assert resolve_auto(rt, cands, gone) == EnforcementStatus(
            MPS, (), AUTO, ((MPS, ()), (HAMI, ())))
    finally:
        _stop(srv)


def test_an_explicit_mode_is_checked_as_before(tmp_path: Path) -> None:
    rt = _runtime(tmp_path).model_copy(update={"enforcement": HAMI})
    st = enforcement.check(rt)
    assert st.ready and st.as_doc() == {"mode": "hami-core", "ready": True, "problems": []}


def test_a_claim_or_class_cannot_name_auto_and_an_agent_config_can() -> None:
    cfg = AgentConfig.model_validate({"version": "v1", "runtime": {"enforcement": "auto"}})
    assert cfg.runtime.enforcement is AUTO  # no CDI strategy needed: NML is left out


# ---------------------------------------------------------------- L2: the whole agent


@pytest.fixture
def auto_rig() -> Iterator[Rig]:
    def runtime(d: Path) -> dict[str, object]:
        os.makedirs(d / "mps", exist_ok=True)
        return {"enforcement": "auto", "hamiCore": hami_core_install(d),
                "mps": {"pipeDir": str(d / "mps")}}

    with rig_with({"runtime": runtime}) as r:
        yield r


def _status(rig: Rig) -> dict[str, object]:
    text = rig.publisher.node.get(enforcement_key("vendor.com"))
    return json.loads(text) if text else {}


def _healthy(rig: Rig) -> int:
    return sum(1 for d in rig.clients[MEM].latest or [] if d.healthy)


def _env(envs: dict[str, dict[str, list[tuple[str, str]]]]) -> dict[str, str]:
    return dict(envs["main"][MEM])


def test_an_auto_pool_hands_out_the_strongest_mode_and_never_falls_back(auto_rig: Rig) -> None:
    rig = auto_rig
    label = enforcement_key("vendor.com")
    until(lambda: _status(rig).get("mode") == "hami-core", what="hami-core in force")
    doc = _status(rig)
    assert doc["configured"] == "auto" and doc["ready"] is True
    assert "not running" in doc["found"]["mps"][0]  # type: ignore[index]
    assert rig.publisher.labels[label] == "hami-core"
    first = _env(rig.admit(pod_view("first", ("main", 4, 0)), random.Random(1)))
    assert first["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in first

    total = _healthy(rig)
    srv = _mps_daemon(rig.cfg.runtime)  # the node's MPS daemon comes up
    until(lambda: _status(rig).get("mode") == "mps", what="mps taken")
    until(lambda: rig.publisher.labels.get(label) == "mps", what="the label says mps")
    assert any(r == "EnforcementReady" and "'auto' in force as 'mps'" in m
               for _, r, m in rig.publisher.events)
    second = _env(rig.admit(pod_view("second", ("main", 2, 0)), random.Random(2)))
    assert second["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in second

    _stop(srv)  # the daemon goes: hold back, do not hand out HAMi-core slices instead
    until(lambda: _healthy(rig) == 0, what="every device held back")
    until(lambda: _status(rig).get("ready") is False, what="the annotation says so")
    assert _status(rig)["mode"] == "mps"
    until(lambda: rig.publisher.labels.get(label, "x") is None, what="the label removed")
    assert any(r == "EnforcementUnavailable" for _, r, _m in rig.publisher.events)
    assert rig.agent is not None and rig.agent.engine is not None
    assert rig.agent.engine.ledger.pod_entries(("default", "first")) != []  # running stay

    srv = _mps_daemon(rig.cfg.runtime)
    try:
        until(lambda: _healthy(rig) == total, what="devices offered again")
        third = _env(rig.admit(pod_view("third", ("main", 1, 0)), random.Random(3)))
        assert third["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"
    finally:
        _stop(srv)


def test_the_ready_metric_has_one_series_the_mode_in_force() -> None:
    """A series left behind at 0 for the mode an auto pool moved up from would fire the
    EnforcementUnavailable alert on a node that enforces."""
    metrics = Metrics()
    am = PrometheusAgentMetrics(metrics)
    am.enforcement("hami-core", True)
    am.enforcement("mps", True)
    am.enforcement("mps", False)
    text = metrics.render().decode()
    assert 'gpu_share_enforcement_ready{mode="mps"} 0' in text
    assert 'mode="hami-core"' not in text
