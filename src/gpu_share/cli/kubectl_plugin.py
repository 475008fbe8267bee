"""``kubectl gpu-share``: the admin's view of GPU sharing (kubectl plugin ``kubectl-gpu_share``).

    kubectl gpu-share nodes [NODE...] [-l SEL] [--pool P] [--unhealthy] [-o wide|json|yaml]
        every node's devices from the agent's inventory annotation: memory and cores
        used/total, health, pods, the largest free block, a usage bar per device
    kubectl gpu-share pods [-n NS | -A] [-l SEL] [-o wide|json|yaml]
        which container holds which slice (the agent's assignment annotation), mode,
        source, age
    kubectl gpu-share fit --memory N --cores N [--cpu Q] [--host-memory Q] [--model M]
        where a pod of that shape fits now, and why not elsewhere: the scheduler
        extender's own filter and prioritize, run here on a snapshot of the cluster
        (exit 3 when it fits nowhere)
    kubectl gpu-share plot --out cluster.png [NODE...] [--pool P] [--sort name|used|fgd]
        a PNG of the fleet: a cell per device (memory used, cores used, the part of its
        free capacity the fgd policy counts as fragment), unhealthy and cordoned marked,
        each node's fgd value beside it
    kubectl gpu-share cordon NODE DEVICE [--reason TEXT] [--wait]
    kubectl gpu-share uncordon NODE DEVICE [--wait]
        stop (allow again) new slices on one GPU (DEVICE: index, gpu-N or uuid); running
        slices stay. Needs the chart's ClusterRole <release>-<namespace>-cordon

nodes, pods, fit and plot are read-only: one LIST of nodes and one of pods (paged by
--chunk-size like kubectl), so get/list on nodes and pods is all they need. The
kubeconfig is found as kubectl finds it (--kubeconfig, then the first file of
KUBECONFIG, then ~/.kube/config, then the in-cluster service account); --context picks
a context of it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpu_share.cli import kubectl_cordon, kubectl_plot
from gpu_share.cli import kubectl_format as fmt
from gpu_share.cli.kubectl_fit import DEFAULT_WORKLOAD, SnapshotView, fit, parse_workload, probe_pod
from gpu_share.cli.kubectl_snapshot import Settings, Snapshot
from gpu_share.cli.kubectl_view import node_problems, node_rows, slice_rows
from gpu_share.errors import GpuShareError, KubeAccessError
from gpu_share.kube.listwatch import rest_paged_list
from gpu_share.kube.rest import ApiError, KubeTimeouts, RestClient, load_rest_config, quote_name
from gpu_share.sharing.placement import ClusterPolicyName

OUTPUTS = ("table", "wide", "json", "yaml")
LIVE = "status.phase!=Succeeded,status.phase!=Failed"
EXIT_ERROR, EXIT_USAGE, EXIT_NO_FIT = 1, 2, 3


# ---------------------------------------------------------------- configuration


def kubeconfig_path(flag: str | None, environ: Mapping[str, str]) -> str | None:
    """kubectl's order: --kubeconfig, the first existing file of KUBECONFIG,
    ~/.kube/config; None = in-cluster."""
    if flag:
        return flag
    for p in (environ.get("KUBECONFIG") or "").split(os.pathsep):
        if p and Path(p).is_file():
            return p
    default = Path(environ.get("HOME", str(Path.home()))) / ".kube" / "config"
    return str(default) if default.is_file() else None


def context_namespace(path: str | None, context: str | None) -> str:
    """The namespace of the (current or given) context, else ``default``."""
    if path is None:
        return "default"
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text())
        name = context or doc.get("current-context")
        for c in doc.get("contexts") or ():
            if c.get("name") == name:
                return str((c.get("context") or {}).get("namespace") or "default")
    except (OSError, yaml.YAMLError, AttributeError):
        pass  # load_rest_config reports a broken file
    return "default"


def timeout_seconds(text: str) -> float:
    """kubectl's --request-timeout: 30, 30s, 2m, 1h (0: our default)."""
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:], 0)
    try:
        value = float(text[:-1] if scale else text) * (scale or 1)
    except ValueError:
        raise ValueError(f"--request-timeout {text!r}: expected 30, 30s, 2m or 1h") from None
    if value < 0:
        raise ValueError("--request-timeout must not be negative")
    return value or 60.0


def client(a: argparse.Namespace, environ: Mapping[str, str]) -> RestClient:
    path = kubeconfig_path(a.kubeconfig, environ)
    cfg = load_rest_config(path, context=a.context, environ=environ)
    read = timeout_seconds(a.request_timeout) if a.request_timeout else 60.0
    return RestClient(cfg, timeouts=KubeTimeouts(read=read), user_agent="kubectl-gpu_share")


def selector(a: argparse.Namespace, settings: Settings) -> str | None:
    parts = [a.selector] if a.selector else []
    if getattr(a, "pool", None):
        parts.append(f"{settings.pool_label}={a.pool}")
    return ",".join(parts) or None


# ---------------------------------------------------------------- LISTs


