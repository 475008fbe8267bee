"""``gpu-share-extender``: the kube-scheduler HTTP extender (filter, prioritize, bind)."""

from __future__ import annotations

import argparse
import gc
import ipaddress
import logging
import os
import signal
import ssl
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from gpu_share.cli.server_flags import add_server_flags, server_limits
from gpu_share.config.model import DEFAULT_DRA_DRIVER, ResourcesConfig
from gpu_share.errors import UsageError
from gpu_share.extender.core import Extender, ExtenderSettings
from gpu_share.extender.http import EXTENDER_LIMITS, make_server
from gpu_share.extender.ports import ClusterView
from gpu_share.kube.binder import KubeBinder
from gpu_share.kube.cluster_view import KubeClusterView
from gpu_share.kube.resourceclaims import KubeClaimReader
from gpu_share.kube.rest import make_rest_client
from gpu_share.observability.http import (
    BoundedServer,
    HttpHandle,
    ServerLimits,
    server_tls_context,
    start_http,
)
from gpu_share.observability.metrics import ExtenderMetrics
from gpu_share.sharing.decision import PREVIOUS_KEY_FILE
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import (
    ClusterPolicy,
    ClusterPolicyName,
    Shape,
    Workload,
    make_policy,
)
from gpu_share.sharing.placement.pod_models import DEFAULT_MODEL_LABEL

log = logging.getLogger("gpu_share.extender")


def parse_workload(text: str) -> Workload:
    """``memoryUnits:cores[:weight],...`` -> Workload."""
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        f = part.split(":")
        shapes.append(Shape(int(f[0]), int(f[1]), float(f[2]) if len(f) > 2 else 1.0))
    return Workload(shapes)


@dataclass(frozen=True)
class Serving:
    host: str
    port: int
    limits: ServerLimits
    tls: ssl.SSLContext | None
    mutual_tls: bool


