"""``gpu-share``: the admin CLI.

    gpu-share probe URL                 exit 0 when URL answers 200 (helm test, probes)
    gpu-share config validate FILE      check a v1 config file; print errors naming keys
    gpu-share config show [FILE]        print the effective config (defaults filled in)
    gpu-share fault set FILE ID...      mark dummy devices unhealthy (fault file)
    gpu-share fault clear FILE          clear every dummy fault
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

from gpu_share.config.loader import dump_config, read_config_file, validate_config
from gpu_share.config.model import AgentConfig
from gpu_share.devices.dummy import write_faults
from gpu_share.errors import GpuShareError


def _probe(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read(200).decode(errors="replace").strip()
            print(f"{resp.status} {body}")
            return 0 if resp.status == 200 else 1
    except urllib.error.HTTPError as exc:
        print(f"{exc.code} {exc.reason}", file=sys.stderr)
    except (urllib.error.URLError, OSError) as exc:
        print(f"unreachable: {exc}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-share", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe", help="GET a URL; exit 0 on HTTP 200")
    p.add_argument("url")
    p.add_argument("--timeout", type=float, default=5.0)
    c = sub.add_parser("config", help="validate or show a config file")
    csub = c.add_subparsers(dest="config_cmd", required=True)
    cv = csub.add_parser("validate")
    cv.add_argument("file")
    cs = csub.add_parser("show")
    cs.add_argument("file", nargs="?")
    f = sub.add_parser("fault", help="inject or clear dummy-backend device faults")
    fsub = f.add_subparsers(dest="fault_cmd", required=True)
    fs = fsub.add_parser("set")
    fs.add_argument("file")
    fs.add_argument("ids", nargs="+", help="device uuids or indexes")
    fc = fsub.add_parser("clear")
    fc.add_argument("file")
    args = parser.parse_args(argv)

    try:
        if args.cmd == "probe":
            return _probe(args.url, args.timeout)
        if args.cmd == "config":
            cfg = validate_config(read_config_file(args.file)) if args.file else AgentConfig()
            if args.config_cmd == "validate":
                print(f"{args.file}: valid (version {cfg.version})")
                return 0
            print(dump_config(cfg), end="")
            return 0
        if args.cmd == "fault":
            write_faults(args.file, args.ids if args.fault_cmd == "set" else [])
            return 0
    except GpuShareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
