"""``gpu-share-extender``: the kube-scheduler HTTP extender (filter, prioritize, bind)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from gpu_share.extender.core import Extender, ExtenderSettings
from gpu_share.extender.http import make_server
from gpu_share.extender.ports import ClusterView
from gpu_share.kube.client import make_api_client
from gpu_share.kube.cluster_view import KubeBinder, KubeClusterView
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import (
    ClusterPolicy,
    ClusterPolicyName,
    Shape,
    Workload,
    make_policy,
)

log = logging.getLogger("gpu_share.extender")


def parse_workload(text: str) -> Workload:
    """``memoryUnits:cores[:weight],...`` -> Workload."""
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        f = part.split(":")
        shapes.append(Shape(int(f[0]), int(f[1]), float(f[2]) if len(f) > 2 else 1.0))
    return Workload(shapes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu-share-extender")
    env = os.environ.get
    ap.add_argument("--listen", default=env("GPU_SHARE_EXTENDER_LISTEN", "0.0.0.0:8888"))
    ap.add_argument("--domain", default=env("GPU_SHARE_DOMAIN", "vendor.com"))
    ap.add_argument("--memory-name", default=env("GPU_SHARE_MEMORY_NAME", "vcuda-memory"))
    ap.add_argument("--core-name", default=env("GPU_SHARE_CORE_NAME", "vcuda-core"))
    ap.add_argument(
        "--key-file", default=env("GPU_SHARE_DECISION_KEY_FILE", "/etc/gpu-share-decision/key")
    )
    ap.add_argument(
        "--policy",
        default=env("GPU_SHARE_CLUSTER_POLICY", "fgd"),
        choices=[p.value for p in ClusterPolicyName],
    )
    ap.add_argument(
        "--default-workload",
        default=env("GPU_SHARE_DEFAULT_WORKLOAD", "4:25,8:50,16:100"),
        help="memoryUnits:cores[:weight],... used until pods are seen",
    )
    ap.add_argument("--kubeconfig", default=env("KUBECONFIG"))
    ap.add_argument("--log-level", default=env("GPU_SHARE_LOG_LEVEL", "info"))
    a = ap.parse_args(argv)
    logging.basicConfig(
        level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    key = Path(a.key_file).read_bytes().strip()
    if len(key) < 16:
        print(f"decision key {a.key_file} is shorter than 16 bytes", file=sys.stderr)
        return 2
    api = make_api_client(a.kubeconfig)
    names = ResourceNames(f"{a.domain}/{a.memory_name}", f"{a.domain}/{a.core_name}")
    view = KubeClusterView(
        api,
        domain=a.domain,
        memory_resource=names.memory,
        core_resource=names.core,
        default_workload=parse_workload(a.default_workload),
    )
    view.start()
    if not view.wait_synced(60):
        log.warning("cluster view not synced after 60 s; serving anyway")

    cache: dict[str, tuple[Workload | None, ClusterPolicy]] = {}

    def policy(v: ClusterView) -> ClusterPolicy:
        # One policy per workload object, so its memo survives between requests.
        w = v.workload() if a.policy == "fgd" else None
        got = cache.get("p")
        if got is None or got[0] is not w:
            got = (w, make_policy(a.policy, w))
            cache["p"] = got
        return got[1]

    ext = Extender(ExtenderSettings(names, a.domain, key), view, KubeBinder(api), policy)
    host, _, port = a.listen.rpartition(":")
    server = make_server(ext, host or "0.0.0.0", int(port))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log.info("serving on %s (policy %s)", a.listen, a.policy)
    stop.wait()
    server.shutdown()
    view.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
