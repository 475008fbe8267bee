"""HAMi-core's shared region: the per-container cache file whose first writer fixes the
limits for every later process of the container.

HAMi-core (``multiprocess_memory_limit.c``, ``try_create_shrreg``) maps the file named by
``CUDA_DEVICE_MEMORY_SHARED_CACHE``; when the region's magic flag is not set yet, the
process creating it writes the limits from *its own* env. A workload whose entrypoint
rewrote or unset the limit env would then set its own limits. The agent therefore writes
the region itself at Allocate (``region_bytes``), laid out as HAMi-core's
``shared_region_t`` at the pinned version (format 1.2, x86_64, glibc), with the slice's
limits: every later process finds the flag set and uses the file's limits.

Pure: bytes in, bytes out. The layout is checked against HAMi-core's own header and
against a region HAMi-core wrote itself (tests/enforcement).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAGIC = 19920718  # MULTIPROCESS_SHARED_REGION_MAGIC_FLAG
FORMAT = (1, 2)  # MAJOR_VERSION, MINOR_VERSION of the pinned source
MAX_DEVICES = 16  # CUDA_DEVICE_MAX_COUNT
MAX_PROCS = 1024  # SHARED_REGION_MAX_PROCESS_NUM
NO_SM_LIMIT = 100  # what HAMi-core stores when no SM limit is set
CACHE_FILE = "gpu-share.cache"  # in the container's cache dir

_u64, _i32, _u32 = ctypes.c_uint64, ctypes.c_int32, ctypes.c_uint32


class _Sem(ctypes.Structure):
    # glibc's sem_t on x86_64 (32 bytes): sem_init(pshared=1, value=1) writes
    # data=1 and private=128 and leaves the rest.
    _fields_ = [("data", _u64), ("private", _i32), ("rest", ctypes.c_byte * 20)]


class _DeviceMemory(ctypes.Structure):
    _fields_ = [(n, _u64) for n in ("context", "module", "data", "offset", "total")] + [
        ("unused", _u64 * 3)
    ]


class _DeviceUtil(ctypes.Structure):
    _fields_ = [("dec", _u64), ("enc", _u64), ("sm", _u64), ("unused", _u64 * 3)]


class _Slot(ctypes.Structure):
    _fields_ = [
        ("pid", _i32),
        ("hostpid", _i32),
        ("used", _DeviceMemory * MAX_DEVICES),
        ("monitorused", _u64 * MAX_DEVICES),
        ("device_util", _DeviceUtil * MAX_DEVICES),
        ("status", _i32),
        ("seqlock", _u64),
        ("unused", _u64 * 2),
    ]


class Region(ctypes.Structure):
    _fields_ = [
        ("initialized_flag", _i32),
        ("major_version", _u32),
        ("minor_version", _u32),
        ("sm_init_flag", _i32),
        ("owner_pid", ctypes.c_size_t),
        ("sem", _Sem),
        ("device_num", _u64),
        ("uuids", (ctypes.c_char * 96) * MAX_DEVICES),
        ("limit", _u64 * MAX_DEVICES),
        ("sm_limit", _u64 * MAX_DEVICES),
        ("procs", _Slot * MAX_PROCS),
        ("proc_num", ctypes.c_int),
        ("utilization_switch", ctypes.c_int),
        ("recent_kernel", ctypes.c_int),
        ("priority", ctypes.c_int),
        ("last_kernel_time", _u64),
        ("sem_postinit", _Sem),
    ]


# HAMi-core sizes the file to sizeof(shared_region_t) + 1 (it writes one byte there).
FILE_SIZE = ctypes.sizeof(Region) + 1


@dataclass(frozen=True)
class RegionLimits:
    memory_bytes: tuple[int, ...]  # per CUDA ordinal of the container; 0 = none
    sm_percent: tuple[int, ...]


def region_bytes(memory_mib: Sequence[int], sm_percent: int | None) -> bytes:
    """The file HAMi-core itself would create for the env ``CUDA_DEVICE_MEMORY_LIMIT_<i>=
    <memory_mib[i]>m`` (+ ``CUDA_DEVICE_SM_LIMIT=<sm_percent>``)."""
    return bytes(_region(memory_mib, sm_percent)) + b"\0"


def region_parts(memory_mib: Sequence[int], sm_percent: int | None
                 ) -> tuple[tuple[int, bytes], ...]:
    """``region_bytes`` as (offset, bytes) of its non-zero parts (the header before the
    process slots, the fields after them, about 2 KiB); the rest of its ``FILE_SIZE``
    is zeros: written as a sparse file, a seed costs no 2 MiB write on the Allocate."""
    view = memoryview(_region(memory_mib, sm_percent)).cast("B")
    tail = Region.proc_num.offset
    return ((0, bytes(view[: Region.procs.offset])), (tail, bytes(view[tail:])))


def _region(memory_mib: Sequence[int], sm_percent: int | None) -> Region:
    if len(memory_mib) > MAX_DEVICES:
        raise ValueError(f"HAMi-core holds at most {MAX_DEVICES} devices")
    r = Region()
    r.initialized_flag = MAGIC
    r.major_version, r.minor_version = FORMAT
    for i, mib in enumerate(memory_mib):
        r.limit[i] = mib * 1024 * 1024
    sm = sm_percent if sm_percent and 0 < sm_percent < NO_SM_LIMIT else NO_SM_LIMIT
    for i in range(MAX_DEVICES):
        r.sm_limit[i] = sm
    for sem in (r.sem, r.sem_postinit):
        sem.data, sem.private = 1, 128
    r.utilization_switch = 1
    r.recent_kernel = 2
    r.priority = 1
    return r


def read_limits(data: bytes) -> RegionLimits | None:
    """The limits of a region file, or None when it is not an initialised region of
    this format."""
    if len(data) < ctypes.sizeof(Region):
        return None
    r = Region.from_buffer_copy(data[: ctypes.sizeof(Region)])
    if r.initialized_flag != MAGIC or (r.major_version, r.minor_version) != FORMAT:
        return None
    return RegionLimits(tuple(r.limit), tuple(r.sm_limit))


_MEM_ENV = re.compile(r"CUDA_DEVICE_MEMORY_LIMIT_([0-9]{1,2})")
_MIB = re.compile(r"([1-9][0-9]{0,9})m")


def limits_from_env(envs: Mapping[str, str]) -> tuple[list[int], int | None]:
    """The slice's limits from the env the agent's response carries (``<MiB>m`` per
    ordinal, the SM percent): the seed must say exactly what the env says. A value in
    another form raises ValueError (a seed of 0 would mean no limit)."""
    mem: dict[int, int] = {}
    for key, value in envs.items():
        if k := _MEM_ENV.fullmatch(key):
            if not (v := _MIB.fullmatch(value)):
                raise ValueError(f"{key}={value[:40]!r} is not a limit the agent writes")
            mem[int(k.group(1))] = int(v.group(1))
    ordered = [mem.get(i, 0) for i in range(max(mem, default=-1) + 1)]
    sm = envs.get("CUDA_DEVICE_SM_LIMIT")
    if sm is not None and not (sm.isascii() and sm.isdigit() and len(sm) <= 3):
        raise ValueError(f"CUDA_DEVICE_SM_LIMIT={sm[:40]!r} is not a percentage")
    return ordered, int(sm) if sm is not None else None
