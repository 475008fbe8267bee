"""A fake ``pynvml`` (nvidia-ml-py) for tests: same names, values and error classes.

Public names mirror the real module: ``nvmlInit``, ``nvmlDeviceGetHandleByIndex``,
``NVMLError`` (whose constructor returns the per-code subclass, e.g.
``NVMLError(NVML_ERROR_TIMEOUT)`` is an ``NVMLError_Timeout``), ``NVML_*`` constants
and ``nvmlEventType*`` masks. Strings come back as ``str`` like the real module's
``convertStrBytes`` wrapper; the PCI ``busId`` stays ``bytes`` like the ctypes field.

Test controls are the ``fake_*`` functions. Load a fresh copy per test (see
``tests/devices/conftest.py``) so state never leaks between tests.
"""

from __future__ import annotations

import string
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any

# ---------------------------------------------------------------- constants (real values)

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypePState = 0x0000000000000004
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeClock = 0x0000000000000010
nvmlEventTypePowerSourceChange = 0x0000000000000080
nvmlEventMigConfigChange = 0x0000000000000100
nvmlEventTypeSingleBitEccErrorStorm = 0x0000000000000200
nvmlEventTypeDramRetirementEvent = 0x0000000000000400
nvmlEventTypeDramRetirementFailure = 0x0000000000000800
nvmlEventTypeNonFatalPoisonError = 0x0000000000001000
nvmlEventTypeFatalPoisonError = 0x0000000000002000
nvmlEventTypeGpuUnavailableError = 0x0000000000004000
nvmlEventTypeGpuRecoveryAction = 0x0000000000008000
nvmlEventTypeNone = 0x0000000000000000
nvmlEventTypeAll = (
    nvmlEventTypeSingleBitEccError
    | nvmlEventTypeDoubleBitEccError
    | nvmlEventTypePState
    | nvmlEventTypeXidCriticalError
    | nvmlEventTypeClock
    | nvmlEventTypePowerSourceChange
    | nvmlEventMigConfigChange
    | nvmlEventTypeSingleBitEccErrorStorm
    | nvmlEventTypeDramRetirementEvent
    | nvmlEventTypeDramRetirementFailure
    | nvmlEventTypeNonFatalPoisonError
    | nvmlEventTypeFatalPoisonError
    | nvmlEventTypeGpuUnavailableError
    | nvmlEventTypeGpuRecoveryAction
)

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


# ---------------------------------------------------------------- errors


class NVMLError(Exception):
    """``NVMLError(code)`` yields the subclass generated for ``code`` (as pynvml does)."""

    _valClassMapping: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int | None = None) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def nvmlExceptionClass(nvmlErrorCode: int) -> type[NVMLError]:
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError(f"nvmlErrorCode {nvmlErrorCode} is not valid")
    return NVMLError._valClassMapping[nvmlErrorCode]


def _make_error_classes() -> None:
    # Same naming as pynvml: NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost.
    module = sys.modules[__name__]
    for const in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        code = getattr(module, const)
        words = string.capwords(const.removeprefix("NVML_ERROR_"), "_").replace("_", "")
        name = "NVMLError_" + words

        def new(cls: type[NVMLError], *args: Any, _code: int = code) -> NVMLError:
            return NVMLError.__new__(cls, _code)

        cls = type(name, (NVMLError,), {"__new__": new})
        cls.__module__ = __name__
        setattr(module, name, cls)
        NVMLError._valClassMapping[code] = cls


_make_error_classes()


def _raise(code: int) -> None:
    raise NVMLError(code)


# ---------------------------------------------------------------- fake hardware


@dataclass
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclass
class nvmlPciInfo_t:
    busId: bytes
    domain: int = 0
    bus: int = 0
    device: int = 0


