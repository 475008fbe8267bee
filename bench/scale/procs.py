"""The processes of ``bench.scale`` beside kwok: kube-scheduler (the local cluster's or
another binary, alone or with the extender in its config), the extender in its own
process (``bench.scale.extender_proc``), and the local cluster's kube-controller-manager
restarted at another client QPS for a run. Each context manager stops what it started
(also on errors and Ctrl-C).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.scale import model
from bench.scale.cluster import REPO, Env, log, stop, wait_for
from testkit.scheduler import extender_entry

# ---------------------------------------------------------------- schedulers


def scheduler_config(
    env: Env, name: str, extender_port: int | None, qps: float, nodes_to_score: int = 0
) -> dict[str, Any]:
    """kube-scheduler alone (its defaults), or as the chart configures it with the
    extender (score plugins off, percentageOfNodesToScore as the chart's value,
    nodeCacheCapable)."""
    profile: dict[str, Any] = {"schedulerName": name}
    cfg: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": env.kubeconfig},
        "leaderElection": {"leaderElect": False},
        "profiles": [profile],
    }
    if qps > 0:
        cfg["clientConnection"].update({"qps": qps, "burst": int(2 * qps)})
    if extender_port is not None:
        cfg["percentageOfNodesToScore"] = nodes_to_score
        profile["plugins"] = {"score": {"disabled": [{"name": "*"}]}}
        cfg["extenders"] = [extender_entry(extender_port, model.ds.MEM, model.ds.CORE)]
    return cfg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scheduler_binary(spec: str, k8s_bin: Path) -> Path:
    """The kube-scheduler binary of ``--dra-scheduler``: empty = the local cluster's
    (``k8s_bin``), ``1.36`` = the one hack/cluster/build.sh builds from hack/k8s-136
    (built and cached on first use: minutes), else the path of a kube-scheduler binary."""
    if not spec:
        return k8s_bin / "kube-scheduler"
    if spec == "1.36":
        build = REPO / "hack" / "cluster" / "build.sh"
        log("kube-scheduler 1.36: hack/cluster/build.sh k8s-136 (cached after the first build)")
        subprocess.run(["bash", str(build), "k8s-136"], check=True, stdout=sys.stderr)
        out = subprocess.run(["bash", str(build), "k8s-136-dir"], check=True,
                             capture_output=True, text=True)
        return Path(out.stdout.strip()) / "bin" / "kube-scheduler"
    path = Path(spec).resolve()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(f"--dra-scheduler: {spec} is not an executable file")
    return path


def binary_version(binary: Path) -> str:
    """What ``BINARY --version`` says (``Kubernetes v1.36.3``)."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                         check=True, timeout=60)
    return out.stdout.strip()


@contextlib.contextmanager
def kube_scheduler(
    env: Env, name: str, cfg: Mapping[str, Any], gates: str = "", binary: Path | None = None,
    gogc: int = 0,
) -> Iterator[subprocess.Popen[bytes]]:
    """kube-scheduler (the local cluster's, or ``binary``) serving the profile ``name``
    beside the cluster's own scheduler, which leaves its pods alone (their schedulerName):
    the same kubeconfig, config and gates whichever binary runs; ``gogc`` > 0: its Go
    runtime's GOGC (100 by default)."""
    conf = env.workdir / f"{name}.yaml"
    conf.write_text(yaml.safe_dump(dict(cfg)))
    logf = env.workdir / f"{name}.log"
    exe = binary or env.k8s_bin / "kube-scheduler"
    # Served like the cluster's own scheduler (hack/local-up-cluster.sh start_component):
    # /debug/pprof and /metrics on 127.0.0.1, for the admin's client certificate.
    port = free_port()
    args = [
        str(exe), f"--config={conf}", "--bind-address=127.0.0.1", f"--secure-port={port}",
        f"--authentication-kubeconfig={env.kubeconfig}",
        f"--authorization-kubeconfig={env.kubeconfig}", "--v=1",
    ]
    if gates:
        args.append(f"--feature-gates={gates}")
    with logf.open("w") as out:
        proc = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, **({"GOGC": str(gogc)} if gogc > 0 else {})},
        )
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"kube-scheduler exited:\n{logf.read_text()[-3000:]}")
            return "Starting Kubernetes Scheduler" in logf.read_text(errors="replace")

        wait_for("kube-scheduler to start", up, 120)
        log(f"  kube-scheduler {name} (pid {proc.pid}): https://127.0.0.1:{port} "
            f"(/debug/pprof, /metrics), log {logf}")
        time.sleep(3)  # its informers sync after the start line
        yield proc
    finally:
        stop(proc)


