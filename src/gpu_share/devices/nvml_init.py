"""Why nvmlInit failed, in words a person can act on."""

from __future__ import annotations

from gpu_share.errors import DeviceBackendError

_INIT_HINTS: dict[str, tuple[str, str]] = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": (
        "NvmlLibraryNotFound",
        "libnvidia-ml.so.1 was not found: the NVIDIA driver is not installed on this node, "
        "or its libraries are not visible in the agent container (run it with the nvidia "
        "runtime class, or mount the driver's lib directory)",
    ),
    "NVML_ERROR_DRIVER_NOT_LOADED": (
        "NvmlDriverNotLoaded",
        "the NVIDIA kernel driver is not loaded (no /dev/nvidiactl?); check `lsmod | grep "
        "nvidia` and dmesg on the node",
    ),
    "NVML_ERROR_NO_PERMISSION": (
        "NvmlNoPermission",
        "permission denied opening the NVIDIA device nodes; the agent needs access to "
        "/dev/nvidia* (privileged, or the device cgroup allowing them)",
    ),
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        "NvmlVersionMismatch",
        "the user-space NVML library and the loaded kernel driver have different "
        "versions (driver upgraded without reboot?); reload the driver or reboot the node",
    ),
    "NVML_ERROR_INSUFFICIENT_POWER": (
        "NvmlInitFailed",
        "a GPU reports insufficient external power; check its power cables",
    ),
}


def init_error(nvml: object, exc: BaseException) -> DeviceBackendError:
    """Translate an nvmlInit failure into a DeviceBackendError a person can act on."""
    value = getattr(exc, "value", None)
    for const, (reason, hint) in _INIT_HINTS.items():
        if value is not None and value == getattr(nvml, const, object()):
            return DeviceBackendError(f"NVML init failed: {hint} ({exc})", reason=reason)
    return DeviceBackendError(
        f"NVML init failed: {exc}. Is this a GPU node with the NVIDIA driver installed? "
        "Set failOnInitError: false to run the agent without GPUs.",
        reason="NvmlInitFailed",
    )
