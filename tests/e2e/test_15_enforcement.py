"""Story 15 (enforcement you can watch): the chart with a ``hami-core`` pool on the dummy
backend. The pool's init container installs the image's libvgpu.so (compiled from
HAMi-core's pinned source) on the node; every slice's container gets it through the
mounted /etc/ld.so.preload. The workload image holds our stand-in NVIDIA driver
(presenting the node's dummy devices) and gpu-workload, which allocates until refused.

15a: a pod asking 4 memory units (+ 30 cores) allocates exactly 4 GiB, the next chunk is
refused out-of-memory; its own ``LD_PRELOAD=`` and a limit env rewritten by its command
change nothing. 15b: two pods on one device each stop at their own limit. 15c: a pod
setting the limit env in its spec is refused at admission. 15d: the library vanishes from
the node: within seconds no new slice (allocatable 0, the agent not Ready, an Event
naming the library, the node's enforcement label gone); restored, the waiting pod runs
and is limited. 15e: the same pool as ``enforcement: auto`` takes HAMi-core on this node
(no MPS daemon, no driver limits: the local kubelet's cgroups are v1), says what it found,
and its slices stop at their limit."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_share.sharing.node import hami_region
from testkit.e2e import AGENT_NS, CORE, MEM, Kube, pod
from testkit.harness import REPO, run_script, wait_until
from tests.e2e.test_11_dra import _wait_rolled

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

WORKLOAD_IMAGE = "localhost/gpu-workload:local"
STANDIN_LIBS = "/usr/lib/gpu-share-standin"
OOM = "CUDA_ERROR_OUT_OF_MEMORY"
ENFORCEMENT = "gpu-share.vendor.com/enforcement"


def _say(msg: str) -> None:
    print(f"[story 15] {msg}", flush=True)


def _build_workload_image(standin: Path, out: Path) -> Path:
    """busybox + the host's glibc (libvgpu.so and the stand-in need it) + the stand-in
    driver and gpu-workload, as a single-layer OCI image (hack/cluster/oci.py)."""
    oci = REPO / "hack" / "cluster" / "oci.py"
    rootfs = out / "rootfs"
    subprocess.run(["python3", str(oci), "busybox-rootfs", str(rootfs)], check=True,
                   timeout=120)
    # The files themselves, not the host's symlinks to them.
    adds = [f"{os.path.realpath(p)}={p}" for p in ("/lib/x86_64-linux-gnu/libc.so.6",
                                                   "/lib64/ld-linux-x86-64.so.2")]
    adds += [f"{standin / n}={STANDIN_LIBS}/{n}" for n in ("libcuda.so.1", "libnvidia-ml.so.1")]
    adds.append(f"{standin / 'gpu-workload'}=/usr/local/bin/gpu-workload")
    tar = out / "gpu-workload.tar"
    subprocess.run(
        ["python3", str(oci), "build-image", "--tag", WORKLOAD_IMAGE, "--rootfs", str(rootfs),
         *[a for add in adds for a in ("--add", add)],
         "--env", "PATH=/usr/local/bin:/bin:/usr/bin", "--env", f"LD_LIBRARY_PATH={STANDIN_LIBS}",
         "--cmd", "gpu-workload", "-o", str(tar)],
        check=True, timeout=300, capture_output=True,
    )
    return tar


@dataclass
class HamiPool:
    kube: Kube
    cluster_dir: Path

    @property
    def library(self) -> Path:
        return self.cluster_dir / "vgpu" / "libvgpu.so"

    @property
    def driver_state(self) -> Path:
        return self.cluster_dir / "standin-driver-state"

    def devices(self) -> str:
        """The stand-in's device table: the node's dummy devices, as the agent sees them."""
        inv = self.kube.inventory()
        unit_mib = 1024
        return ";".join(f"{d['id']}={d['memoryUnits']['total'] * unit_mib}" for d in inv["devices"])


def _pool_values(cluster_dir: Path, tmp: Path, mode: str = "hami-core") -> str:
    hc = {"libraryPath": str(cluster_dir / "vgpu" / "libvgpu.so"),
          "preloadPath": str(cluster_dir / "vgpu" / "ld.so.preload"),
          "cacheDir": str(cluster_dir / "vgpu-cache")}
    doc = {"agentConfig": {"runtime": {"enforcement": mode, "hamiCore": hc,
                                       "mps": {"pipeDir": str(cluster_dir / "mps")}},
                           "health": {"pollIntervalSeconds": 1}}}
    path = tmp / f"pool-{mode}.yaml"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture(scope="module")
def hami(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HamiPool]:
    built = subprocess.run(["bash", str(REPO / "hack" / "build-enforcement.sh")],
                           capture_output=True, text=True, timeout=900, check=True)
    standin = Path(dict(ln.split("=", 1) for ln in built.stdout.splitlines()
                        if "=" in ln)["standin"])
    tmp = Path(tempfile.mkdtemp(prefix="gs-story15-"))
    try:
        tar = _build_workload_image(standin, tmp)
        imp = run_script("import-image", str(tar), timeout=300)
        assert imp.returncode == 0, imp.stderr[-2000:]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not kube.installed():
        kube.install()
    kube.wait_agent_serving()
    pool = HamiPool(kube, Path(kube.env["GPU_SHARE_CLUSTER_DIR"]))
    old = kube.ready_agent()
    try:
        kube.install("-f", _pool_values(pool.cluster_dir, tmp_path_factory.mktemp("hami")),
                     action="upgrade")
        _wait_rolled(kube, old["metadata"]["uid"] if old else None)
        kube.wait_agent_serving()
        _say(f"pool in hami-core mode; library installed: {pool.library.is_file()}")
        yield pool
    finally:
        old = kube.ready_agent()
        kube.install(action="upgrade")
        _wait_rolled(kube, old["metadata"]["uid"] if old else None)
        kube.wait_agent_serving()


def _workload_pod(name: str, ns: str, memory: int, cores: int, pool: HamiPool,
                  script: str = "exec gpu-workload --chunk-mib 256 --max-chunks 4096",
                  env: Sequence[dict[str, str]] = ()) -> dict[str, Any]:
    limits = {MEM: str(memory), **({CORE: str(cores)} if cores else {})}
    c: dict[str, Any] = {
        "name": "main", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
        "command": ["sh", "-c", script], "resources": {"limits": limits},
        "volumeMounts": [{"name": "standin", "mountPath": "/etc/gpu-share-standin"},
                         {"name": "driver-state", "mountPath": "/tmp/gpu-share-standin"}],
    }
    if env:
        c["env"] = list(env)
    p = pod(name, ns, [c])
    p["spec"]["volumes"] = [
        {"name": "standin", "configMap": {"name": "standin-devices"}},
        {"name": "driver-state",
         "hostPath": {"path": str(pool.driver_state), "type": "DirectoryOrCreate"}},
    ]
    return p


def _devices_configmap(ns: str, pool: HamiPool) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "standin-devices", "namespace": ns},
            "data": {"devices": pool.devices()}}


def _result(kube: Kube, ns: str, name: str, timeout: float = 120) -> dict[str, Any]:
    """The workload's JSON once the pod Succeeded."""
    def done() -> str | None:
        phase = kube.get("pod", name, "-n", ns)["status"].get("phase")
        assert phase != "Failed", kube.kubectl("-n", ns, "logs", name, check=False).stdout
        return phase if phase == "Succeeded" else None

    wait_until(f"pod {name} Succeeded", done, timeout, interval=1)
    out = kube.kubectl("-n", ns, "logs", name).stdout
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert lines, out
    doc: dict[str, Any] = json.loads(lines[-1])
    return doc


