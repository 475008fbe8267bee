"""``gpu-share``: the admin CLI.

    gpu-share probe URL [--cert F --key F --ca F --server-name NAME]
                                        exit 0 when URL answers 200 (helm test, probes);
                                        with a client certificate for mutual-TLS listeners
    gpu-share config validate FILE [--devices N --device-memory-mib MIB]
                                        check a v1 config file as the agent would (with the
                                        node's devices: the dummy section, or N x MIB);
                                        print every error naming its key; exit 2 if invalid
    gpu-share config show [FILE]        print the effective config (defaults filled in)
    gpu-share fault set FILE ID...      mark dummy devices unhealthy (fault file)
    gpu-share fault clear FILE          clear every dummy fault
    gpu-share slices --node NODE        table of which container holds which device slice
    gpu-share install-hami-core --config FILE [--source DIR]
                                        put the image's HAMi-core on the node where the
                                        pool's config says (the chart's init container)
"""

from __future__ import annotations

import argparse
import http.client
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from gpu_share.config.loader import config_from_namespace, dump_config, flag_int
from gpu_share.config.model import AgentConfig, BackendKind
from gpu_share.devices.base import Device
from gpu_share.devices.dummy import DummyBackend, write_faults
from gpu_share.errors import ConfigError, GpuShareError

# Bounds of a device description (--devices, --device-memory-mib).
MAX_DESCRIBED_DEVICES = 1024
MAX_DESCRIBED_MEMORY_MIB = 16 * 1024 * 1024


def _probe_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS client of a probe of a mutual-TLS listener: its CA, our certificate, and the
    name its certificate carries when the URL's host (127.0.0.1) is not in it."""
    if not (args.cert or args.ca):
        return None
    ctx = ssl.create_default_context(cafile=args.ca)
    if args.cert:
        ctx.load_cert_chain(args.cert, args.key)
    return ctx


