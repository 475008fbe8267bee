"""HAMi-core's SM cap and memory limit as the agent hands them out, measured in front of
the stand-in driver (no GPU): kernel launches per second at CUDA_DEVICE_SM_LIMIT 30, 60,
100 and unset, next to the same workload without HAMi-core, and the MiB each memory
limit lets through. Prints a table; asserts nothing (figures depend on the machine).

    python -m bench.enforcement [--seconds 5] [--kernel-us 1000] [--json]

Builds (or reuses) HAMi-core and the stand-in with hack/build-enforcement.sh. The
stand-in's kernels keep its device busy --kernel-us each; HAMi-core's limiter reads the
utilisation the stand-in's NVML reports, as it reads a real GPU's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEVICE = "GPU-bench-0000-0000-0000-000000000000"


def build() -> tuple[Path, Path]:
    out = subprocess.run(["bash", str(REPO / "hack" / "build-enforcement.sh")],
                         capture_output=True, text=True, check=True, timeout=900).stdout
    got = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return Path(got["hami_core"]), Path(got["standin"])


def run(lib: Path | None, standin: Path, env: dict[str, str], argv: list[str],
        kernel_us: int, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gs-bench-") as d:
        full = {
            "PATH": "/usr/bin:/bin",
            "LD_LIBRARY_PATH": str(standin),
            "GPU_SHARE_STANDIN_DEVICES": f"{DEVICE}=16384",
            "GPU_SHARE_STANDIN_STATE_DIR": f"{d}/driver",
            "GPU_SHARE_STANDIN_KERNEL_US": str(kernel_us),
            "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{d}/vgpu.cache",
            **({"LD_PRELOAD": str(lib)} if lib else {}),
            **env,
        }
        proc = subprocess.run([str(standin / "gpu-workload"), *argv], env=full,
                              capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"gpu-workload failed (rc {proc.returncode}): {proc.stderr[-500:]}")
    doc: dict[str, Any] = json.loads(lines[-1])
    return doc


def measure(seconds: float, kernel_us: int) -> dict[str, Any]:
    lib, standin = build()
    launch = ["--chunk-mib", "256", "--target-mib", "256", "--launch-seconds", str(seconds)]
    rows: list[dict[str, Any]] = []
    cases: list[tuple[str, Path | None, dict[str, str]]] = [
        ("no HAMi-core", None, {}),
        ("HAMi-core, no SM limit (memory only)", lib, {"CUDA_DEVICE_MEMORY_LIMIT_0": "4096m"}),
    ]
    cases += [(f"HAMi-core, SM limit {p} %", lib,
               {"CUDA_DEVICE_MEMORY_LIMIT_0": "4096m", "CUDA_DEVICE_SM_LIMIT": str(p)})
              for p in (100, 60, 30)]
    for name, use, env in cases:
        r = run(use, standin, env, launch, kernel_us, seconds + 60)
        rows.append({"case": name, "launches_per_s": round(r["launches_per_s"], 1)})
    base = rows[0]["launches_per_s"] or 1.0
    for row in rows:
        row["vs_no_hami"] = round(row["launches_per_s"] / base, 3)
    memory = []
    for limit, chunk in ((4096, 256), (4096, 1024), (1024, 64)):
        r = run(lib, standin, {"CUDA_DEVICE_MEMORY_LIMIT_0": f"{limit}m"},
                ["--chunk-mib", str(chunk), "--max-chunks", "4096"], kernel_us, 60)
        memory.append({"limit_mib": limit, "chunk_mib": chunk,
                       "allocated_mib": r["allocated_mib"], "refused": r["refused_error"]})
    return {"seconds": seconds, "kernel_us": kernel_us, "sm": rows, "memory": memory}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="launch time per case")
    ap.add_argument("--kernel-us", type=int, default=1000, help="stand-in kernel duration")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = measure(args.seconds, args.kernel_us)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"SM cap, {args.seconds:g} s per case, stand-in kernels of {args.kernel_us} us")
    print(f"{'case':40} {'launches/s':>11} {'vs no HAMi-core':>16}")
    for row in res["sm"]:
        print(f"{row['case']:40} {row['launches_per_s']:>11.1f} {row['vs_no_hami']:>16.3f}")
    print("\nMemory limit (the allocation past it is refused)")
    print(f"{'limit MiB':>10} {'chunk MiB':>10} {'allocated MiB':>14}  refused with")
    for m in res["memory"]:
        print(f"{m['limit_mib']:>10} {m['chunk_mib']:>10} {m['allocated_mib']:>14}  "
              f"{m['refused']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
