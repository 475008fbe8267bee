"""A claim's ``memoryLimit`` (sharing/dra/config.py, dra/claims.py memory_cap_mib): read
from its untrusted config as whole MiB, one value per claim, and honoured only where the
driver's limits can let the slice burst above what placement counted."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_share.config.model import EnforcementMode
from gpu_share.sharing.dra.claims import memory_cap_mib
from gpu_share.sharing.dra.reading import ClaimError, ClaimReason
from gpu_share.sharing.quantity import MIB
from tests.sharing.test_dra_claims import claim, inventory, opaque, parse, result

NML, HAMI = EnforcementMode.NVIDIA_MEMORY_LIMITS, EnforcementMode.HAMI_CORE
SHARE = {"memory": "4Gi", "cores": "30"}


def _claim(*configs: dict[str, Any], results: tuple[dict[str, Any], ...] = ()) -> Any:
    return parse(claim(*(results or (result(consumedCapacity=SHARE),)),
                       config=list(configs)))


@pytest.mark.parametrize(("value", "mib"), [("8Gi", 8192), ("6144Mi", 6144),
                                             ("4294967296", 4096)])
def test_a_memory_limit_is_read_in_whole_mib(value: str, mib: int) -> None:
    assert _claim(opaque({"memoryLimit": value})).config.memory_limit == mib * MIB


@pytest.mark.parametrize("value", ["1.5Mi", "0", "-1Gi", "2Pi", "eight", "", 8192, None,
                                   ["8Gi"], "8Gi" + "0" * 100])
def test_anything_else_is_the_tenants_bad_config(value: object) -> None:
    with pytest.raises(ClaimError, match="memoryLimit") as err:
        _claim(opaque({"memoryLimit": value}))
    assert err.value.reason == ClaimReason.BAD_CONFIG
    assert len(str(err.value)) < 400  # bounded, whatever the value


def test_one_claim_has_one_memory_limit() -> None:
    two = (result("gpu-0", request="a", consumedCapacity=SHARE),
           result("gpu-0", request="b", consumedCapacity=SHARE))
    with pytest.raises(ClaimError, match="different memory limits"):
        _claim(opaque({"memoryLimit": "8Gi"}, requests=["a"]),
               opaque({"memoryLimit": "6Gi"}, requests=["b"]), results=two)
    # The claim's own config comes after its class's: it wins.
    c = _claim(opaque({"memoryLimit": "6Gi"}, source="FromClass"),
               opaque({"memoryLimit": "8Gi"}))
    assert c.config.memory_limit == 8192 * MIB


def test_the_cap_lies_between_what_is_claimed_and_the_device() -> None:
    inv = inventory()
    dev_mib = inv.devices[0].memory_units * inv.unit_mib
    assert memory_cap_mib(_claim(opaque({"memoryLimit": "8Gi"})), NML, inv.unit_mib,
                          inv) == 8192
    assert memory_cap_mib(_claim(), NML, inv.unit_mib, inv) is None
    assert memory_cap_mib(_claim(opaque({"memoryLimit": "4Gi"})), HAMI, inv.unit_mib,
                          inv) is None  # nothing to burst: any mode
    for limit in ("2Gi", f"{dev_mib + 1}Mi"):
        with pytest.raises(ClaimError, match="outside the 4096 MiB claimed") as err:
            memory_cap_mib(_claim(opaque({"memoryLimit": limit})), NML, inv.unit_mib, inv)
        assert err.value.reason == ClaimReason.BAD_CONFIG


def test_only_driver_limits_let_a_slice_burst() -> None:
    inv = inventory()
    for mode in (HAMI, EnforcementMode.MPS, EnforcementMode.NONE):
        with pytest.raises(ClaimError, match="needs enforcement 'nvidia-memory-limits'") as e:
            memory_cap_mib(_claim(opaque({"memoryLimit": "8Gi"})), mode, inv.unit_mib, inv)
        assert e.value.reason == ClaimReason.ENFORCEMENT_UNAVAILABLE


def test_a_claim_of_two_devices_cannot_name_one_cap() -> None:
    two = (result("gpu-0", request="a", consumedCapacity=SHARE),
           result("gpu-1", request="b", consumedCapacity=SHARE))
    inv = inventory()
    with pytest.raises(ClaimError, match="one device, not 2"):
        memory_cap_mib(_claim(opaque({"memoryLimit": "8Gi"}), results=two), NML,
                       inv.unit_mib, inv)