def _probe(url: str, timeout: float, ctx: ssl.SSLContext | None = None,
           server_name: str | None = None) -> int:
    handlers: list[urllib.request.BaseHandler] = []
    if ctx is not None:
        handlers.append(_NamedHTTPSHandler(ctx, server_name))
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=timeout) as resp:
            body = resp.read(200).decode(errors="replace").strip()
            print(f"{resp.status} {body}")
            return 0 if resp.status == 200 else 1
    except urllib.error.HTTPError as exc:
        print(f"{exc.code} {exc.reason}", file=sys.stderr)
    except (urllib.error.URLError, OSError) as exc:
        print(f"unreachable: {exc}", file=sys.stderr)
    return 1


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS whose server certificate must carry ``server_name`` (SNI and host name check)
    instead of the host connected to."""

    def __init__(self, *args: Any, server_name: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(  # type: ignore[attr-defined]
            self.sock, server_hostname=self.server_name
        )


class _NamedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, ctx: ssl.SSLContext, server_name: str | None) -> None:
        super().__init__(context=ctx)
        self._ctx, self._name = ctx, server_name

    def https_open(self, req: urllib.request.Request) -> Any:
        if not self._name:
            return super().https_open(req)
        return self.do_open(
            _NamedHTTPSConnection,  # type: ignore[arg-type]
            req,
            context=self._ctx,
            server_name=self._name,
        )


def _load(path: str | None) -> AgentConfig:
    # The agent's own loader (file layer only: validate judges the file, not this shell's
    # GPU_SHARE_* environment).
    ns = argparse.Namespace(**({"config": path} if path else {}))
    return config_from_namespace(ns, environ={})


def _node_devices(
    cfg: AgentConfig, count: int | None, memory_mib: int | None
) -> tuple[list[Device] | None, str]:
    """The devices to check against and how they were found (None: no description)."""
    if cfg.backend == BackendKind.DUMMY:
        if count is not None:
            # The agent would use the dummy section; a second description could only
            # reach another verdict.
            raise ConfigError(
                "backend dummy takes its devices from the dummy section; "
                "--devices/--device-memory-mib describe NVML devices"
            )
        devices = DummyBackend(cfg.dummy, node_name=cfg.node_name).devices()
        return devices, f"the dummy backend's {len(devices)} devices"
    if count is not None and memory_mib is not None:
        from gpu_share.plugin.sizeguard import described_devices

        return described_devices(count, memory_mib), f"{count} devices of {memory_mib} MiB"
    return None, ""


def _validate(path: str, count: int | None, memory_mib: int | None) -> int:
    cfg = _load(path)
    devices, described = _node_devices(cfg, count, memory_mib)
    if devices is None:
        print(
            f"{path}: valid (version {cfg.version}); NOT checked against devices (the "
            "ListAndWatch size limit and a device smaller than one memory unit): give "
            "--devices N --device-memory-mib MIB as nvidia-smi reports them"
        )
        return 0
    # Imported here: protobuf is only needed for the device checks.
    from gpu_share.plugin.sizeguard import guard_devices

    guard_devices(cfg, devices)
    print(f"{path}: valid (version {cfg.version}); checked against {described}")
    return 0


def _slices(node: str, kubeconfig: str | None, domain: str) -> int:
    # Imported lazily: the other subcommands need no API client.
    from gpu_share.config.model import ResourcesConfig
    from gpu_share.kube.pods import KubePodSource
    from gpu_share.kube.rest import make_rest_client
    from gpu_share.sharing.annotations import PodAssignment, assignment_key

    resources = ResourcesConfig(domain=domain)
    source = KubePodSource.from_config(make_rest_client(kubeconfig), resources)
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["install-hami-core"]:
        from gpu_share.cli.install_hami_core import main as install_main

        return install_main(argv[1:])
    parser = argparse.ArgumentParser(prog="gpu-share", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe", help="GET a URL; exit 0 on HTTP 200")
    p.add_argument("url")
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--cert", help="client certificate (PEM) for a mutual-TLS listener")
    p.add_argument("--key", help="its private key (PEM)")
    p.add_argument("--ca", help="CA bundle that signed the server's certificate")
    p.add_argument("--server-name", help="name the server's certificate must carry "
                   "(default: the URL's host)")
    c = sub.add_parser("config", help="validate or show a config file")
    csub = c.add_subparsers(dest="config_cmd", required=True)
    cv = csub.add_parser(
        "validate",
        help="check a config file as the agent would; exit 2 when invalid",
        description="Check FILE with the agent's own validation. The device checks "
        "(ListAndWatch size, a device smaller than one memory unit) use the dummy section "
        "for backend dummy, else --devices and --device-memory-mib; without them they are "
        "skipped and the output says so.",
    )
    cv.add_argument("file")
    cv.add_argument("--devices", type=flag_int, metavar="N", default=None,
                    help="devices on the node (NVML backend)")
    cv.add_argument("--device-memory-mib", type=flag_int, metavar="MIB", default=None,
                    help="memory of each device in MiB, as NVML reports it")
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
    if args.cmd == "config" and args.config_cmd == "validate":
        _check_description(parser, args.devices, args.device_memory_mib)

    try:
        if args.cmd == "probe":
            return _probe(args.url, args.timeout, _probe_context(args), args.server_name)
        if args.cmd == "config":
            if args.config_cmd == "validate":
                return _validate(args.file, args.devices, args.device_memory_mib)
            print(dump_config(_load(args.file)), end="")
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


def _check_description(
    parser: argparse.ArgumentParser, count: int | None, memory_mib: int | None
) -> None:
    # parser.error exits 2, like an invalid config.
    if (count is None) != (memory_mib is None):
        parser.error("--devices and --device-memory-mib go together")
    if count is not None and not 1 <= count <= MAX_DESCRIBED_DEVICES:
        parser.error(f"--devices must be 1..{MAX_DESCRIBED_DEVICES}")
    if memory_mib is not None and not 1 <= memory_mib <= MAX_DESCRIBED_MEMORY_MIB:
        parser.error(f"--device-memory-mib must be 1..{MAX_DESCRIBED_MEMORY_MIB}")


if __name__ == "__main__":
    sys.exit(main())