def list_nodes(api: RestClient, a: argparse.Namespace, settings: Settings) -> list[dict[str, Any]]:
    sel: dict[str, str] = {}
    if (s := selector(a, settings)) is not None:
        sel["labelSelector"] = s
    items, _ = rest_paged_list(api, "list nodes", "/api/v1/nodes", page_size=a.chunk_size, **sel)
    return items


def list_pods(api: RestClient, a: argparse.Namespace, *, namespace: str | None = None,
              fields: str = LIVE, labels: str | None = None) -> list[dict[str, Any]]:
    path = ("/api/v1/pods" if namespace is None
            else f"/api/v1/namespaces/{quote_name(namespace)}/pods")
    sel = {"fieldSelector": fields}
    if labels:
        sel["labelSelector"] = labels
    items, _ = rest_paged_list(api, "list pods", path, page_size=a.chunk_size, **sel)
    return items


# ---------------------------------------------------------------- commands


def _emit(a: argparse.Namespace, doc: Any, text: str) -> None:
    sys.stdout.write(fmt.document(doc, a.output) if a.output in ("json", "yaml") else text)


def cmd_nodes(api: RestClient, a: argparse.Namespace, settings: Settings) -> int:
    nodes = list_nodes(api, a, settings)
    pods = list_pods(api, a, fields=f"spec.nodeName!=,{LIVE}")
    snap = Snapshot.from_lists(nodes, pods, settings)
    for line in node_problems(snap):
        print(f"warning: {line}", file=sys.stderr)
    rows = node_rows(snap, unhealthy_only=a.unhealthy, names=a.names,
                     cordoned_only=a.cordoned)
    if not rows and a.output in OUTPUTS[:2]:
        print("No gpu-share devices found.", file=sys.stderr)
        return 0
    _emit(a, fmt.nodes_doc(rows), fmt.nodes_table(rows, wide=a.output == "wide"))
    return 0


def cmd_pods(api: RestClient, a: argparse.Namespace, settings: Settings, namespace: str) -> int:
    ns = None if a.all_namespaces else namespace
    pods = list_pods(api, a, namespace=ns, labels=a.selector)
    try:
        nodes = list_nodes(api, argparse.Namespace(selector=None, chunk_size=a.chunk_size),
                           settings)
    except ApiError as e:
        if e.status != 403:
            raise
        nodes = []  # devices show by uuid, memory in units
        print("warning: cannot list nodes (forbidden): GPU indexes and memory sizes are"
              " not shown", file=sys.stderr)
    rows = slice_rows(Snapshot.from_lists(nodes, pods, settings))
    if not rows and a.output in OUTPUTS[:2]:
        where = "any namespace" if ns is None else f"namespace {ns}"
        print(f"No pods using gpu-share found in {where}.", file=sys.stderr)
        return 0
    text = fmt.pods_table(rows, datetime.now(UTC), all_namespaces=ns is None,
                          wide=a.output == "wide")
    _emit(a, fmt.pods_doc(rows), text)
    return 0


def cmd_fit(api: RestClient, a: argparse.Namespace, settings: Settings) -> int:
    nodes = list_nodes(api, a, settings)
    pods = list_pods(api, a)
    snap = Snapshot.from_lists(nodes, pods, settings)
    view = SnapshotView(snap, parse_workload(a.default_workload))
    pod = probe_pod(settings, a.memory, a.cores, cpu=a.cpu, host_memory=a.host_memory,
                    model=a.model, containers=a.containers)
    res = fit(view, pod, sorted(snap.nodes), a.policy)
    units = {n.name: n.inventory.unit_mib for n in snap.nodes.values() if n.inventory}
    request = {"memoryUnits": a.memory, "cores": a.cores, "containers": a.containers,
               "cpu": a.cpu, "hostMemory": a.host_memory, "model": a.model, "policy": a.policy}
    _emit(a, fmt.fit_doc(res, request), fmt.fit_text(res, units, wide=a.output == "wide"))
    if res.error:
        return EXIT_USAGE
    return 0 if res.fits else EXIT_NO_FIT


def cmd_cordon(api: RestClient, a: argparse.Namespace, settings: Settings) -> int:
    on = a.cmd == "cordon"
    if on:
        line = kubectl_cordon.cordon(api, a.node, a.device, settings.domain, a.reason)
    else:
        line = kubectl_cordon.uncordon(api, a.node, a.device, settings.domain)
    print(line)
    if a.wait:
        kubectl_cordon.wait_honoured(api, a.node, a.device, settings.domain, on, a.timeout)
        print(f"node/{a.node}: the gpu-share agent honours it")
    return 0


# ---------------------------------------------------------------- arguments


