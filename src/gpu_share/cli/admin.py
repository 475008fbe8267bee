"""``gpu-share``: the admin CLI.

    gpu-share probe URL                 exit 0 when URL answers 200 (helm test, probes)
    gpu-share config validate FILE      check a v1 config file; print errors naming keys
    gpu-share config show [FILE]        print the effective config (defaults filled in)
    gpu-share fault set FILE ID...      mark dummy devices unhealthy (fault file)
    gpu-share fault clear FILE          clear every dummy fault
    gpu-share slices --node NODE        table of which container holds which device slice
"""

from __future__ import annotations

import argparse
import os
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


def _slices(node: str, kubeconfig: str | None, domain: str) -> int:
    # Imported lazily: the other subcommands must not need the kubernetes client.
    from gpu_share.config.model import ResourcesConfig
    from gpu_share.kube.client import make_api_client
    from gpu_share.kube.pods import KubePodSource
    from gpu_share.sharing.annotations import PodAssignment, assignment_key

    resources = ResourcesConfig(domain=domain)
    source = KubePodSource.from_config(make_api_client(kubeconfig), resources)
    key = assignment_key(domain)
    rows = [("POD", "CONTAINER", "DEVICE", "MEMORY UNITS", "CORES %", "EXCLUSIVE", "SOURCE")]
    for pod in sorted(source.list_node_pods(node), key=lambda p: (p.namespace, p.name)):
        text = pod.annotations.get(key)
        if not text:
            continue
        doc = PodAssignment.decode(text)
        for cname, c in sorted(doc.containers.items()):
            for share in c.devices:
                rows.append((f"{pod.namespace}/{pod.name}", cname, share.device,
                             str(share.memory_units), str(share.cores),
                             "yes" if share.exclusive else "no", c.source))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return 0


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
    sl = sub.add_parser("slices", help="print the device slice of every container on a node")
    sl.add_argument("--node", default=os.environ.get("NODE_NAME", ""), required=False)
    sl.add_argument("--kubeconfig", default=None)
    sl.add_argument("--domain", default="vendor.com")
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
        if args.cmd == "slices":
            if not args.node:
                parser.error("slices needs --node (or NODE_NAME)")
            return _slices(args.node, args.kubeconfig, args.domain)
        if args.cmd == "fault":
            write_faults(args.file, args.ids if args.fault_cmd == "set" else [])
            return 0
    except GpuShareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
