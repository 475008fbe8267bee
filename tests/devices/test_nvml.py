from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType

import pynvml as real_pynvml
import pytest

from gpu_share.config.model import AgentConfig, HealthConfig
from gpu_share.devices.factory import NoDevicesBackend, start_backend
from gpu_share.devices.nvml import NvmlBackend, normalize_bus_id
from gpu_share.devices.nvml_health import classify_xid
from gpu_share.errors import DeviceBackendError
from tests.devices.conftest import FakeClock

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
QUIET = 60.0


def make(
    fake: ModuleType,
    clock: FakeClock,
    tmp_path: Path,
    *,
    quiet: float = QUIET,
    start: bool = True,
) -> NvmlBackend:
    backend = NvmlBackend(
        HealthConfig(recovery_quiet_seconds=quiet),
        nvml=fake,
        clock=clock,
        dev_root=str(tmp_path / "dev"),
        sysfs_root=str(tmp_path / "sys"),
    )
    if start:
        backend.start()
    return backend


@pytest.fixture
def two_gpus(fake_nvml: ModuleType) -> ModuleType:
    fake_nvml.fake_add_gpu(
        UUID0,
        name="NVIDIA A100-SXM4-40GB",
        memory_mib=40960,
        numa_node=0,
        bus_id="00000000:3B:00.0",
    )
    fake_nvml.fake_add_gpu(
        UUID1,
        name="NVIDIA A100-SXM4-40GB",
        memory_mib=40960,
        numa_node=1,
        minor=7,
        bus_id="00000000:AF:00.0",
    )
    return fake_nvml


@pytest.fixture
def backend(two_gpus: ModuleType, clock: FakeClock, tmp_path: Path) -> NvmlBackend:
    """A started backend over ``two_gpus``."""
    return make(two_gpus, clock, tmp_path)


def only_event(backend: NvmlBackend, timeout_s: float) -> tuple[str | None, bool, str, bool]:
    """The one health event a poll yields: (uuid, healthy, reason, transient)."""
    [event] = backend.poll_health(timeout_s)
    return (event.uuid, event.healthy, event.reason, event.transient)


def health(backend: NvmlBackend) -> dict[str, bool]:
    return {d.uuid: d.healthy for d in backend.devices()}


# ------------------------------------------------------------------ the fake itself


def test_fake_matches_real_pynvml_names_and_values(fake_nvml: ModuleType) -> None:
    checked = 0
    for name in dir(fake_nvml):
        if name.startswith(("NVML_ERROR_", "nvmlEventType", "NVML_SUCCESS")):
            assert getattr(real_pynvml, name) == getattr(fake_nvml, name), name
            checked += 1
        elif name.startswith("NVMLError_"):
            real_cls = getattr(real_pynvml, name)
            assert real_cls.__name__ == getattr(fake_nvml, name).__name__
            checked += 1
        elif name.startswith(("nvml", "c_nvml")) and inspect.isclass(getattr(fake_nvml, name)):
            assert hasattr(real_pynvml, name), name
        elif name.startswith("nvml") and inspect.isfunction(getattr(fake_nvml, name)):
            real_params = list(inspect.signature(getattr(real_pynvml, name)).parameters)
            fake_params = list(inspect.signature(getattr(fake_nvml, name)).parameters)
            assert fake_params == real_params, name
            checked += 1
    assert checked > 40


def test_fake_error_constructor_returns_subclass_like_real(fake_nvml: ModuleType) -> None:
    err = fake_nvml.NVMLError(fake_nvml.NVML_ERROR_TIMEOUT)
    assert isinstance(err, fake_nvml.NVMLError_Timeout)
    assert err.value == fake_nvml.NVML_ERROR_TIMEOUT
    real = real_pynvml.NVMLError(real_pynvml.NVML_ERROR_TIMEOUT)
    assert type(real).__name__ == type(err).__name__
    assert fake_nvml.NVMLError_GpuIsLost().value == fake_nvml.NVML_ERROR_GPU_IS_LOST


