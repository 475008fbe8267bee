"""The dummy fault file is operator- (and test-) written input: whatever it holds, the
health poll raises nothing, keeps the last good state, and applies the file once it is
fixed (a deeply nested array once raised RecursionError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_share.config.model import DummyConfig
from gpu_share.devices.dummy import (
    FAULT_FILE_MALFORMED,
    MAX_FAULT_FILE_BYTES,
    DummyBackend,
    FaultFileError,
    read_faults,
    write_faults,
)
from gpu_share.errors import DeviceBackendError


def make(tmp_path: Path) -> DummyBackend:
    cfg = DummyConfig(fault_file=str(tmp_path / "faults.json"), device_count=2)
    backend = DummyBackend(cfg, node_name="node-a", check_interval_s=0.01)
    backend.start()
    return backend


@pytest.mark.parametrize(
    "content",
    [
        "[" * 100_000,
        '{"unhealthy": ' + "[" * 100_000,
        '{"unhealthy": [' + "9" * 5000 + "]}",  # over Python's int digit limit
        '{"unhealthy": ["' + "x" * 10_000 + '", {}]}',
        b"\xff\xfe{}",
    ],
)
def test_malformed_content_is_a_typed_error(tmp_path: Path, content: str | bytes) -> None:
    path = tmp_path / "faults.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(FaultFileError) as err:
        read_faults(str(path))
    assert isinstance(err.value, DeviceBackendError)
    assert err.value.reason == FAULT_FILE_MALFORMED
    assert len(str(err.value)) < 300  # never echoes the file


def test_oversized_file_is_refused_without_parsing(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    path.write_text('{"unhealthy": []}' + " " * MAX_FAULT_FILE_BYTES)
    with pytest.raises(FaultFileError, match="larger than"):
        read_faults(str(path))


def test_nested_array_keeps_the_last_state_and_a_fixed_file_applies(tmp_path: Path) -> None:
    backend = make(tmp_path)
    write_faults(str(tmp_path / "faults.json"), [0])
    assert [e.healthy for e in backend.poll_health(1.0)] == [False]
    (tmp_path / "faults.json").write_text("[" * 100_000)
    assert backend.poll_health(0.05) == []  # no exception escapes
    assert backend.fault_file_error is not None
    assert [d.index for d in backend.devices() if not d.healthy] == [0]
    write_faults(str(tmp_path / "faults.json"), [1])
    events = backend.poll_health(1.0)
    assert sorted((e.healthy, e.uuid) for e in events) == sorted(
        [(True, backend.devices()[0].uuid), (False, backend.devices()[1].uuid)]
    )
    assert backend.fault_file_error is None