def _kcm_qps(cluster_dir: Path) -> str:
    """The running kube-controller-manager's --kube-api-qps ("" = its default)."""
    pid = (cluster_dir / "run" / "kube-controller-manager.pid").read_text().strip()
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return next((a.split("=", 1)[1] for a in args if a.startswith("--kube-api-qps=")), "")


def _restart_kcm(qps: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPU_SHARE_KCM_API_QPS"}
    if qps:
        env["GPU_SHARE_KCM_API_QPS"] = qps
    subprocess.run(
        ["bash", str(REPO / "hack" / "local-up-cluster.sh"), "restart-controller-manager"],
        env=env, check=True, stdout=sys.stderr, timeout=300,
    )


@contextlib.contextmanager
def controller_manager_qps(cluster_dir: Path, qps: int) -> Iterator[None]:
    """The local cluster's kube-controller-manager restarted with --kube-api-qps ``qps``
    (burst twice that) for the block, then restarted as it ran before (also on errors);
    ``qps`` 0 leaves it alone. Each of its controllers has a client at that rate: DRA
    pods' claims are made by the resource claim controller, two writes a pod."""
    if qps <= 0:
        yield
        return
    before = _kcm_qps(cluster_dir)
    log(f"kube-controller-manager: --kube-api-qps {qps} (was {before or 'its default, 20'})")
    try:
        _restart_kcm(str(qps))
        yield
    finally:
        log(f"kube-controller-manager: back to --kube-api-qps {before or 'its default'}")
        _restart_kcm(before)


@dataclass
class ExtenderProc:
    proc: subprocess.Popen[bytes]
    port: int
    stats_file: Path

    def stats(self, timeout: float = 30) -> dict[str, Any]:
        """Asks the process for its figures (SIGUSR1) and reads them."""
        before = self.stats_file.stat().st_mtime_ns if self.stats_file.exists() else 0
        self.proc.send_signal(signal.SIGUSR1)

        def fresh() -> bool:
            return self.stats_file.exists() and self.stats_file.stat().st_mtime_ns != before

        wait_for("extender stats", fresh, timeout, every=0.1)
        return dict(json.loads(self.stats_file.read_text()))


@contextlib.contextmanager
def extender(
    env: Env, port: int, key: bytes, workload_file: Path | None, src: Path | None = None,
    dra_driver: str = "",
) -> Iterator[ExtenderProc]:
    """``gpu-share-extender`` (the console script's code) in its own process; ``src``: a
    source tree whose ``gpu_share`` package to run instead (to measure a candidate fix);
    ``dra_driver``: its ``--dra-driver`` (whose claim results bind records for DRA pods)."""
    key_file = env.workdir / "decision.key"
    key_file.write_bytes(key)
    stats = env.workdir / "extender-stats.json"
    logf = env.workdir / "extender.log"
    cmd = [sys.executable, "-m", "bench.scale.extender_proc", str(stats)]
    if workload_file is not None:
        cmd += ["--workload", str(workload_file)]
    cmd += [
        "--", f"--listen=127.0.0.1:{port}", f"--key-file={key_file}",
        f"--kubeconfig={env.kubeconfig}", "--log-level=warning",
        *([f"--dra-driver={dra_driver}"] if dra_driver else []),
    ]
    with logf.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                [*([str(src)] if src else []), str(REPO)]
            )},
        )
    ext = ExtenderProc(proc, port, stats)
    try:

        def synced() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the extender exited:\n{logf.read_text()[-3000:]}")
            # Written by the process itself once its view synced (no signal before:
            # SIGUSR1 would end a process that has not installed its handler yet).
            with contextlib.suppress(OSError, ValueError):
                return "synced_at" in (json.loads(stats.read_text()).get("marks") or {})
            return False

        wait_for("the extender's view to sync", synced, 600, every=2)
        yield ext
    finally:
        stop(proc)