# ------------------------------------------------------------------ discovery


def test_discovery_fields(backend: NvmlBackend, tmp_path: Path) -> None:
    devs = backend.devices()
    assert [d.uuid for d in devs] == [UUID0, UUID1]
    d0, d1 = devs
    assert (d0.index, d0.minor, d0.memory_mib, d0.model) == (0, 0, 40960, "NVIDIA A100-SXM4-40GB")
    assert (d1.index, d1.minor) == (1, 7)
    assert (d0.numa_node, d1.numa_node) == (0, 1)
    assert d0.pci_bus_id == "0000:3b:00.0"
    assert d1.nodes[0].container_path == "/dev/nvidia7"
    assert d1.nodes[0].host_path == str(tmp_path / "dev" / "nvidia7")
    assert all(d.healthy for d in devs)
    assert backend.notes == []


@pytest.mark.parametrize(("sysfs_value", "expected"), [("1\n", 1), ("-1\n", None), (None, None)])
def test_numa_falls_back_to_sysfs(
    fake_nvml: ModuleType,
    clock: FakeClock,
    tmp_path: Path,
    sysfs_value: str | None,
    expected: int | None,
) -> None:
    fake_nvml.fake_add_gpu(UUID0, numa_node=None, bus_id="00000000:3B:00.0")
    if sysfs_value is not None:
        node_dir = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0"
        node_dir.mkdir(parents=True)
        (node_dir / "numa_node").write_text(sysfs_value)
    assert make(fake_nvml, clock, tmp_path).devices()[0].numa_node == expected


def test_broken_gpu_is_skipped_with_a_note(
    two_gpus: ModuleType, clock: FakeClock, tmp_path: Path
) -> None:
    two_gpus.fake_fail(UUID0, two_gpus.NVML_ERROR_UNKNOWN, "nvmlDeviceGetMinorNumber")
    backend = make(two_gpus, clock, tmp_path)
    assert [d.uuid for d in backend.devices()] == [UUID1]
    assert any("index 0 skipped" in n for n in backend.notes)


def test_naming_hands_out_only_existing_uvm_nodes(
    fake_nvml: ModuleType, clock: FakeClock, tmp_path: Path
) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia-uvm").touch()
    naming = make(fake_nvml, clock, tmp_path).naming()
    assert naming.visible_devices_env == "NVIDIA_VISIBLE_DEVICES"
    assert [n.container_path for n in naming.shared_nodes] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]


@pytest.mark.parametrize(
    ("code", "reason", "needle"),
    [
        ("NVML_ERROR_LIBRARY_NOT_FOUND", "NvmlLibraryNotFound", "libnvidia-ml.so.1"),
        ("NVML_ERROR_DRIVER_NOT_LOADED", "NvmlDriverNotLoaded", "kernel driver"),
        ("NVML_ERROR_NO_PERMISSION", "NvmlNoPermission", "permission denied"),
        ("NVML_ERROR_UNKNOWN", "NvmlInitFailed", "failOnInitError"),
    ],
)
def test_init_failure_is_explained(
    fake_nvml: ModuleType, clock: FakeClock, tmp_path: Path, code: str, reason: str, needle: str
) -> None:
    fake_nvml.fake_set_init_error(getattr(fake_nvml, code))
    with pytest.raises(DeviceBackendError) as info:
        make(fake_nvml, clock, tmp_path)
    assert info.value.reason == reason
    assert needle in str(info.value)