def _explain(pool: HamiPool, ns: str, names: Sequence[str]) -> None:
    """What a failed limit story needs to be read: each pod's UID and devices, the
    pool's cache dirs with their regions' limits, the agent's notes on the namespace."""
    kube = pool.kube
    for name in names:
        uid = kube.get("pod", name, "-n", ns)["metadata"]["uid"]
        _say(f"{name}: uid {uid}, devices {kube.namespace_devices(ns)}")
    root = pool.cluster_dir / "vgpu-cache"
    for d in sorted(root.iterdir()) if root.is_dir() else ():
        _say(f"cache dir {d.name}: {sorted(p.name for p in d.iterdir())}, {_region(d)}")
    agent = kube.ready_agent()
    if agent is not None:
        log = kube.kubectl("-n", AGENT_NS, "logs", agent["metadata"]["name"], "-c", "agent",
                           "--since=10m", check=False).stdout
        for line in [ln for ln in log.splitlines() if ns in ln][-40:]:
            _say(f"agent: {line[:600]}")


def _region(d: Path) -> str:
    """A cache dir's region: its limits and HAMi-core's process slots (pid, host pid,
    MiB used on device 0)."""
    path = d / hami_region.CACHE_FILE
    data = path.read_bytes() if path.is_file() else b""
    limits = hami_region.read_limits(data)
    if limits is None:
        return "no region"
    r = hami_region.Region.from_buffer_copy(data[: ctypes.sizeof(hami_region.Region)])
    slots = [(p.pid, p.hostpid, p.used[0].total >> 20)
             for p in r.procs[: min(max(r.proc_num, 0), 8)]]
    mib = [m >> 20 for m in limits.memory_bytes if m]
    return f"inode {path.stat().st_ino}, limits MiB {mib}, slots {slots}"


