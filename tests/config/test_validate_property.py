"""Property: whatever ``gpu-share config validate`` accepts (with device information), the
agent's loader and size guard accept too; for the dummy backend the verdicts and the
messages are identical."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpu_share.cli import admin, plugin_main
from gpu_share.config.loader import load_config
from gpu_share.devices.base import Device
from gpu_share.devices.factory import start_backend
from gpu_share.errors import ConfigError

# Values for memoryUnitMiB: mostly sane, some of the types the issue named.
units = st.one_of(
    st.sampled_from([1, 2, 16, 64, 256, 1024, 4096, 65536]),
    st.integers(min_value=-2, max_value=1 << 21),
    st.sampled_from([True, False, "4", 4.0, None]),
)
xids = st.lists(st.integers(min_value=0, max_value=200), max_size=6)
labels = st.from_regex(r"[a-z0-9-]{1,70}", fullmatch=True)
domains = st.one_of(
    st.just("vendor.com"),
    st.lists(labels, min_size=1, max_size=6).map(".".join),
)


@st.composite
def configs(draw: st.DrawFn, backend: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {"version": "v1", "backend": backend}
    if draw(st.booleans()):
        cfg["memoryUnitMiB"] = draw(units)
    health: dict[str, Any] = {}
    if draw(st.booleans()):
        health["ignoredXids"] = draw(xids)
    if draw(st.booleans()):
        health["fatalXids"] = draw(xids)
    if health:
        cfg["health"] = health
    if draw(st.booleans()):
        cfg["resources"] = {"domain": draw(domains)}
    if backend == "dummy":
        cfg["dummy"] = {
            "deviceCount": draw(st.integers(min_value=0, max_value=64)),
            "memoryMiB": draw(st.integers(min_value=1, max_value=200_000)),
        }
    return cfg


def run_validate(cfg: dict[str, Any], extra: list[str]) -> tuple[int, Any]:
    with tempfile.TemporaryDirectory(prefix="gs-prop-") as tmp:
        path = str(Path(tmp) / "c.yaml")
        Path(path).write_text(yaml.safe_dump(cfg))
        rc = admin.main(["config", "validate", path, *extra])
        agent = agent_verdict(path, None)
    return rc, agent


def agent_verdict(path: str, devices: list[Device] | None) -> Any:
    try:
        loaded = load_config(["--config", path], {})
        found = start_backend(loaded).devices() if devices is None else devices
        plugin_main._guard_sizes(loaded, found)
    except ConfigError as exc:
        return exc
    return None


@given(cfg=configs("dummy"))
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_dummy_backend_same_verdict_same_message(
    cfg: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    rc, agent = run_validate(cfg, [])
    event(f"validate rc={rc}")
    err = capsys.readouterr().err
    if rc == 0:
        assert agent is None, f"validate accepted what the agent refuses: {agent}"
    else:
        assert rc == 2 and agent is not None, "validate refused what the agent accepts"
        assert err == f"error: {agent.message}\n"


@st.composite
def nvml_nodes(draw: st.DrawFn) -> tuple[int, int, list[Device]]:
    """A node as the NVML backend would report it: real-format uuids, any NUMA layout
    up to 8 nodes or none, any health."""
    count = draw(st.integers(min_value=1, max_value=16))
    memory = draw(st.sampled_from([1024, 2048, 16384, 24576, 40960, 81920, 143771]))
    hexes = draw(st.lists(st.from_regex(r"[0-9a-f]{32}", fullmatch=True),
                          min_size=count, max_size=count, unique=True))
    devices = []
    for i, h in enumerate(hexes):
        uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        numa = draw(st.none() | st.integers(min_value=0, max_value=7))
        devices.append(Device(uuid, i, i, memory, "GPU", numa, healthy=draw(st.booleans())))
    return count, memory, devices


@given(cfg=configs("nvml"), node=nvml_nodes())
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_nvml_description_accepted_means_the_real_node_accepted(
    cfg: dict[str, Any], node: tuple[int, int, list[Device]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    count, memory, devices = node
    with tempfile.TemporaryDirectory(prefix="gs-prop-") as tmp:
        path = str(Path(tmp) / "c.yaml")
        Path(path).write_text(yaml.safe_dump(cfg))
        rc = admin.main(["config", "validate", path, "--devices", str(count),
                         "--device-memory-mib", str(memory)])
        capsys.readouterr()
        agent = agent_verdict(path, devices)
        # Also with every device unhealthy: the verdict must not hinge on health.
        sick = agent_verdict(path, [replace(d, healthy=False) for d in devices])
    event(f"validate rc={rc}")
    assert rc in (0, 2)
    if rc == 0:
        assert agent is None and sick is None, f"validate accepted, the agent refused: {agent}"