def _common(environ: Mapping[str, str], top: bool) -> argparse.ArgumentParser:
    """The kubectl flags, accepted before and after the subcommand (SUPPRESS below the
    top, so a subcommand's unset flag does not reset one given before it)."""
    p = argparse.ArgumentParser(add_help=False)

    def d(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    p.add_argument("--kubeconfig", default=d(None), help="path of the kubeconfig file")
    p.add_argument("--context", default=d(None), help="kubeconfig context to use")
    p.add_argument("-n", "--namespace", default=d(None), help="namespace (pods)")
    p.add_argument("-A", "--all-namespaces", action="store_true", default=d(False),
                   help="pods of every namespace")
    p.add_argument("-o", "--output", choices=OUTPUTS, default=d("table"))
    p.add_argument("-l", "--selector", default=d(None),
                   help="label selector (of nodes; for pods, of pods)")
    p.add_argument("--chunk-size", type=int, default=d(500),
                   help="objects per page of a LIST (0: one answer)")
    p.add_argument("--request-timeout", default=d(None), help="seconds to wait for an answer")
    p.add_argument("--domain", default=d(environ.get("GPU_SHARE_DOMAIN", "vendor.com")))
    p.add_argument("--memory-name", default=d(environ.get("GPU_SHARE_MEMORY_NAME",
                                                          "vcuda-memory")))
    p.add_argument("--core-name", default=d(environ.get("GPU_SHARE_CORE_NAME", "vcuda-core")))
    p.add_argument("--model-label", default=d(environ.get("GPU_SHARE_MODEL_LABEL",
                                                          Settings.model_label)))
    return p


def parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    sub_common = _common(environ, top=False)
    ap = argparse.ArgumentParser(prog="kubectl gpu-share", description=__doc__,
                                 parents=[_common(environ, top=True)],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("nodes", parents=[sub_common], help="devices of every node")
    n.add_argument("names", nargs="*", metavar="NODE")
    n.add_argument("--pool", help="nodes of this pool (label gpu-share.<domain>/pool)")
    n.add_argument("--unhealthy", action="store_true", help="only unhealthy devices")
    n.add_argument("--cordoned", action="store_true", help="only cordoned devices")
    for verb, what in (("cordon", "stop new slices on one GPU (running slices stay)"),
                       ("uncordon", "allow new slices on a cordoned GPU again")):
        c = sub.add_parser(verb, parents=[sub_common], help=what)
        c.add_argument("node", metavar="NODE")
        c.add_argument("device", metavar="DEVICE", help="index, gpu-N or device uuid")
        if verb == "cordon":
            c.add_argument("--reason", default="",
                           help="why (shown in the Event and in nodes -o wide)")
        c.add_argument("--wait", action="store_true",
                       help="wait until the node's agent honours it")
        c.add_argument("--timeout", type=float, default=30.0, help="seconds --wait waits")
    sub.add_parser("pods", parents=[sub_common], help="which container holds which slice")
    f = sub.add_parser("fit", parents=[sub_common],
                       help="where a pod of this shape fits now, and why not elsewhere")
    f.add_argument("--memory", type=int, required=True, help="memory units per container")
    f.add_argument("--cores", type=int, required=True,
                   help="core percent per container (100 and more: whole devices)")
    f.add_argument("--containers", type=int, default=1, help="containers of that shape")
    f.add_argument("--cpu", help="host CPU per container (a quantity: 500m, 2)")
    f.add_argument("--host-memory", help="host memory per container (a quantity: 4Gi)")
    f.add_argument("--model", help="only this GPU model (nodeSelector on --model-label)")
    f.add_argument("--pool", help="nodes of this pool (label gpu-share.<domain>/pool)")
    f.add_argument("--policy", default=environ.get("GPU_SHARE_CLUSTER_POLICY", "fgd"),
                   choices=[p.value for p in ClusterPolicyName],
                   help="the extender's --policy")
    f.add_argument("--default-workload",
                   default=environ.get("GPU_SHARE_DEFAULT_WORKLOAD", DEFAULT_WORKLOAD),
                   help="the extender's --default-workload (fgd, while no pod asks)")
    kubectl_plot.register(sub, [sub_common], environ)
    return ap


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    ap = parser(env)
    a = ap.parse_args(argv)
    if a.chunk_size < 0:
        ap.error("--chunk-size must be 0 or more")
    if a.cmd == "fit" and (a.memory < 0 or a.cores < 0 or a.memory + a.cores == 0
                           or not 1 <= a.containers <= 16):
        ap.error("fit needs --memory and --cores >= 0, not both 0, and 1..16 --containers")
    settings = Settings(a.domain, a.memory_name, a.core_name, a.model_label)
    try:
        api = client(a, env)
        try:
            if a.cmd == "nodes":
                return cmd_nodes(api, a, settings)
            if a.cmd in ("cordon", "uncordon"):
                return cmd_cordon(api, a, settings)
            if a.cmd == "plot":
                return kubectl_plot.cmd_plot(api, a, settings)
            if a.cmd == "pods":
                ns = a.namespace or context_namespace(kubeconfig_path(a.kubeconfig, env),
                                                      a.context)
                return cmd_pods(api, a, settings, ns)
            return cmd_fit(api, a, settings)
        finally:
            api.close()
    except ApiError as e:
        hint = (" (kubectl gpu-share needs get/list on nodes and pods)"
                if e.status == 403 and a.cmd not in ("cordon", "uncordon") else "")
        print(f"error: {e}{hint}", file=sys.stderr)
    except (KubeAccessError, GpuShareError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
