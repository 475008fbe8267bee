"""The count-based size computation must equal the real protobuf size."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpu_share.config.loader import InvalidConfigError
from gpu_share.config.model import AgentConfig, ProblemKind
from gpu_share.errors import ConfigError
from gpu_share.plugin.sizeguard import (
    check_devices,
    check_unit_lists,
    described_devices,
    guard_devices,
    listandwatch_message_size,
    unit_list_size,
)
from gpu_share.sharing.ids import unit_id
from gpu_share.sharing.model import AdvertisedDevice, ResourceKind


def _mem(uuid: str, i: int) -> str:
    return unit_id(uuid, ResourceKind.MEMORY, i)


@pytest.mark.parametrize("count", [0, 1, 9, 10, 11, 99, 100, 101, 1234])
@pytest.mark.parametrize("numa", [None, 0, 3])
def test_unit_list_size_is_exact_and_the_worst_health(count: int, numa: int | None) -> None:
    # The size counted is that of the list with every unit unhealthy (the longest), so
    # no health change can push an accepted list over the limit.
    groups = [("GPU-aaaa", count, numa), ("GPU-bbbbbbbb", count // 2 + 1, numa)]
    sick = [AdvertisedDevice(_mem(u, i), False, n) for u, c, n in groups for i in range(c)]
    well = [AdvertisedDevice(_mem(u, i), True, n) for u, c, n in groups for i in range(c)]
    assert unit_list_size(_mem, groups) == listandwatch_message_size(sick)
    assert listandwatch_message_size(sick) >= listandwatch_message_size(well)


def test_eight_80gib_devices_at_256mib_units_fit() -> None:
    groups = [(f"GPU-{i:08x}-0000-0000-0000-000000000000", 80 * 1024 // 256, 0) for i in range(8)]
    size = check_unit_lists("vendor.com/vcuda-memory", _mem, lambda unit: groups)
    assert 0 < size < 1 << 20


def test_too_large_suggests_a_unit_size_that_fits() -> None:
    def groups(unit: int | None) -> list[tuple[str, int, int | None]]:
        return [(f"GPU-{i:04d}", 81920 // (unit or 1), None) for i in range(64)]

    with pytest.raises(ConfigError) as err:
        check_unit_lists("vendor.com/vcuda-memory", _mem, groups, unit_mib=1)
    msg = str(err.value)
    suggested = int(msg.split("set memoryUnitMiB to ")[1].split()[0])
    assert unit_list_size(_mem, groups(suggested)) <= 1 << 20
    assert unit_list_size(_mem, groups(suggested // 2)) > 1 << 20


def test_check_devices_lists_every_problem_with_its_key() -> None:
    # 1024 devices: the core list (100 ids each) is too large whatever the unit; one
    # device smaller than the unit on top.
    devices = described_devices(1024, 81920)
    devices[5] = replace(devices[5], memory_mib=1024)
    cfg = AgentConfig(memory_unit_mib=2048)
    problems = check_devices(cfg, devices)
    assert [(p.key, p.kind) for p in problems] == [
        ("memoryUnitMiB", ProblemKind.DEVICE_SMALLER_THAN_UNIT),
        ("memoryUnitMiB", ProblemKind.DEVICE_LIST_TOO_LARGE),
        ("", ProblemKind.DEVICE_LIST_TOO_LARGE),
    ]
    assert "device index 5 has 1024 MiB" in problems[0].message
    assert "set memoryUnitMiB to 1024 or less" in problems[0].message
    assert "vendor.com/vcuda-core" in problems[2].message
    with pytest.raises(InvalidConfigError) as err:
        guard_devices(cfg, devices)
    assert err.value.reason == "DeviceSmallerThanUnit"
    assert str(err.value).startswith("invalid configuration (3 problems):")


def test_no_devices_nothing_to_refuse() -> None:
    # failOnInitError: false leaves the agent without devices; it must still start.
    assert check_devices(AgentConfig(memory_unit_mib=1), []) == []
