"""The region the agent seeds (sharing/node/hami_region.py) is HAMi-core's own: its layout is
the pinned header's (compiled here against it), and its fields are those HAMi-core writes
when it creates the file itself from the same limits."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from gpu_share.sharing.node import hami_region
from tests.enforcement.conftest import Built

_LAYOUT_C = r"""
#include <stdio.h>
#include <stddef.h>
#include "multiprocess/multiprocess_memory_limit.h"
#define OFF(f) printf(#f " %zu\n", offsetof(shared_region_t, f))
int main(void) {
  printf("size %zu\n", sizeof(shared_region_t));
  printf("slot %zu\n", sizeof(shrreg_proc_slot_t));
  OFF(initialized_flag); OFF(major_version); OFF(owner_pid); OFF(sem); OFF(device_num);
  OFF(uuids); OFF(limit); OFF(sm_limit); OFF(procs); OFF(proc_num);
  OFF(utilization_switch); OFF(recent_kernel); OFF(priority); OFF(last_kernel_time);
  OFF(sem_postinit);
  printf("magic %d\n", MULTIPROCESS_SHARED_REGION_MAGIC_FLAG);
  printf("version %d.%d\n", MAJOR_VERSION, MINOR_VERSION);
  return 0;
}
"""


def _hami_paths(built: Built) -> tuple[Path, Path, Path]:
    """(HAMi-core's src/, its generated config/, the CUDA headers) of the cached build."""
    root = built.libvgpu.parent
    src = next(root.glob("src/*/src"))
    headers = next(root.parent.glob("headers-*/include"))
    return src, root / "config", headers


def test_the_layout_is_the_pinned_headers(built: Built, tmp_path: Path) -> None:
    src, config, headers = _hami_paths(built)
    (tmp_path / "layout.c").write_text(_LAYOUT_C)
    subprocess.run(
        ["gcc", "-D_GNU_SOURCE", f"-I{headers}", f"-I{src}", f"-I{config}",
         str(tmp_path / "layout.c"), "-o", str(tmp_path / "layout")],
        check=True, capture_output=True, timeout=120,
    )
    out = subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True,
                         text=True, timeout=30).stdout
    c = dict(line.split(" ", 1) for line in out.splitlines())
    r = hami_region.Region
    assert int(c["size"]) == ctypes.sizeof(r)
    assert int(c["slot"]) == ctypes.sizeof(hami_region._Slot)
    for name, value in c.items():
        if name not in {"size", "slot", "magic", "version"}:
            assert int(value) == getattr(r, name).offset, name
    assert int(c["magic"]) == hami_region.MAGIC
    assert c["version"] == ".".join(map(str, hami_region.FORMAT))


def test_the_seed_says_what_hami_core_writes_itself(built: Built, tmp_path: Path) -> None:
    cache = tmp_path / "own.cache"
    env = {
        "PATH": "/usr/bin:/bin",
        "LD_LIBRARY_PATH": str(built.standin),
        "LD_PRELOAD": str(built.libvgpu),
        "GPU_SHARE_STANDIN_DEVICES": "GPU-a=16384;GPU-b=16384",
        "GPU_SHARE_STANDIN_STATE_DIR": str(tmp_path / "driver"),
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache),
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3072m",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "1024m",
        "CUDA_DEVICE_SM_LIMIT": "30",
    }
    proc = subprocess.run([built.workload, "--chunk-mib", "512", "--target-mib", "512"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    own = hami_region.Region.from_buffer_copy(cache.read_bytes()[: ctypes.sizeof(
        hami_region.Region)])
    seeded = hami_region.Region.from_buffer_copy(
        hami_region.region_bytes([3072, 1024], 30)[: ctypes.sizeof(hami_region.Region)])
    for field in ("initialized_flag", "major_version", "minor_version", "utilization_switch",
                  "priority"):
        assert getattr(own, field) == getattr(seeded, field), field
    assert list(own.limit) == list(seeded.limit)
    assert list(own.sm_limit) == list(seeded.sm_limit)
    for sem in ("sem", "sem_postinit"):  # free again after the run: as sem_init left it
        assert bytes(getattr(own, sem)) == bytes(getattr(seeded, sem)), sem
    assert cache.stat().st_size == hami_region.FILE_SIZE
