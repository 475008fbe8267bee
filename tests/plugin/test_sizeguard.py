"""ListAndWatch size guard."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_share.errors import ConfigError
from gpu_share.plugin import wire
from gpu_share.plugin.sizeguard import check_unit_lists, listandwatch_message_size
from gpu_share.sharing.ids import unit_id
from gpu_share.sharing.model import AdvertisedDevice, ResourceKind

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


def _mem(uuid: str, i: int) -> str:
    return unit_id(uuid, ResourceKind.MEMORY, i)


def test_no_unit_fits() -> None:
    # Too many devices: even the largest unit leaves one id per device, over the limit.
    groups = [(f"GPU-{i:060d}", 1, None) for i in range(200)]
    with pytest.raises(ConfigError, match="no memoryUnitMiB fits") as info:
        check_unit_lists("r", _mem, lambda unit: groups, unit_mib=1, limit_bytes=1000)
    assert info.value.reason == "DeviceListTooLarge"


def test_without_unit_no_suggestion() -> None:
    # The core resource: no unit size to suggest.
    groups = [("GPU-aaaa", 4096, 0)]
    with pytest.raises(ConfigError) as info:
        check_unit_lists("r", _mem, lambda unit: groups, limit_bytes=1000)
    assert "memoryUnitMiB" not in info.value.message