@dataclass
class c_nvmlEventData_t:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass(eq=False)
class FakeGpu:
    uuid: str
    name: str = "NVIDIA Fake GPU"
    memory_mib: int = 16384
    minor: int = 0
    index: int = 0
    bus_id: str = "00000000:3B:00.0"
    numa_node: int | None = 0  # None: nvmlDeviceGetNumaNodeId is NOT_SUPPORTED
    supported_events: int = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError
    # function name (or "*") -> error code, to make queries fail
    failures: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class c_nvmlDevice_t:
    gpu: FakeGpu


@dataclass(eq=False)
class c_nvmlEventSet_t:
    registered: dict[int, int] = field(default_factory=dict)  # id(handle's gpu) -> mask
    freed: bool = False


class _State:
    def __init__(self) -> None:
        self.gpus: list[FakeGpu] = []
        self.initialized = 0
        self.init_error: int | None = None
        self.events: deque[tuple[FakeGpu | None, int, int]] = deque()
        self.wait_error: int | None = None
        self.wait_timeouts: list[int] = []
        self.event_sets: list[c_nvmlEventSet_t] = []
        self.driver_version = "550.54.15"


_state = _State()


def fake_add_gpu(uuid: str, **kwargs: Any) -> FakeGpu:
    gpu = FakeGpu(uuid=uuid, index=len(_state.gpus), **kwargs)
    if "minor" not in kwargs:
        gpu.minor = gpu.index
    _state.gpus.append(gpu)
    return gpu


def fake_set_init_error(code: int | None) -> None:
    _state.init_error = code


def fake_fail(uuid: str, code: int | None, function: str = "*") -> None:
    """Make ``function`` (or every query, "*") fail with ``code`` for this GPU; None heals."""
    gpu = _gpu(uuid)
    if code is None:
        gpu.failures.pop(function, None)
    else:
        gpu.failures[function] = code


def fake_push_xid(uuid: str | None, xid: int) -> None:
    """Queue an XID critical error; uuid None: an event NVML cannot attribute."""
    fake_push_event(uuid, nvmlEventTypeXidCriticalError, xid)


def fake_push_event(uuid: str | None, event_type: int, data: int = 0) -> None:
    _state.events.append((_gpu(uuid) if uuid else None, event_type, data))


def fake_set_wait_error(code: int | None) -> None:
    _state.wait_error = code


def fake_state() -> _State:
    return _state


def _gpu(uuid: str) -> FakeGpu:
    for gpu in _state.gpus:
        if gpu.uuid == uuid:
            return gpu
    raise KeyError(uuid)


def _check_init() -> None:
    if _state.initialized <= 0:
        _raise(NVML_ERROR_UNINITIALIZED)


def _query(handle: Any, function: str) -> FakeGpu:
    _check_init()
    if not isinstance(handle, c_nvmlDevice_t):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    gpu: FakeGpu = handle.gpu
    code = gpu.failures.get(function, gpu.failures.get("*"))
    if code is not None:
        _raise(code)
    return gpu


# ---------------------------------------------------------------- API (real signatures)


def nvmlInitWithFlags(flags: int) -> None:
    if _state.init_error is not None:
        _raise(_state.init_error)
    _state.initialized += 1


def nvmlInit() -> None:
    nvmlInitWithFlags(0)


def nvmlShutdown() -> None:
    _check_init()
    _state.initialized -= 1


def nvmlErrorString(result: int) -> str:
    return _MESSAGES.get(result, "Unknown Error")


def nvmlSystemGetDriverVersion() -> str:
    _check_init()
    return _state.driver_version


def nvmlSystemGetNVMLVersion() -> str:
    _check_init()
    return "12.550.54.15"


def nvmlDeviceGetCount() -> int:
    _check_init()
    return len(_state.gpus)


def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:
    _check_init()
    if not 0 <= index < len(_state.gpus):
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    handle = c_nvmlDevice_t(_state.gpus[index])
    _query(handle, "nvmlDeviceGetHandleByIndex")
    return handle