def split_listen(listen: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (all interfaces) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--listen {listen!r}: expected host:port")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "0.0.0.0", int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def serving(a: argparse.Namespace) -> Serving:
    """What to listen on and how, or UsageError: off loopback the extender requires
    mutual TLS, since whoever can call /bind chooses where any pending pod runs."""
    host, port = split_listen(a.listen)
    cert, key, ca = a.tls_cert_file, a.tls_key_file, a.client_ca_file
    if bool(cert) != bool(key):
        raise UsageError("--tls-cert-file and --tls-key-file go together")
    if ca and not cert:
        raise UsageError("--client-ca-file needs --tls-cert-file and --tls-key-file")
    mutual = bool(cert and key and ca)
    if not is_loopback(host) and not mutual and not a.insecure_allow_unauthenticated:
        raise UsageError(
            f"refusing to listen on {a.listen} without mutual TLS: whoever reaches it can "
            "bind any pending pod. Listen on 127.0.0.1 (sidecar of the scheduler), or set "
            "--tls-cert-file, --tls-key-file and --client-ca-file; "
            "--insecure-allow-unauthenticated is for test clusters only"
        )
    limits = server_limits(a, EXTENDER_LIMITS)
    try:
        ctx = server_tls_context(cert, key, ca or None) if cert else None
    except (OSError, ssl.SSLError) as e:
        raise UsageError(f"cannot load the TLS files: {e}") from None
    return Serving(host, port, limits, ctx, mutual)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range (0-65535)")
    return port


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu-share-extender")
    env = os.environ.get
    ap.add_argument(
        "--listen",
        default=env("GPU_SHARE_EXTENDER_LISTEN", "127.0.0.1:8888"),
        help="host:port; off loopback, mutual TLS is required (docs/extender.md)",
    )
    ap.add_argument("--tls-cert-file", default=env("GPU_SHARE_EXTENDER_TLS_CERT_FILE"))
    ap.add_argument("--tls-key-file", default=env("GPU_SHARE_EXTENDER_TLS_KEY_FILE"))
    ap.add_argument(
        "--client-ca-file",
        default=env("GPU_SHARE_EXTENDER_CLIENT_CA_FILE"),
        help="require a client certificate signed by this CA (mutual TLS)",
    )
    ap.add_argument(
        "--insecure-allow-unauthenticated",
        action="store_true",
        help="serve plain HTTP off loopback (test clusters only)",
    )
    add_server_flags(ap, "GPU_SHARE_EXTENDER", EXTENDER_LIMITS)
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
    ap.add_argument(
        "--model-label",
        default=env("GPU_SHARE_MODEL_LABEL", DEFAULT_MODEL_LABEL),
        help="node label naming the GPU model (nodeSelector/affinity on it restrict models)",
    )
    ap.add_argument(
        "--dra-driver",
        default=env("GPU_SHARE_DRA_DRIVER", DEFAULT_DRA_DRIVER),
        help="DRA pods: the driver whose claim results are gpu-share devices (read at bind)",
    )
    ap.add_argument(
        "--metrics-port",
        type=_port,
        default=env("GPU_SHARE_EXTENDER_METRICS_PORT", "0"),
        help="serve GET /metrics (and /healthz) on a separate plain-HTTP, read-only "
        "listener; 0 = off",
    )
    ap.add_argument(
        "--metrics-bind",
        default=env("GPU_SHARE_EXTENDER_METRICS_BIND", "0.0.0.0"),
        help="address of the metrics listener",
    )
    ap.add_argument("--kubeconfig", default=env("KUBECONFIG"))
    ap.add_argument("--log-level", default=env("GPU_SHARE_LOG_LEVEL", "info"))
    return ap.parse_args(argv)


def _view_alive(view: KubeClusterView) -> bool:
    """The cluster view's watch loops beat (raises naming a stalled one)."""
    loops = getattr(view, "loops", None)  # set by view.start()
    return True if loops is None else bool(loops.check())


def _names_and_key(a: argparse.Namespace) -> tuple[ResourceNames, bytes]:
    """The resource names (the agent's rules: one validation path) and the decision
    key, or UsageError with the line to print."""
    try:
        ResourcesConfig(domain=a.domain, memory_name=a.memory_name, core_name=a.core_name)
    except ValidationError as e:
        why = "; ".join(str(err["msg"]) for err in e.errors())
        raise UsageError(f"gpu-share-extender: invalid resource names: {why}"[:500]) from None
    key = Path(a.key_file).read_bytes().strip()
    if len(key) < 16:
        raise UsageError(f"decision key {a.key_file} is shorter than 16 bytes")
    return ResourceNames(f"{a.domain}/{a.memory_name}", f"{a.domain}/{a.core_name}"), key


def _policy_factory(name: str) -> Callable[[ClusterView], ClusterPolicy]:
    cache: dict[str, tuple[Workload | None, ClusterPolicy]] = {}

    def policy(v: ClusterView) -> ClusterPolicy:
        # One policy per workload object, so its memo survives between requests.
        w = v.workload() if name == "fgd" else None
        got = cache.get("p")
        if got is None or got[0] is not w:
            got = (w, make_policy(name, w))
            cache["p"] = got
        return got[1]

    return policy


def _previous_keys(key_file: str) -> tuple[bytes, ...]:
    """The key before the last rotation (``previous`` beside the key file), if any."""
    try:
        key = (Path(key_file).parent / PREVIOUS_KEY_FILE).read_bytes().strip()
    except OSError:
        return ()
    return (key,) if len(key) >= 16 else ()


def _extender(
    a: argparse.Namespace, names: ResourceNames, key: bytes, metrics: ExtenderMetrics,
    workers: int,
) -> tuple[KubeClusterView, Extender]:
    # Failed connects are retried twice: a scheduling cycle tolerates a short pause
    # better than a failed filter.
    api = make_rest_client(a.kubeconfig)
    api.connect_retries = 2
    # Every HTTP worker may be binding (two writes) at once: keep a connection for each.
    api.max_idle = workers
    view = KubeClusterView(
        api,
        domain=a.domain,
        memory_resource=names.memory,
        core_resource=names.core,
        default_workload=parse_workload(a.default_workload),
        decision_key=key,  # pod annotations count only when signed with it
        previous_keys=_previous_keys(a.key_file),  # ... or with the one before a rotation
        model_label=a.model_label,
        on_untrusted=metrics.observe_untrusted,
    )
    metrics.registry.collectors.append(lambda: metrics.set_view(*view.stats()))
    settings = ExtenderSettings(names, a.domain, key, model_label=a.model_label,
                                dra_driver=a.dra_driver)
    ext = Extender(
        settings, view, KubeBinder(api), _policy_factory(a.policy), on_bind=metrics.observe_bind,
        claims=KubeClaimReader(api),
    )
    return view, ext


def _mode(plan: Serving) -> str:
    if plan.mutual_tls:
        return "https, client certificate required"
    if plan.tls is not None:
        return "https without client certificates"
    return "plain http"


def quiet_collector() -> None:
    """Keep CPython's full collections out of the request path: the view's first listing
    (thousands of long-lived objects) goes to the permanent generation, and collections
    start after 50,000 allocations instead of 700. Offline at 5,000 nodes, full
    collections of 35-104 ms were most of filter's p99; short-lived garbage is freed by
    reference counting, so the larger threshold holds little more memory."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 10)


def _serve(
    a: argparse.Namespace,
    plan: Serving,
    server: BoundedServer,
    view: KubeClusterView,
    metrics_http: HttpHandle | None = None,
) -> int:
    """Sync the view, serve until SIGTERM/SIGINT, then shut down."""
    view.start()
    if not view.wait_synced(60):
        log.warning("cluster view not synced after 60 s; serving anyway")
    quiet_collector()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    if not is_loopback(plan.host) and not plan.mutual_tls:
        log.warning("serving off loopback WITHOUT client authentication "
                    "(--insecure-allow-unauthenticated): for test clusters only")
    log.info("serving on %s (%s, policy %s)", a.listen, _mode(plan), a.policy)
    stop.wait()
    server.shutdown()
    server.server_close()
    if metrics_http is not None:
        metrics_http.stop()
    view.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        plan = serving(a)
    except UsageError as e:
        print(f"gpu-share-extender: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        names, key = _names_and_key(a)
    except UsageError as e:
        print(str(e), file=sys.stderr)
        return 2
    metrics = ExtenderMetrics()
    view, ext = _extender(a, names, key, metrics, plan.limits.workers)
    try:  # bound before the (slow) sync: a taken port fails fast
        server = make_server(
            ext, plan.host, plan.port, limits=plan.limits, ssl_context=plan.tls,
            liveness=lambda: _view_alive(view), metrics=metrics,
        )
    except OSError as e:
        print(f"gpu-share-extender: cannot listen on {a.listen}: {e}", file=sys.stderr)
        return 1
    try:
        metrics_http = _metrics_listener(a, metrics, view)
    except OSError as e:
        server.server_close()
        print(f"gpu-share-extender: cannot serve metrics on {a.metrics_bind}:"
              f"{a.metrics_port}: {e}", file=sys.stderr)
        return 1
    return _serve(a, plan, server, view, metrics_http)


def _metrics_listener(
    a: argparse.Namespace, metrics: ExtenderMetrics, view: KubeClusterView
) -> HttpHandle | None:
    """The read-only metrics listener (the agent's bounded /metrics server), or None
    with --metrics-port 0. Apart from the scheduler's listener, so mutual TLS there
    stays whole and Prometheus needs no client certificate."""
    if a.metrics_port == 0:
        return None
    handle = start_http(
        metrics.registry, bind_address=a.metrics_bind, port=a.metrics_port,
        liveness=lambda: _view_alive(view),
    )
    log.info("metrics on %s:%d (GET /metrics)", handle.host, handle.port)
    return handle


if __name__ == "__main__":
    raise SystemExit(main())
