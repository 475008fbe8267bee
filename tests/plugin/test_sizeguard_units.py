"""The count-based size computation must equal the real protobuf size."""

from __future__ import annotations

import pytest

from gpu_share.errors import ConfigError
from gpu_share.plugin.sizeguard import check_unit_lists, listandwatch_message_size, unit_list_size
from gpu_share.sharing.ids import unit_id
from gpu_share.sharing.model import AdvertisedDevice, ResourceKind


def _mem(uuid: str, i: int) -> str:
    return unit_id(uuid, ResourceKind.MEMORY, i)


@pytest.mark.parametrize("count", [0, 1, 9, 10, 11, 99, 100, 101, 1234])
@pytest.mark.parametrize("numa", [None, 0, 3])
def test_unit_list_size_is_exact(count: int, numa: int | None) -> None:
    groups = [("GPU-aaaa", count, numa), ("GPU-bbbbbbbb", count // 2 + 1, numa)]
    real = [AdvertisedDevice(_mem(u, i), True, n) for u, c, n in groups for i in range(c)]
    assert unit_list_size(_mem, groups) == listandwatch_message_size(real)


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