def nvmlDeviceGetHandleByUUID(uuid: str) -> c_nvmlDevice_t:
    _check_init()
    for gpu in _state.gpus:
        if gpu.uuid == uuid:
            handle = c_nvmlDevice_t(gpu)
            _query(handle, "nvmlDeviceGetHandleByUUID")
            return handle
    _raise(NVML_ERROR_NOT_FOUND)
    raise AssertionError("unreachable")


def nvmlDeviceGetUUID(handle: c_nvmlDevice_t) -> str:
    return _query(handle, "nvmlDeviceGetUUID").uuid


def nvmlDeviceGetIndex(handle: c_nvmlDevice_t) -> int:
    return _query(handle, "nvmlDeviceGetIndex").index


def nvmlDeviceGetMinorNumber(handle: c_nvmlDevice_t) -> int:
    return _query(handle, "nvmlDeviceGetMinorNumber").minor


def nvmlDeviceGetName(handle: c_nvmlDevice_t) -> str:
    return _query(handle, "nvmlDeviceGetName").name


def nvmlDeviceGetMemoryInfo(handle: c_nvmlDevice_t, version: int | None = None) -> c_nvmlMemory_t:
    gpu = _query(handle, "nvmlDeviceGetMemoryInfo")
    total = gpu.memory_mib * 1024 * 1024
    return c_nvmlMemory_t(total=total, free=total, used=0)


def nvmlDeviceGetNumaNodeId(handle: c_nvmlDevice_t) -> int:
    gpu = _query(handle, "nvmlDeviceGetNumaNodeId")
    if gpu.numa_node is None:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    return gpu.numa_node if gpu.numa_node is not None else -1


def nvmlDeviceGetPciInfo_v3(handle: c_nvmlDevice_t) -> nvmlPciInfo_t:
    gpu = _query(handle, "nvmlDeviceGetPciInfo")
    return nvmlPciInfo_t(busId=gpu.bus_id.encode())


def nvmlDeviceGetPciInfo(handle: c_nvmlDevice_t) -> nvmlPciInfo_t:
    return nvmlDeviceGetPciInfo_v3(handle)


def nvmlEventSetCreate() -> c_nvmlEventSet_t:
    _check_init()
    es = c_nvmlEventSet_t()
    _state.event_sets.append(es)
    return es


def nvmlDeviceGetSupportedEventTypes(handle: c_nvmlDevice_t) -> int:
    return _query(handle, "nvmlDeviceGetSupportedEventTypes").supported_events


def nvmlDeviceRegisterEvents(handle: c_nvmlDevice_t, eventTypes: int, eventSet: Any) -> None:
    gpu = _query(handle, "nvmlDeviceRegisterEvents")
    if eventTypes & ~gpu.supported_events:
        _raise(NVML_ERROR_NOT_SUPPORTED)
    eventSet.registered[id(gpu)] = eventSet.registered.get(id(gpu), 0) | eventTypes


def nvmlEventSetWait_v2(eventSet: Any, timeoutms: int) -> c_nvmlEventData_t:
    """Never sleeps: an empty queue answers NVML_ERROR_TIMEOUT at once."""
    _check_init()
    if eventSet.freed:
        _raise(NVML_ERROR_INVALID_ARGUMENT)
    _state.wait_timeouts.append(timeoutms)
    if _state.wait_error is not None:
        _raise(_state.wait_error)
    while _state.events:
        gpu, etype, data = _state.events.popleft()
        if gpu is not None and not eventSet.registered.get(id(gpu), 0) & etype:
            continue  # not registered for it: NVML would not deliver it
        device = c_nvmlDevice_t(gpu) if gpu is not None else None
        return c_nvmlEventData_t(device=device, eventType=etype, eventData=data)
    _raise(NVML_ERROR_TIMEOUT)
    raise AssertionError("unreachable")


def nvmlEventSetWait(eventSet: Any, timeoutms: int) -> c_nvmlEventData_t:
    return nvmlEventSetWait_v2(eventSet, timeoutms)


def nvmlEventSetFree(eventSet: Any) -> None:
    _check_init()
    eventSet.freed = True