def _device(kube: Kube, ns: str, name: str) -> set[str]:
    devs = kube.namespace_devices(ns)
    return {i.split("::", 1)[0] for k, v in devs.items() if k[1] == name for ids in v.values()
            for i in ids}


def test_story15a_a_slice_stops_at_its_limit_whatever_the_workload_does(
    hami: HamiPool, namespace: str
) -> None:
    kube = hami.kube
    kube.apply([_devices_configmap(namespace, hami)])
    kube.apply([
        _workload_pod("plain", namespace, 4, 30, hami),
        # The container's own command empties LD_PRELOAD and raises the limit env.
        _workload_pod("rewrites", namespace, 4, 0, hami, script=(
            "export CUDA_DEVICE_MEMORY_LIMIT_0=16g LD_PRELOAD=; "
            "exec gpu-workload --chunk-mib 1024 --max-chunks 64")),
    ])
    results = {name: _result(kube, namespace, name) for name in ("plain", "rewrites")}
    for name, r in results.items():
        _say(f"{name}: {r}")
    if any((r["allocated_mib"], r["refused_error"]) != (4096, OOM) for r in results.values()):
        _explain(hami, namespace, ("plain", "rewrites"))
    for r in results.values():
        assert (r["allocated_mib"], r["refused_error"]) == (4096, OOM), r


def test_story15b_two_pods_on_one_device_each_stop_at_their_own_limit(
    hami: HamiPool, namespace: str
) -> None:
    kube = hami.kube
    kube.apply([_devices_configmap(namespace, hami)])
    hold = "exec gpu-workload --chunk-mib 512 --max-chunks 4096 --hold-seconds 5"
    kube.apply([_workload_pod("five", namespace, 5, 0, hami, script=hold)])
    wait_until("pod five running", lambda: kube.get("pod", "five", "-n", namespace)["status"]
               .get("phase") in ("Running", "Succeeded"), 120, interval=1)
    kube.apply([_workload_pod("three", namespace, 3, 0, hami, script=hold)])
    five, three = _result(kube, namespace, "five"), _result(kube, namespace, "three")
    assert (five["allocated_mib"], five["refused_error"]) == (5120, OOM), five
    assert (three["allocated_mib"], three["refused_error"]) == (3072, OOM), three
    assert _device(kube, namespace, "five") == _device(kube, namespace, "three")


