from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_share.sharing.quantity import (
    QuantityError,
    cpu_milli,
    memory_mib,
    parse_quantity,
    pod_host_request,
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2", Fraction(2)),
        (3, Fraction(3)),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("16Gi", Fraction(16 * 2**30)),
        ("128974848", Fraction(128974848)),
        ("129e6", Fraction(129_000_000)),
        ("129M", Fraction(129_000_000)),
        ("123Mi", Fraction(123 * 2**20)),
        ("1k", Fraction(1000)),
        ("100n", Fraction(1, 10**7)),
    ],
)
def test_parse(text: Any, want: Fraction) -> None:
    assert parse_quantity(text) == want


@pytest.mark.parametrize(
    "bad", ["", "abc", "1.2.3", "5 Gi", "1Xi", True, "Mi", "\u0663", "\uff13Gi", "1\u00b2"]
)
def test_parse_rejects(bad: Any) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)


# Tenant-written quantities: a huge exponent made Fraction arithmetic run for minutes
# (the timeout fails the old code), and errors must not echo unbounded input.
@pytest.mark.timeout(20)
@pytest.mark.parametrize("bad", ["1e999999999", "1e-999999999", "1e41", "9" * 65])
def test_parse_refuses_hostile_sizes_quickly(bad: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(bad)
    assert len(str(info.value)) < 100


def test_parse_accepts_the_largest_allowed_exponent() -> None:
    assert parse_quantity("1e40") == Fraction(10**40)


def test_rounding_direction() -> None:
    assert cpu_milli("0.0001") == 1 and cpu_milli("0.0001", up=False) == 0
    assert memory_mib("1500Ki") == 2 and memory_mib("1500Ki", up=False) == 1


@given(st.integers(0, 10**6), st.sampled_from(["", "Ki", "Mi", "Gi"]))
def test_binary_suffixes_scale_exactly(n: int, suffix: str) -> None:
    scale = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[suffix]
    assert parse_quantity(f"{n}{suffix}") == n * scale
    assert memory_mib(f"{n}{suffix}") * 2**20 >= n * scale


@given(st.integers(0, 10**7))
def test_millicores_round_trip(m: int) -> None:
    assert cpu_milli(f"{m}m") == m
    assert cpu_milli(f"{m / 1000}") == m  # decimal text of the same amount


def _c(cpu: str | None = None, mem: str | None = None, **extra: Any) -> dict[str, Any]:
    req = {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v is not None}
    return {"name": "x", "resources": {"requests": req}, **extra}


def test_pod_request_sums_containers_and_takes_init_maximum() -> None:
    pod = {
        "spec": {
            "initContainers": [_c("3", "1Gi"), _c("1", "4Gi")],
            "containers": [_c("1", "1Gi"), _c("500m", "512Mi")],
        }
    }
    # cpu: max(1.5, 3) ; memory: max(1.5Gi, 4Gi)
    assert pod_host_request(pod) == (3000, 4096)


def test_sidecars_add_to_containers_and_to_later_inits() -> None:
    pod = {
        "spec": {
            "initContainers": [
                _c("1", "1Gi", restartPolicy="Always"),
                _c("2", "1Gi"),
            ],
            "containers": [_c("1", "1Gi")],
            "overhead": {"cpu": "250m", "memory": "64Mi"},
        }
    }
    # running: 1 + 1 sidecar = 2; init 2 runs beside the sidecar: 3 -> 3 cpu; +overhead
    assert pod_host_request(pod) == (3250, 2048 + 64)


def test_limits_stand_in_for_missing_requests() -> None:
    pod = {"spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": "2"}}}]}}
    assert pod_host_request(pod) == (2000, 0)
    assert pod_host_request({"spec": {}}) == (0, 0)
