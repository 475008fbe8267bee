"""What the node's NVIDIA driver library offers beyond discovery, read without starting
NVML: whether ``libnvidia-ml.so.1`` exports a call (driver-enforced memory limits need
``nvmlDeviceSetMemoryLimits_v1``, driver branch R615 and later)."""

from __future__ import annotations

import ctypes

NVML_LIBRARY = "libnvidia-ml.so.1"
SET_MEMORY_LIMITS = "nvmlDeviceSetMemoryLimits_v1"


def missing_call(symbol: str) -> str | None:
    """None when the driver's NVML exports ``symbol``, else why not."""
    try:
        lib = ctypes.CDLL(NVML_LIBRARY)
    except OSError as exc:
        return f"{NVML_LIBRARY} not loadable ({str(exc)[:120]})"
    if hasattr(lib, symbol):
        return None
    return f"the driver's NVML has no {symbol} (driver-enforced memory limits need R615 or later)"