def test_story15c_a_pod_setting_the_limit_env_is_refused_at_admission(
    hami: HamiPool, namespace: str
) -> None:
    p = _workload_pod("sets-env", namespace, 4, 0, hami,
                      env=[{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "16g"}])
    proc = hami.kube.kubectl("apply", "-f", "-", input=json.dumps(p), check=False)
    assert proc.returncode != 0, proc.stdout
    assert "CUDA_DEVICE_MEMORY_LIMIT" in proc.stderr, proc.stderr


def test_story15d_a_node_that_lost_its_library_takes_no_new_slice(
    hami: HamiPool, namespace: str
) -> None:
    kube = hami.kube
    lib = hami.library
    wait_until("the node labelled as enforcing", lambda: _label(kube) == "hami-core", 60,
               interval=1)
    saved = lib.with_name("libvgpu.so.story15")
    lib.rename(saved)
    try:
        wait_until("allocatable memory 0", lambda: kube.node_resources()["allocatable"][MEM]
                   == 0, 60, interval=1)
        wait_until("the enforcement label gone", lambda: _label(kube) is None, 60, interval=1)
        wait_until("the agent not Ready", lambda: kube.ready_agent() is None, 60, interval=1)
        doc = json.loads(kube.get("node", kube.node)["metadata"]["annotations"][ENFORCEMENT])
        assert doc["ready"] is False and any(str(lib) in p for p in doc["problems"]), doc
        wait_until("the node's EnforcementUnavailable Event", lambda: any(
            e.startswith("EnforcementUnavailable") and str(lib) in e
            for e in kube.events("default", kube.node)), 60, interval=1)
        kube.apply([_devices_configmap(namespace, hami),
                    _workload_pod("waits", namespace, 4, 0, hami)])
        pending = kube.get("pod", "waits", "-n", namespace)["status"].get("phase")
        assert pending == "Pending"
    finally:
        saved.rename(lib)
    wait_until("allocatable back", lambda: kube.node_resources()["allocatable"][MEM] > 0, 60,
               interval=1)
    r = _result(kube, namespace, "waits", timeout=180)
    assert (r["allocated_mib"], r["refused_error"]) == (4096, OOM), r
    assert _label(kube) == "hami-core"


def _label(kube: Kube) -> str | None:
    labels = kube.get("node", kube.node)["metadata"].get("labels") or {}
    value = labels.get(ENFORCEMENT)
    return str(value) if value is not None else None


def test_story15e_an_auto_pool_takes_the_strongest_mode_this_node_has(
    hami: HamiPool, namespace: str, tmp_path: Path
) -> None:
    kube = hami.kube
    old = kube.ready_agent()
    kube.install("-f", _pool_values(hami.cluster_dir, tmp_path, "auto"), action="upgrade")
    try:
        _wait_rolled(kube, old["metadata"]["uid"] if old else None)
        kube.wait_agent_serving()

        def status() -> dict[str, Any] | None:
            raw = kube.get("node", kube.node)["metadata"]["annotations"].get(ENFORCEMENT)
            doc = json.loads(raw) if raw else {}
            return doc if doc.get("configured") == "auto" and doc.get("ready") else None

        doc = wait_until("the auto pool's mode in force", status, 90, interval=1)
        _say(f"auto found: {doc}")
        assert doc["mode"] == "hami-core", doc
        assert "not running" in " ".join(doc["found"]["mps"]), doc
        assert "nvidia-memory-limits" not in doc["found"]  # envvar pool: no CDI, no hook
        wait_until("the label names the mode in force", lambda: _label(kube) == "hami-core",
                   60, interval=1)
        kube.apply([_devices_configmap(namespace, hami),
                    _workload_pod("auto", namespace, 3, 0, hami)])
        r = _result(kube, namespace, "auto", timeout=180)
        assert (r["allocated_mib"], r["refused_error"]) == (3072, OOM), r
    finally:
        old = kube.ready_agent()
        kube.install("-f", _pool_values(hami.cluster_dir, tmp_path), action="upgrade")
        _wait_rolled(kube, old["metadata"]["uid"] if old else None)
        kube.wait_agent_serving()
