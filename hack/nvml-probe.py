#!/usr/bin/env python3
"""Run the NVML backend against the real GPUs of this machine and print what it sees.

Prints one JSON document (driver notes, devices, naming), then polls health for
--seconds and prints each HealthEvent as a JSON line. Exit 1 if NVML cannot start.

    python hack/nvml-probe.py --seconds 10
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from gpu_share.config.model import HealthConfig
from gpu_share.devices.nvml import NvmlBackend
from gpu_share.errors import DeviceBackendError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to poll health")
    parser.add_argument("--poll", type=float, default=1.0, help="poll_health timeout")
    parser.add_argument("--quiet-seconds", type=float, default=300.0)
    args = parser.parse_args(argv)

    backend = NvmlBackend(HealthConfig(recovery_quiet_seconds=args.quiet_seconds))
    try:
        backend.start()
    except DeviceBackendError as exc:
        print(json.dumps({"error": exc.message, "reason": exc.reason}), file=sys.stderr)
        return 1
    try:
        report = {
            "devices": [dataclasses.asdict(d) for d in backend.devices()],
            "naming": dataclasses.asdict(backend.naming()),
            "notes": backend.notes,
        }
        print(json.dumps(report, indent=2))
        deadline = time.monotonic() + args.seconds
        for _ in range(100_000):  # bounded; the deadline ends it first
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for event in backend.poll_health(min(args.poll, left)):
                print(json.dumps(dataclasses.asdict(event)), flush=True)
        print(json.dumps({"health": backend.health_detail()}))
    finally:
        backend.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
