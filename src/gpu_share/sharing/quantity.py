"""Kubernetes resource quantities and a pod's host CPU/memory request (pure).

The extender needs the host side of a pod and a node to score as the trace replay does
(fgd's host-stranding term); kube-scheduler still runs its own NodeResourcesFit filter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from gpu_share.errors import InputError

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# ASCII only: \d would also take other scripts' digits ("٣" read as 3).
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$",
    re.ASCII,
)
MIB = 2**20
# The API server stores quantities canonically (short, small exponents); anything longer
# or with a larger exponent is hostile input that would make Fraction arithmetic stall.
MAX_QUANTITY_CHARS = 64
MAX_EXPONENT = 40


class QuantityError(InputError):
    """A quantity that is not one, or out of bounds."""


def parse_quantity(value: Any) -> Fraction:
    """A quantity ("500m", "1.5", "16Gi", "1e3", 2) as an exact fraction."""
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    s = str(value).strip()
    if len(s) > MAX_QUANTITY_CHARS:
        raise QuantityError(f"quantity longer than {MAX_QUANTITY_CHARS} characters")
    m = _QUANTITY.match(s)
    if m is None:
        raise QuantityError(f"not a quantity: {s!r}")
    number, exponent, suffix = m.groups()
    q = Fraction(number)
    if exponent:
        power = int(exponent[1:])
        if abs(power) > MAX_EXPONENT:
            raise QuantityError(f"quantity exponent {power} is out of range")
        q *= Fraction(10) ** power
    elif suffix in _BINARY:
        q *= _BINARY[suffix]
    else:
        q *= _DECIMAL[suffix or ""]
    return q


def cpu_milli(value: Any, *, up: bool = True) -> int:
    """CPU in millicores; requests round up, capacities (``up=False``) down."""
    q = parse_quantity(value) * 1000
    return math.ceil(q) if up else math.floor(q)


def memory_mib(value: Any, *, up: bool = True) -> int:
    """Memory in MiB; requests round up, capacities (``up=False``) down."""
    q = parse_quantity(value) / MIB
    return math.ceil(q) if up else math.floor(q)


def _container_request(c: Mapping[str, Any]) -> tuple[int, int]:
    res = c.get("resources") or {}
    # A limit without a request defaults the request to it (API server defaulting).
    amounts = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    cpu = cpu_milli(amounts["cpu"]) if "cpu" in amounts else 0
    mem = memory_mib(amounts["memory"]) if "memory" in amounts else 0
    return cpu, mem


def pod_host_request(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(CPU millicores, memory MiB) the scheduler reserves for ``pod``: the larger of
    the running containers (plus restartable init "sidecars") and each plain init
    container with the sidecars started before it, plus the pod overhead."""
    spec = pod.get("spec") or {}
    cpu = mem = 0
    side_cpu = side_mem = 0
    init_cpu = init_mem = 0
    for c in spec.get("initContainers") or ():
        rc, rm = _container_request(c)
        if c.get("restartPolicy") == "Always":
            side_cpu, side_mem = side_cpu + rc, side_mem + rm
        else:
            init_cpu, init_mem = max(init_cpu, side_cpu + rc), max(init_mem, side_mem + rm)
    for c in spec.get("containers") or ():
        rc, rm = _container_request(c)
        cpu, mem = cpu + rc, mem + rm
    cpu, mem = max(cpu + side_cpu, init_cpu), max(mem + side_mem, init_mem)
    overhead = spec.get("overhead") or {}
    if "cpu" in overhead:
        cpu += cpu_milli(overhead["cpu"])
    if "memory" in overhead:
        mem += memory_mib(overhead["memory"])
    return cpu, mem
