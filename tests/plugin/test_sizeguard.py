"""ListAndWatch size guard."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_share.errors import ConfigError
from gpu_share.plugin import wire
from gpu_share.plugin.sizeguard import (
    LISTANDWATCH_LIMIT_BYTES,
    check_listandwatch_size,
    listandwatch_message_size,
    smallest_fitting_unit_mib,
)
from gpu_share.sharing.model import AdvertisedDevice

devices_st = st.lists(
    st.builds(
        AdvertisedDevice,
        id=st.text(min_size=1, max_size=63),
        healthy=st.booleans(),
        numa_node=st.none() | st.integers(min_value=0, max_value=7),
    ),
    max_size=20,
)


@given(devices_st)
@settings(max_examples=50, deadline=None)
def test_size_is_the_serialized_length(devices: list[AdvertisedDevice]) -> None:
    size = listandwatch_message_size(devices)
    assert size == len(wire.list_and_watch_response(devices).SerializeToString())


def memory_units(gpus: int, gpu_mib: int, unit_mib: int) -> list[AdvertisedDevice]:
    """Like the agent: one device per memory unit, IDs "<uuid>-<n>"."""
    uuid = "GPU-12345678-1234-1234-1234-123456789abc"
    return [
        AdvertisedDevice(id=f"{uuid}-{g}-{n}", healthy=True, numa_node=0)
        for g in range(gpus)
        for n in range(gpu_mib // unit_mib)
    ]


def test_small_list_passes_and_reports_size() -> None:
    devices = memory_units(2, 16384, 1024)
    assert check_listandwatch_size("r", devices) == listandwatch_message_size(devices)


def test_oversized_list_raises_with_smallest_fitting_power_of_two() -> None:
    def rebuild(unit: int) -> list[AdvertisedDevice]:
        return memory_units(8, 81920, unit)

    with pytest.raises(ConfigError) as info:
        check_listandwatch_size(
            "vendor.com/vcuda-memory", rebuild(16), unit_mib=16, rebuild=rebuild
        )
    err = info.value
    assert err.reason == "DeviceListTooLarge"
    suggestion = smallest_fitting_unit_mib(rebuild, 16)
    assert suggestion is not None
    assert f"memoryUnitMiB to {suggestion} or more" in err.message
    assert "vendor.com/vcuda-memory" in err.message
    # Smallest: it fits, half of it does not.
    assert listandwatch_message_size(rebuild(suggestion)) <= LISTANDWATCH_LIMIT_BYTES
    assert listandwatch_message_size(rebuild(suggestion // 2)) > LISTANDWATCH_LIMIT_BYTES
    assert suggestion & (suggestion - 1) == 0


def test_no_unit_fits() -> None:
    def rebuild(unit: int) -> list[AdvertisedDevice]:
        return [AdvertisedDevice(id=f"{i:063d}", healthy=True) for i in range(200)]

    with pytest.raises(ConfigError, match="no memoryUnitMiB fits"):
        check_listandwatch_size("r", rebuild(1), unit_mib=1, rebuild=rebuild, limit_bytes=1000)


def test_without_rebuild_no_suggestion() -> None:
    devices = memory_units(1, 4096, 1)
    with pytest.raises(ConfigError) as info:
        check_listandwatch_size("r", devices, limit_bytes=1000)
    assert "memoryUnitMiB" not in info.value.message
