"""gpu-share vs the Go sample device plugin on the real local kubelet, A B A B.

Run it through bench/run-agent-bench.sh (takes the cluster lock, builds the Go peer).
Each round starts one plugin as a host process, measures, and stops it again:

- start -> "Got registration request" in the kubelet log (klog timestamp), and -> node
  allocatable showing every unit (API server);
- N pods (1 unit each) created at once -> all Running; the kubelet's
  kubelet_device_plugin_alloc_duration_seconds diffed around it (and gpu-share's own
  GetPreferredAllocation/Allocate histograms);
- RSS after registration and after ``--allocations`` direct Allocate calls on the
  plugin's socket (kubelet-side client from testkit/kubelet_stub; for gpu-share each is
  GetPreferredAllocation + Allocate with no pod pending, i.e. its degraded path);
- gpu-share only: ListAndWatch message size, and fault file written -> allocatable drops.

The peer is bench/agent/peer (upstream sample plugin code with PEER_DEVICE_COUNT
devices), because the upstream binary hard-codes 2 devices.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import glob
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.agent.stats import (
    Histogram,
    Row,
    Summary,
    parse_histograms,
    percentile,
    render_table,
    rss_mib_from_status,
    series,
)
from testkit.harness import cluster_info, wait_until
from testkit.host_agent import agent_argv
from testkit.process import stop_process

MEM = "vendor.com/vcuda-memory"
PEER_RESOURCE = "example.com/resource"
NS = "gpu-share-bench"
KUBELET_ALLOC = "kubelet_device_plugin_alloc_duration_seconds"
REG_LINE = re.compile(
    r"^I(\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6}) .*Got registration request from device"
    r' plugin with resource" resourceName="([^"]+)"'
)


def klog_registrations(text: str, year: int) -> list[tuple[float, str]]:
    """(epoch seconds, resource) of each registration line of a kubelet log (local
    time, as klog writes it)."""
    out = []
    for line in text.splitlines():
        m = REG_LINE.match(line)
        if m:
            mo, d, h, mi, s, us = (int(x) for x in m.groups()[:6])
            ts = dt.datetime(year, mo, d, h, mi, s, us).timestamp()
            out.append((ts, m.group(7)))
    return out


@dataclass
class Env:
    node: str
    kubeconfig: str
    dp_dir: str
    pr_socket: str
    metrics_url: str
    ca: str
    cert: str
    key: str
    busybox: str
    kubelet_log: str

    @classmethod
    def of_cluster(cls) -> Env:
        """From ``hack/local-up-cluster.sh env --json`` (testkit/harness)."""
        e = cluster_info().env
        return cls(
            e["NODE_NAME"],
            e["KUBECONFIG"],
            e["DEVICE_PLUGIN_DIR"],
            e["POD_RESOURCES_SOCKET"],
            e["KUBELET_METRICS_URL"],
            e["CLUSTER_CA_CERT"],
            e["CLUSTER_ADMIN_CERT"],
            e["CLUSTER_ADMIN_KEY"],
            e["BUSYBOX_IMAGE"],
            os.path.join(e["CLUSTER_LOG_DIR"], "kubelet.log"),
        )


class Cluster:
    def __init__(self, env: Env) -> None:
        from kubernetes import client, config

        self.env = env
        api_client = config.new_client_from_config(env.kubeconfig)  # type: ignore[no-untyped-call]
        self.api = client.CoreV1Api(api_client)
        self._ssl = ssl.create_default_context(cafile=env.ca)
        self._ssl.load_cert_chain(env.cert, env.key)

    def kubelet_metrics(self) -> str:
        with urllib.request.urlopen(self.env.metrics_url, context=self._ssl, timeout=10) as r:
            return str(r.read().decode())

    def allocatable(self, resource: str) -> int:
        node = self.api.read_node(self.env.node)
        status = node.status
        return int(((status.allocatable if status else None) or {}).get(resource, "0"))

    def ensure_namespace(self) -> None:
        from kubernetes import client
        from kubernetes.client import ApiException

        try:
            self.api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        except ApiException as exc:
            if exc.status != 409:
                raise

    def create_pods(self, n: int, resource: str, prefix: str) -> None:
        for i in range(n):
            self.api.create_namespaced_pod(
                NS,
                {  # type: ignore[arg-type]  # the client accepts a plain manifest
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"{prefix}-{i}", "labels": {"app": "gpu-share-bench"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 0,
                        "containers": [
                            {
                                "name": "main",
                                "image": self.env.busybox,
                                "imagePullPolicy": "Never",
                                "command": ["sleep", "3600"],
                                "resources": {"limits": {resource: "1"}},
                            }
                        ],
                    },
                },
            )

    def pod_phases(self) -> list[str]:
        return [
            str(p.status.phase) if p.status else "" for p in self.api.list_namespaced_pod(NS).items
        ]

    def delete_pods(self, timeout_s: float = 120) -> bool:
        self.api.delete_collection_namespaced_pod(NS, grace_period_seconds=0)
        return wait_until(
            "bench pods gone",
            lambda: not self.api.list_namespaced_pod(NS).items,
            timeout_s,
            0.5,
            fail=False,
        )


def rss_mib(pid: int) -> float | None:
    try:
        return rss_mib_from_status(Path(f"/proc/{pid}/status").read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Subject:
    name: str
    resource: str
    units: int
    argv: list[str]
    env: dict[str, str]
    resources: list[str]  # every resource it registers
    socket_glob: str  # its device-plugin socket for direct calls
    metrics_port: int | None = None
    fault_file: str | None = None


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def hist_delta(before: str, after: str, name: str, **labels: str) -> Histogram | None:
    a = series(parse_histograms(after, name), **labels)
    if a is None:
        return None
    return a.minus(series(parse_histograms(before, name), **labels))


def direct_allocations(s: Subject, count: int, env: Env) -> list[float]:
    """``count`` Allocate calls (gpu-share: GPA + Allocate) on the plugin's socket;
    latencies of the whole pair, seconds."""
    from testkit.kubelet_stub import PluginClient

    paths = sorted(glob.glob(os.path.join(env.dp_dir, s.socket_glob)), key=os.path.getmtime)
    client = PluginClient(paths[-1], timeout_s=10).watch()
    out: list[float] = []
    try:
        ids = [d.id for d in client.wait_for_list(lambda ds: len(ds) > 0, 10) if d.healthy]
        for i in range(count):
            t0 = time.perf_counter()
            if s.name == "gpu-share":
                got = client.preferred_allocation(ids, [], 1)
            else:
                got = [ids[i % len(ids)]]
            client.allocate(got)
            out.append(time.perf_counter() - t0)
    finally:
        client.close()
    return out


def listandwatch_bytes(s: Subject, env: Env) -> int:
    from gpu_share.plugin import wire
    from testkit.kubelet_stub import PluginClient

    paths = sorted(glob.glob(os.path.join(env.dp_dir, s.socket_glob)), key=os.path.getmtime)
    client = PluginClient(paths[-1], timeout_s=10).watch()
    try:
        devices = client.wait_for_list(lambda ds: len(ds) > 0, 10)
        return int(wire.list_and_watch_response(devices).ByteSize())
    finally:
        client.close()


@dataclass
class RoundResult:
    subject: str
    figures: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def run_round(
    s: Subject,
    cluster: Cluster,
    n_pods: int,
    allocations: int,
    idx: int,
    log_dir: Path,
    profile: bool = False,
) -> RoundResult:
    env = cluster.env
    res = RoundResult(s.name)
    f = res.figures
    # Start from a kubelet that does not list the resource (previous round's gone).
    wait_until(
        "previous round gone", lambda: cluster.allocatable(s.resource) == 0, 60, 0.5, fail=False
    )
    log_offset = os.path.getsize(env.kubelet_log)
    out = open(log_dir / f"{s.name}-{idx}.log", "wb")  # noqa: SIM115 - closed below
    t0 = time.time()
    proc = subprocess.Popen(
        s.argv,
        env={**os.environ, **s.env},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def registered() -> list[tuple[float, str]]:
            with open(env.kubelet_log, "rb") as fh:
                fh.seek(log_offset)
                text = fh.read().decode(errors="replace")
            return [
                r for r in klog_registrations(text, dt.date.today().year) if r[1] in s.resources
            ]

        ok = wait_until(
            "registered",
            lambda: {r for _, r in registered()} >= set(s.resources),
            60,
            0.05,
            fail=False,
        )
        regs = registered()
        f["registered_s"] = max(ts for ts, _ in regs) - t0 if ok else None
        ok = wait_until(
            "allocatable", lambda: cluster.allocatable(s.resource) == s.units, 60, 0.05, fail=False
        )
        f["allocatable_s"] = time.time() - t0 if ok else None
        time.sleep(1.0)  # let start-up settle before reading RSS
        f["rss_registered_mib"] = rss_mib(proc.pid)
        spy = None
        if profile and s.metrics_port:
            # Sampling profile of the agent from here on (raw collapsed stacks).
            spy = subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "--pid",
                    str(proc.pid),
                    "-r",
                    "100",
                    "--format",
                    "raw",
                    "-o",
                    str(log_dir / f"{s.name}-{idx}.pyspy.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

        # Admission of N pods.
        k_before = cluster.kubelet_metrics()
        a_before = fetch(f"http://127.0.0.1:{s.metrics_port}/metrics") if s.metrics_port else ""
        t1 = time.time()
        cluster.create_pods(n_pods, s.resource, f"{s.name}-{idx}")
        ok = wait_until(
            "pods Running",
            lambda: (p := cluster.pod_phases()).count("Running") == n_pods and len(p) == n_pods,
            600,
            0.25,
            fail=False,
        )
        f["admission_s"] = time.time() - t1 if ok else None
        if not ok:
            res.notes.append(f"round {idx}: pods not all Running: {cluster.pod_phases()}")
        k_after = cluster.kubelet_metrics()
        h = hist_delta(k_before, k_after, KUBELET_ALLOC, resource_name=s.resource)
        if h is not None and h.count > 0:
            f["kubelet_alloc_p50_ms"] = (h.quantile(0.5) or 0) * 1e3
            f["kubelet_alloc_p99_ms"] = (h.quantile(0.99) or 0) * 1e3
            f["kubelet_alloc_mean_ms"] = (h.mean or 0) * 1e3
            f["kubelet_alloc_count"] = h.count
            f["kubelet_alloc_le_5ms_frac"] = dict(h.buckets).get(0.005, 0.0) / h.count
        if s.metrics_port:
            a_after = fetch(f"http://127.0.0.1:{s.metrics_port}/metrics")
            for key, name in (
                ("agent_gpa", "gpu_share_preferred_allocation_seconds"),
                ("agent_alloc", "gpu_share_allocate_seconds"),
            ):
                ah = hist_delta(a_before, a_after, name, resource=s.resource)
                if ah is not None and ah.count > 0:
                    f[f"{key}_p50_ms"] = (ah.quantile(0.5) or 0) * 1e3
                    f[f"{key}_p99_ms"] = (ah.quantile(0.99) or 0) * 1e3
        if not cluster.delete_pods():
            res.notes.append(f"round {idx}: pods not deleted in time")

        # Direct calls, then RSS.
        lat = direct_allocations(s, allocations, env)
        f["direct_p50_ms"] = percentile(lat, 0.5) * 1e3
        f["direct_p99_ms"] = percentile(lat, 0.99) * 1e3
        f["rss_after_allocs_mib"] = rss_mib(proc.pid)
        f["listandwatch_kib"] = listandwatch_bytes(s, env) / 1024

        # Health push (gpu-share only): one device unhealthy -> allocatable drops.
        if s.fault_file:
            from gpu_share.devices.dummy import write_faults

            t2 = time.time()
            write_faults(s.fault_file, [0])
            ok = wait_until(
                "allocatable drops",
                lambda: cluster.allocatable(s.resource) < s.units,
                30,
                0.05,
                fail=False,
            )
            f["health_push_s"] = time.time() - t2 if ok else None
            write_faults(s.fault_file, [])
            wait_until(
                "allocatable back",
                lambda: cluster.allocatable(s.resource) == s.units,
                30,
                0.1,
                fail=False,
            )
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
    finally:
        stop_process(proc, grace_s=15, kill_wait_s=5)
        out.close()
    return res


def subjects(env: Env, peer_bin: str, work: Path, devices: int, metrics_port: int) -> list[Subject]:
    units = devices * 16
    fault = str(work / "faults.json")
    ours = Subject(
        "gpu-share",
        MEM,
        units,
        agent_argv(env.node, env.dp_dir, env.pr_socket, str(work / "state"), metrics_port),
        {
            "GPU_SHARE_DUMMY__DEVICE_COUNT": str(devices),
            "GPU_SHARE_DUMMY__MEMORY_MIB": "16384",
            "GPU_SHARE_DUMMY__FAULT_FILE": fault,
            "KUBECONFIG": env.kubeconfig,
        },
        [MEM, "vendor.com/vcuda-core"],
        "gpu-share-vcuda-memory.sock",
        metrics_port,
        fault,
    )
    peer = Subject(
        "sample",
        PEER_RESOURCE,
        units,
        [peer_bin],
        {"PEER_DEVICE_COUNT": str(units)},
        [PEER_RESOURCE],
        "peer.*",
    )
    return [ours, peer]


ROWS: list[tuple[str, str, str, str]] = [
    # (figure key, label, unit, target)
    ("registered_s", "start -> registered with kubelet", "s", "<= 1.5 s"),
    ("allocatable_s", "start -> node allocatable updated", "s", ""),
    ("admission_s", "N pods created -> all Running", "s", "<= 1.5x sample"),
    ("kubelet_alloc_p50_ms", "Allocate p50 (kubelet histogram)", "ms", ""),
    ("kubelet_alloc_p99_ms", "Allocate p99 (kubelet histogram)", "ms", "<= 5 ms"),
    ("kubelet_alloc_mean_ms", "Allocate mean (kubelet sum/count)", "ms", ""),
    ("kubelet_alloc_le_5ms_frac", "Allocate share <= 5 ms (kubelet)", "frac", ""),
    ("agent_gpa_p50_ms", "GetPreferredAllocation p50 (agent histogram)", "ms", ""),
    ("agent_gpa_p99_ms", "GetPreferredAllocation p99 (agent histogram)", "ms", ""),
    ("agent_alloc_p50_ms", "Allocate p50 (agent histogram)", "ms", ""),
    ("agent_alloc_p99_ms", "Allocate p99 (agent histogram)", "ms", ""),
    ("direct_p50_ms", "direct call p50 (gpu-share: GPA+Allocate)", "ms", ""),
    ("direct_p99_ms", "direct call p99 (gpu-share: GPA+Allocate)", "ms", ""),
    ("rss_registered_mib", "RSS after registration", "MiB", "<= 60 MiB"),
    ("rss_after_allocs_mib", "RSS after the direct allocations", "MiB", "<= 60 MiB"),
    ("listandwatch_kib", "ListAndWatch message (largest resource)", "KiB", "< 1024 KiB"),
    ("health_push_s", "fault file -> allocatable drops", "s", ""),
]


def table(results: list[RoundResult]) -> list[Row]:
    rows = []
    for key, label, unit, target in ROWS:
        ours = Summary.of(r.figures.get(key) for r in results if r.subject == "gpu-share")
        peer = Summary.of(r.figures.get(key) for r in results if r.subject == "sample")
        rows.append(Row(label, unit, ours, peer, target))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer", required=True, help="the Go peer binary (build-peer.sh)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pods", type=int, default=50)
    p.add_argument("--allocations", type=int, default=1000)
    p.add_argument("--devices", type=int, default=4, help="dummy devices x 16 GiB (1 GiB units)")
    p.add_argument("--metrics-port", type=int, default=19491)
    p.add_argument("--json", type=Path)
    p.add_argument("--only", choices=["gpu-share", "sample"], help="measure one subject")
    p.add_argument("--profile", action="store_true", help="py-spy the agent (figures skewed)")
    ns = p.parse_args(argv)
    env = Env.of_cluster()
    others = subprocess.run(
        ["pgrep", "-f", "gpu_share.cli.plugin_main|gpu-share-plugin"],
        capture_output=True,
        text=True,
    ).stdout.split()
    if others:
        print(f"another gpu-share agent runs (pids {others}); stop it first", file=sys.stderr)
        return 1
    cluster = Cluster(env)
    cluster.ensure_namespace()
    cluster.delete_pods()
    work = Path(tempfile.mkdtemp(prefix="gsb-cluster-", dir="/tmp"))
    logs = work / "logs"
    logs.mkdir()
    results: list[RoundResult] = []
    for i in range(ns.rounds):
        for s in subjects(env, ns.peer, work / f"r{i}", ns.devices, ns.metrics_port):
            if ns.only and s.name != ns.only:
                continue
            print(f"round {i + 1}/{ns.rounds}: {s.name} ...", file=sys.stderr, flush=True)
            r = run_round(s, cluster, ns.pods, ns.allocations, i, logs, ns.profile)
            print(f"  {json.dumps(r.figures)} {r.notes}", file=sys.stderr, flush=True)
            results.append(r)
    with contextlib.suppress(Exception):
        cluster.api.delete_namespace(NS)
    print(
        f"\nN = {ns.pods} pods x 1 unit; {ns.devices} dummy devices x 16 GiB = "
        f"{ns.devices * 16} units vs sample peer with {ns.devices * 16} devices; "
        f"{ns.rounds} rounds A B A B; plugin logs in {logs}"
    )
    print(render_table(table(results)))
    for r in results:
        for note in r.notes:
            print("note:", note)
    if ns.json:
        ns.json.write_text(
            json.dumps(
                [{"subject": r.subject, **r.figures, "notes": r.notes} for r in results], indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
