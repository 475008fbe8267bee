from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_share.config.model import AgentConfig, BackendKind, DummyConfig
from gpu_share.devices.base import DeviceBackend
from gpu_share.devices.dummy import DummyBackend, dummy_uuid, read_faults, write_faults
from gpu_share.devices.factory import create_backend, start_backend


def make(tmp_path: Path, node: str = "node-a", **kwargs: object) -> DummyBackend:
    cfg = DummyConfig(fault_file=str(tmp_path / "faults.json"), **kwargs)  # type: ignore[arg-type]
    backend = DummyBackend(cfg, node_name=node, check_interval_s=0.01)
    backend.start()
    return backend


def unhealthy(backend: DummyBackend) -> list[int]:
    return [d.index for d in backend.devices() if not d.healthy]


def test_devices_from_config(tmp_path: Path) -> None:
    backend = make(
        tmp_path,
        device_count=4,
        memory_mib=8192,
        model="Acme NPU",
        numa_nodes=2,
        host_device_path="/dev/zero",
    )
    devs = backend.devices()
    assert [d.index for d in devs] == [0, 1, 2, 3]
    assert [d.minor for d in devs] == [0, 1, 2, 3]
    assert {d.memory_mib for d in devs} == {8192}
    assert {d.model for d in devs} == {"Acme NPU"}
    assert [d.numa_node for d in devs] == [0, 0, 1, 1]
    assert devs[2].nodes[0].host_path == "/dev/zero"
    assert devs[2].nodes[0].container_path == "/dev/dummy-npu2"
    assert all(d.healthy for d in devs)
    assert isinstance(backend, DeviceBackend)


def test_naming(tmp_path: Path) -> None:
    naming = make(tmp_path).naming()
    assert naming.visible_devices_env == "DUMMY_VISIBLE_DEVICES"
    assert [(n.host_path, n.container_path) for n in naming.shared_nodes] == [
        ("/dev/null", "/dev/dummy-npuctl")
    ]
    assert naming.volume_mount_root == "/var/run/dummy-npu-devices"


def test_uuids_stable_across_restarts_and_distinct_across_nodes(tmp_path: Path) -> None:
    first = [d.uuid for d in make(tmp_path, "node-a").devices()]
    again = [d.uuid for d in make(tmp_path, "node-a").devices()]
    other = [d.uuid for d in make(tmp_path, "node-b").devices()]
    assert first == again
    assert not set(first) & set(other)
    assert len(set(first)) == len(first)


@given(st.sampled_from(["NPU", "Fake9"]), st.text(max_size=30), st.integers(0, 63))
def test_uuid_format(prefix: str, node: str, index: int) -> None:
    uuid = dummy_uuid(prefix, node, index)
    assert "::" not in uuid
    head, *groups = uuid.split("-")
    assert head == prefix
    assert [len(g) for g in groups] == [8, 4, 4, 4, 12]
    assert all(c in "0123456789abcdef" for g in groups for c in g)


def test_fault_file_by_uuid_and_index_then_recovery(tmp_path: Path) -> None:
    backend = make(tmp_path)
    uuids = [d.uuid for d in backend.devices()]
    fault_file = str(tmp_path / "faults.json")

    write_faults(fault_file, [uuids[1], 3])
    events = backend.poll_health(1.0)
    assert [(e.uuid, e.healthy, e.reason) for e in events] == [
        (uuids[1], False, "fault-file"),
        (uuids[3], False, "fault-file"),
    ]
    assert unhealthy(backend) == [1, 3]

    write_faults(fault_file, ["3"])
    events = backend.poll_health(1.0)
    assert [(e.uuid, e.healthy) for e in events] == [(uuids[1], True)]
    assert unhealthy(backend) == [3]

    (tmp_path / "faults.json").unlink()  # missing file: all healthy
    assert [(e.uuid, e.healthy) for e in backend.poll_health(1.0)] == [(uuids[3], True)]
    assert unhealthy(backend) == []


def test_no_change_means_no_events(tmp_path: Path) -> None:
    backend = make(tmp_path)
    write_faults(str(tmp_path / "faults.json"), [0])
    assert len(backend.poll_health(1.0)) == 1
    assert backend.poll_health(0.03) == []
    write_faults(str(tmp_path / "faults.json"), [0])  # rewritten, same content
    assert backend.poll_health(0.03) == []


def test_faults_present_at_start_are_the_baseline(tmp_path: Path) -> None:
    write_faults(str(tmp_path / "faults.json"), [2])
    backend = make(tmp_path)
    assert unhealthy(backend) == [2]
    assert backend.poll_health(0) == []


@pytest.mark.parametrize(
    "content", ["{not json", '{"unhealthy": "0"}', '["0"]', '{"unhealthy": [1.5]}']
)
def test_malformed_file_keeps_last_state(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = make(tmp_path)
    write_faults(str(tmp_path / "faults.json"), [1])
    backend.poll_health(1.0)
    (tmp_path / "faults.json").write_text(content)
    assert backend.poll_health(0.02) == []
    assert unhealthy(backend) == [1]
    assert backend.fault_file_error is not None
    assert "malformed" in caplog.text
    write_faults(str(tmp_path / "faults.json"), [])
    assert [e.healthy for e in backend.poll_health(1.0)] == [True]
    assert backend.fault_file_error is None


def test_unknown_entries_are_ignored(tmp_path: Path) -> None:
    backend = make(tmp_path, device_count=2)
    write_faults(str(tmp_path / "faults.json"), ["NPU-nope", 7, 1])
    assert [e.healthy for e in backend.poll_health(1.0)] == [False]
    assert unhealthy(backend) == [1]


def test_write_and_read_faults_roundtrip(tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "faults.json")
    assert read_faults(path) == []
    write_faults(path, ["NPU-x", 2])
    assert json.loads(Path(path).read_text()) == {"unhealthy": ["NPU-x", 2]}
    assert read_faults(path) == ["NPU-x", "2"]
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["faults.json"]  # no temp left


@pytest.mark.timeout(30)
def test_stop_interrupts_poll(tmp_path: Path) -> None:
    backend = make(tmp_path)
    backend.stop()
    assert backend.poll_health(600.0) == []  # fails by timeout unless stop() cuts it short


def test_factory_builds_dummy(tmp_path: Path) -> None:
    cfg = AgentConfig(
        backend=BackendKind.DUMMY,
        node_name="n1",
        dummy=DummyConfig(device_count=2, fault_file=str(tmp_path / "f.json")),
    )
    backend = start_backend(cfg)
    assert backend.name == "dummy"
    assert [d.uuid for d in backend.devices()] == [dummy_uuid("NPU", "n1", i) for i in (0, 1)]
    assert create_backend(AgentConfig(backend=BackendKind.NVML)).name == "nvml"
    backend.stop()
