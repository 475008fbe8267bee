#!/usr/bin/env python3
"""gpu-proof step 6: the agent's own delivery of a HAMi-core slice, on this host's driver.

The whole agent (the NVML backend of this machine's GPUs, a hami-core pool, its
device-plugin gRPC servers on unix sockets) is asked for slices by a kubelet-side stub;
each Allocate response is applied to a workload process as a container runtime would
(its mounts in a private mount namespace, /etc/ld.so.preload among them, then its env:
tests/enforcement/runtime.py) and the workload allocates until refused. Prints one JSON
record per case (the format hack/gpu-proof.sh's report reads). Root only.

    python3 hack/gpu-delivery.py --libvgpu L --workload W [--spin N --launch-seconds S]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from gpu_share.devices.factory import create_backend
from tests.agent.served_agent import rig_with
from tests.enforcement import runtime
from tests.enforcement.slices import Node, hami_sections

STEP = "delivery"
UNIT_MIB = 1024
SHOWN_ENV = ("CUDA_", "NVIDIA_", "GPU_SHARE_")


def emit(case: str, **fields: Any) -> None:
    print(json.dumps({"step": STEP, "case": case, **fields}), flush=True)


def run_case(case: str, resp: Any, image: runtime.HostImage, argv: list[str], **kw: Any) -> None:
    t0 = time.monotonic()
    try:
        r = runtime.run(resp, image, [image.workload, *argv], timeout_s=90, **kw)
    except AssertionError as exc:  # the runtime's own report: no JSON, or over time
        emit(case, rc=None, error=str(exc)[-3000:], seconds=round(time.monotonic() - t0, 3))
        return
    emit(case, rc=r.rc, result=r.out, argv=argv, env=kw.get("env") or {},
         mounts=kw.get("mounts", True), seconds=round(time.monotonic() - t0, 3),
         stderr_tail=r.stderr[-1500:])


def shown(resp: Any) -> dict[str, Any]:
    return {
        "env": {k: v for k, v in sorted(resp.envs.items()) if k.startswith(SHOWN_ENV)},
        "mounts": [f"{m.host_path} -> {m.container_path}{' (ro)' if m.read_only else ''}"
                   for m in resp.mounts],
    }


def prove(args: argparse.Namespace) -> None:
    image = runtime.HostImage(args.workload)
    memory = ["--chunk-mib", "256", "--target-mib", "8192"]
    speed = ["--chunk-mib", "64", "--target-mib", "64", "--launch-seconds",
             str(args.launch_seconds), "--spin", str(args.spin)]
    with tempfile.TemporaryDirectory(prefix="gpu-delivery-") as tmp:
        lib = Path(args.libvgpu).resolve()
        sections: dict[str, Any] = {"backend": "nvml",
                                    **hami_sections(lib, Path(tmp), UNIT_MIB)}
        with rig_with(sections, backend_factory=create_backend) as rig:
            assert rig.agent is not None
            devs = rig.agent.backend.devices()
            emit("agent", devices=[f"{d.uuid} {d.memory_mib} MiB" for d in devs],
                 resources=sorted(rig.clients), unit_mib=UNIT_MIB)
            node = Node(rig, image)
            a = node.slice("a", 4, 30)
            emit("slice-a", units=4, cores=30, **shown(a))
            run_case("a-memory", a, image, memory)
            run_case("a-tenant-override", a, image, memory,
                     env={"LD_PRELOAD": "", "CUDA_DEVICE_MEMORY_LIMIT_0": "16g"})
            run_case("a-env-only", a, image, memory, mounts=False)
            b = node.slice("b", 2)
            emit("slice-b", units=2, cores=0, **shown(b))
            run_case("b-memory", b, image, memory)
            run_case("a-speed", a, image, speed)
            run_case("a-speed-env-only", a, image, speed, mounts=False)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--libvgpu", required=True)
    p.add_argument("--workload", required=True)
    p.add_argument("--spin", type=int, default=4000)
    p.add_argument("--launch-seconds", type=float, default=6.0)
    args = p.parse_args()
    try:
        prove(args)
    except Exception as exc:  # the report says what broke; the proof goes on
        emit("error", error=f"{type(exc).__name__}: {exc}",
             traceback=traceback.format_exc()[-3000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