def test_start_backend_honours_fail_on_init_error(
    fake_nvml: ModuleType, clock: FakeClock, tmp_path: Path
) -> None:
    fake_nvml.fake_set_init_error(fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    strict = AgentConfig(fail_on_init_error=True)
    with pytest.raises(DeviceBackendError):
        start_backend(strict, make(fake_nvml, clock, tmp_path, start=False))
    lenient = AgentConfig(fail_on_init_error=False)
    backend = start_backend(lenient, make(fake_nvml, clock, tmp_path, start=False))
    assert isinstance(backend, NoDevicesBackend)
    assert backend.devices() == [] and backend.name == "nvml"
    assert backend.error.reason == "NvmlLibraryNotFound"
    assert backend.poll_health(0) == []


def test_stop_is_idempotent_and_shuts_nvml_down(two_gpus: ModuleType, backend: NvmlBackend) -> None:
    assert two_gpus.fake_state().initialized == 1
    backend.stop()
    backend.stop()
    assert two_gpus.fake_state().initialized == 0
    assert all(es.freed for es in two_gpus.fake_state().event_sets)


# ------------------------------------------------------------------ health


def test_ignored_xid_changes_nothing(two_gpus: ModuleType, backend: NvmlBackend) -> None:
    two_gpus.fake_push_xid(UUID0, 13)
    assert backend.poll_health(1.0) == []
    assert health(backend) == {UUID0: True, UUID1: True}
    assert two_gpus.fake_state().wait_timeouts[0] == 1000


def test_transient_xid_marks_unhealthy_then_recovers_after_quiet_period(
    two_gpus: ModuleType, clock: FakeClock, backend: NvmlBackend
) -> None:
    two_gpus.fake_push_xid(UUID0, 32)
    assert only_event(backend, 0.1) == (UUID0, False, "xid-32", True)
    assert health(backend) == {UUID0: False, UUID1: True}

    clock.advance(QUIET - 1)
    assert backend.poll_health(0.1) == []
    assert health(backend)[UUID0] is False

    clock.advance(2)
    [back] = backend.poll_health(0.1)
    assert (back.uuid, back.healthy, back.reason) == (UUID0, True, "recovered")
    assert health(backend)[UUID0] is True


def test_new_xid_restarts_the_quiet_period(
    two_gpus: ModuleType, clock: FakeClock, backend: NvmlBackend
) -> None:
    two_gpus.fake_push_xid(UUID0, 32)
    backend.poll_health(0.1)
    clock.advance(QUIET - 10)
    two_gpus.fake_push_xid(UUID0, 32)
    assert backend.poll_health(0.1) == []  # already unhealthy: no duplicate event
    clock.advance(20)  # QUIET + 10 after the first, 20 after the second
    assert backend.poll_health(0.1) == []
    clock.advance(QUIET)
    assert [e.healthy for e in backend.poll_health(0.1)] == [True]


def test_no_recovery_while_nvml_still_fails(
    two_gpus: ModuleType, clock: FakeClock, backend: NvmlBackend
) -> None:
    two_gpus.fake_push_xid(UUID0, 32)
    backend.poll_health(0.1)
    two_gpus.fake_fail(UUID0, two_gpus.NVML_ERROR_UNKNOWN, "nvmlDeviceGetHandleByUUID")
    clock.advance(QUIET * 3)
    assert backend.poll_health(0.1) == []
    assert health(backend)[UUID0] is False
    two_gpus.fake_fail(UUID0, None, "nvmlDeviceGetHandleByUUID")
    assert [(e.uuid, e.healthy) for e in backend.poll_health(0.1)] == [(UUID0, True)]


@pytest.mark.parametrize("xid", [48, 79, 94, 95])
def test_fatal_xid_never_recovers(
    two_gpus: ModuleType, clock: FakeClock, backend: NvmlBackend, xid: int
) -> None:
    two_gpus.fake_push_xid(UUID1, xid)
    assert only_event(backend, 0.1) == (UUID1, False, f"xid-{xid}", False)
    clock.advance(QUIET * 10)
    assert backend.poll_health(0.1) == []
    assert health(backend)[UUID1] is False


def test_fatal_xid_after_transient_one_upgrades(
    two_gpus: ModuleType, clock: FakeClock, backend: NvmlBackend
) -> None:
    two_gpus.fake_push_xid(UUID0, 32)
    two_gpus.fake_push_xid(UUID0, 79)
    events = backend.poll_health(0.1)
    assert [(e.reason, e.transient) for e in events] == [("xid-32", True), ("xid-79", False)]
    clock.advance(QUIET * 10)
    assert backend.poll_health(0.1) == []


def test_double_bit_ecc_is_fatal(two_gpus: ModuleType, backend: NvmlBackend) -> None:
    two_gpus.fake_push_event(UUID0, two_gpus.nvmlEventTypeDoubleBitEccError)
    two_gpus.fake_push_event(UUID1, two_gpus.nvmlEventTypeSingleBitEccError)  # not registered
    [event] = backend.poll_health(0.1)
    assert (event.uuid, event.reason, event.transient) == (UUID0, "ecc-double-bit", False)


def test_event_without_device_marks_every_device(
    two_gpus: ModuleType, backend: NvmlBackend
) -> None:
    two_gpus.fake_push_xid(None, 61)
    events = backend.poll_health(0.1)
    assert sorted(e.uuid for e in events) == [UUID0, UUID1]
    assert not any(health(backend).values())


def test_device_lost(two_gpus: ModuleType, clock: FakeClock, backend: NvmlBackend) -> None:
    two_gpus.fake_fail(UUID1, two_gpus.NVML_ERROR_GPU_IS_LOST)
    two_gpus.fake_set_wait_error(two_gpus.NVML_ERROR_GPU_IS_LOST)
    assert only_event(backend, 0.01) == (UUID1, False, "device-lost", False)
    clock.advance(QUIET * 10)
    two_gpus.fake_set_wait_error(None)
    assert backend.poll_health(0.01) == []
    assert health(backend) == {UUID0: True, UUID1: False}


def test_lost_during_quiet_period_is_not_recovered(
    two_gpus: ModuleType, clock: FakeClock, backend: NvmlBackend
) -> None:
    two_gpus.fake_push_xid(UUID0, 32)
    backend.poll_health(0.1)
    two_gpus.fake_fail(UUID0, two_gpus.NVML_ERROR_GPU_IS_LOST)
    [event] = backend.poll_health(0.1)
    assert (event.reason, event.transient) == ("device-lost", False)
    two_gpus.fake_fail(UUID0, None)
    clock.advance(QUIET * 10)
    assert backend.poll_health(0.1) == []


def test_recovery_disabled_by_zero_quiet_period(
    two_gpus: ModuleType, clock: FakeClock, tmp_path: Path
) -> None:
    backend = make(two_gpus, clock, tmp_path, quiet=0)
    two_gpus.fake_push_xid(UUID0, 32)
    [event] = backend.poll_health(0.1)
    assert event.transient is False
    clock.advance(10_000)
    assert backend.poll_health(0.1) == []


def test_device_without_event_support_stays_healthy_with_note(
    fake_nvml: ModuleType, clock: FakeClock, tmp_path: Path
) -> None:
    fake_nvml.fake_add_gpu(UUID0, supported_events=0)
    backend = make(fake_nvml, clock, tmp_path)
    assert any(UUID0 in n and "XID" in n for n in backend.notes)
    assert backend.poll_health(0.01) == []
    assert health(backend) == {UUID0: True}
    assert fake_nvml.fake_state().wait_timeouts == []  # nothing registered: no wait


def test_xid_classification_helpers() -> None:
    assert classify_xid(13, [13], [79]) == "ignored"
    assert classify_xid(79, [13], [79]) == "fatal"
    assert classify_xid(32, [13], [79]) == "transient"
    assert normalize_bus_id("00000000:AF:00.0") == "0000:af:00.0"
    assert normalize_bus_id("0000:af:00.0") == "0000:af:00.0"
