"""Every env name HAMi-core's source reads (getenv, at the pinned version) is reserved by
the chart's workloads policy, except those that change no limit: a pod setting one
would replace what the agent hands out or lift the limit behind HAMi-core's back (e.g.
CUDA_REDIRECT, which loads the real driver past the hooks)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.chart.conftest import helm_path, render
from tests.chart.test_security import _policy, _reserved
from tests.enforcement.conftest import Built

# Read by HAMi-core but changing no limit.
HARMLESS = {"LIBCUDA_LOG_LEVEL"}


def _getenv_names(src: Path) -> set[str]:
    text = "\n".join(p.read_text(errors="replace") for p in src.rglob("*.[ch]"))
    defines = dict(re.findall(r'#define\s+(\w+)\s+"([A-Z][A-Z0-9_]+)"', text))
    names = set()
    for arg in re.findall(r"getenv\(\s*([^)]+?)\s*\)", text):
        if arg.startswith('"'):
            names.add(arg.strip('"'))
        elif arg in defines:
            names.add(defines[arg])
    # Names built at run time ("%s_%d" of a define): the define as a prefix.
    for base in re.findall(r'snprintf\([^;]*"%s_%d",\s*(\w+)', text):
        names.add(defines.get(base, base) + "_")
    return names


def test_every_limit_knob_hami_core_reads_is_reserved(built: Built) -> None:
    src = next(built.libvgpu.parent.glob("src/*/src"))
    read = _getenv_names(src)
    assert {"CUDA_REDIRECT", "GPU_CORE_UTILIZATION_POLICY", "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "CUDA_DEVICE_MEMORY_LIMIT_"} <= read, read  # the scan itself works
    names, prefixes = _reserved(_policy(render(helm_path(4)), "-workloads"))
    open_ = {n for n in read - HARMLESS
             if n not in names and not any(n.startswith(p) for p in prefixes)}
    assert not open_, f"HAMi-core reads these and a pod could set them: {sorted(open_)}"
    assert "LD_AUDIT" in names and "LD_PRELOAD" in names  # the loader's own
