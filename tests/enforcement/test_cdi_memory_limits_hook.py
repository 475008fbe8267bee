"""NVIDIA's own createRuntime hook, `nvidia-cdi-hook apply-cuda-memory-limits` (NVIDIA
container toolkit v1.20.2, built by hack/build-cdi-hook.sh), run as a runtime runs it
against the stand-in driver: the container state on stdin, NVIDIA_GPU_MEMORY_REQUEST /
NVIDIA_GPU_MEMORY_LIMIT (MiB) in the bundle's config.json, --driver-root a directory
where the toolkit's library locator finds the stand-in's libnvidia-ml.so.1. The hook
calls nvmlDeviceSetMemoryLimits_v1 for the container's cgroup ("/sys/fs/cgroup" joined
with the "0::" line of /proc/<pid>/cgroup), and the stand-in driver then refuses that
cgroup's processes device memory past the hard limit. Watched: the limits recorded for
exactly that cgroup, the workload stopped at the limit inside it and not outside, and
the hook's failures (cgroup v1, a driver without the feature) and its silence without
the env.

The host here may be cgroup v1: a cgroup v2 hierarchy is mounted on /sys/fs/cgroup in a
private mount namespace, held by a small shell, and a fresh child cgroup there holds
the "container" process; the hook and the workloads enter that namespace (nsenter).
Root only; every process is bounded by a timeout, and the cgroup is removed after."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_share.agent import enforcement
from gpu_share.config.model import RuntimeConfig
from testkit.harness.env import REPO, loud_skip
from tests.enforcement import runtime
from tests.enforcement.conftest import Built

BUILD = REPO / "hack" / "build-cdi-hook.sh"
UUID = "NPU-cdi-hook-0"
DEVICE_MIB = 16384
REQUEST_MIB, LIMIT_MIB = 1024, 3072
MIB = 1 << 20
NO_LIMIT = 0xFFFFFFFFFFFFFFFF  # NVML_DEVICE_MEMORY_LIMIT_MAX
OOM = "CUDA_ERROR_OUT_OF_MEMORY"
# nvmlReturn_t
SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND, OPERATING_SYSTEM = 0, 2, 3, 6, 17
TIMEOUT_S = 60
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


# ---- the hook binary (built before pytest by the test command) ------------------------


@functools.cache
def _hook() -> tuple[str | None, str]:
    """(path, "") or (None, why): $GPU_SHARE_CDI_HOOK, else the cached build (no build
    here: it needs the module proxy; `make test` builds it before pytest)."""
    given = os.environ.get("GPU_SHARE_CDI_HOOK")
    if given:
        return (given, "") if os.access(given, os.X_OK) else (None, f"{given} is not executable")
    proc = subprocess.run(
        ["bash", str(BUILD), "--print"], capture_output=True, text=True, timeout=30,
        check=False,
    )
    found = re.search(r"^nvidia-cdi-hook=(\S+)$", proc.stdout, flags=re.MULTILINE)
    if proc.returncode != 0 or not found:
        return None, "nvidia-cdi-hook is not built (run hack/build-cdi-hook.sh)"
    return found.group(1), ""


@pytest.fixture
def cdi_hook(built: Built) -> str:  # built: skips unless root, builds the stand-in
    path, why = _hook()
    if path is None:
        loud_skip("nvidia-cdi-hook tests", why)
    assert path is not None
    return path


# ---- the stand-in driver as the hook and the workloads see it --------------------------


@dataclass(frozen=True)
class Driver:
    standin: Path
    root: Path  # --driver-root: usr/lib64/libnvidia-ml.so.1 -> the stand-in's
    state: Path  # GPU_SHARE_STANDIN_STATE_DIR, shared by every process of the test

    @property
    def nvml(self) -> str:
        return str(self.standin / "libnvidia-ml.so.1")

    @property
    def workload(self) -> str:
        return str(self.standin / "gpu-workload")

    def env(self, **extra: str) -> dict[str, str]:
        """The driver's env: what the hook runs with (a runtime passes a hook the env of
        its hook spec, not the container's) and the workloads' image env."""
        return {
            "PATH": PATH,
            "LD_LIBRARY_PATH": str(self.standin),
            "GPU_SHARE_STANDIN_DEVICES": f"{UUID}={DEVICE_MIB}",
            "GPU_SHARE_STANDIN_STATE_DIR": str(self.state),
            **extra,
        }


@pytest.fixture
def driver(built: Built, tmp_path: Path) -> Driver:
    root = tmp_path / "driver-root"
    (root / "usr" / "lib64").mkdir(parents=True)
    # One of the locator's search dirs under the root; it resolves the link.
    (root / "usr" / "lib64" / "libnvidia-ml.so.1").symlink_to(built.standin / "libnvidia-ml.so.1")
    state = tmp_path / "standin-state"
    state.mkdir()
    return Driver(built.standin, root, state)


# ---- a container in a cgroup v2 child cgroup, in a private mount namespace -------------

# $1: the child cgroup's path. Mounts cgroup2 on /sys/fs/cgroup (this namespace only),
# creates the cgroup, starts the container's process (waiting, as runc's init waits at
# createRuntime) and moves it there, says "ready <pid>", and waits for stdin to close;
# then kills the process and removes the cgroup.
_HOLDER = """set -eu
cg="$1"
mount -t cgroup2 none /sys/fs/cgroup
mkdir "$cg"
sleep 600 &
ctr=$!
cleanup() { kill "$ctr" 2>/dev/null || true; wait "$ctr" 2>/dev/null || true; rmdir "$cg"; }
trap cleanup EXIT
echo "$ctr" >"$cg/cgroup.procs"
echo "ready $ctr"
read -r _ || true
"""

# Moves itself into the cgroup $0, then execs the command.
_IN_CGROUP = 'echo $$ >"$0/cgroup.procs" && exec "$@"'


@dataclass
class Container:
    holder: subprocess.Popen[str]
    pid: int  # the container's process (the state's pid)
    cgroup: str  # its cgroup as the hook names it: /sys/fs/cgroup/<name>

    def enter(self, argv: Sequence[str], *, in_cgroup: bool) -> list[str]:
        """argv run in the namespace; in the container's cgroup or where pytest is."""
        ns = ["nsenter", "-t", str(self.holder.pid), "-m", "--"]
        return [*ns, "sh", "-c", _IN_CGROUP, self.cgroup, *argv] if in_cgroup else [*ns, *argv]

    def run(self, argv: Sequence[str], env: Mapping[str, str], *, in_cgroup: bool,
            stdin: str | None = None, cwd: Path | None = None,
            timeout_s: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.enter(argv, in_cgroup=in_cgroup), input=stdin, env=dict(env), cwd=cwd,
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )


def _read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline() if ready else ""


def _remove_leftover(cgroup: str, pid: int | None) -> None:
    """After a holder that did not clean up: its container process (started by it, known
    by pid) killed, the cgroup removed through a fresh mount of the hierarchy."""
    if pid is not None:
        with suppress(ProcessLookupError):
            os.kill(pid, 9)
    subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t cgroup2 none /sys/fs/cgroup && { [ ! -d "$0" ] || rmdir "$0"; }', cgroup],
        capture_output=True, timeout=TIMEOUT_S, check=False,
    )


@contextmanager
def cgroup2_container() -> Iterator[Container]:
    cgroup = f"/sys/fs/cgroup/gs-cdi-hook-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", _HOLDER, "holder",
         cgroup],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    pid: int | None = None
    err = ""
    try:
        line = _read_line(holder, 30)
        if line.startswith("ready "):
            pid = int(line.split()[1])
            yield Container(holder, pid, cgroup)
    finally:
        try:  # stdin closed: the holder cleans up and exits
            _, err = holder.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            holder.kill()
            _, err = holder.communicate()
        if holder.returncode != 0:
            _remove_leftover(cgroup, pid)
    if pid is None:
        raise AssertionError(f"no cgroup v2 container ({line!r}): {err[-2000:]}")
    if holder.returncode != 0:
        raise AssertionError(f"the container's cgroup was left to the fallback: {err[-2000:]}")


# ---- the hook, as a runtime runs a createRuntime hook ----------------------------------


def bundle_state(bundle: Path, pid: int, container_env: Mapping[str, str]) -> str:
    """Writes the bundle's config.json with the container's env; the container's state
    (the OCI runtime spec's "State") that a runtime hands the hook on stdin."""
    bundle.mkdir(parents=True, exist_ok=True)
    spec = {
        "ociVersion": "1.2.0",
        "process": {
            "args": ["gpu-workload"],
            "cwd": "/",
            "env": [f"PATH={PATH}", *(f"{k}={v}" for k, v in container_env.items())],
        },
        "root": {"path": "rootfs"},
    }
    (bundle / "config.json").write_text(json.dumps(spec))
    state = {
        "ociVersion": "1.2.0",
        "id": bundle.name,
        "status": "creating",
        "pid": pid,
        "bundle": str(bundle),
        "annotations": {},
    }
    return json.dumps(state)


def hook_argv(hook: str, driver: Driver) -> list[str]:
    return [hook, "apply-cuda-memory-limits", "--driver-root", str(driver.root),
            "--gpu-id", UUID]


def run_hook(hook: str, driver: Driver, bundle: Path, pid: int, container_env: Mapping[str, str],
             *, ctr: Container | None, hook_env: Mapping[str, str] | None = None,
             wrap: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """The hook with the state on stdin and its own env (the driver's), run in the bundle
    directory like runc's hooks; in the container's mount namespace, or (ctr None) in
    this host's behind an optional wrapper command."""
    state = bundle_state(bundle, pid, container_env)
    argv = hook_argv(hook, driver)
    env = driver.env(**dict(hook_env or {}))
    if ctr is not None:
        return ctr.run(argv, env, in_cgroup=False, stdin=state, cwd=bundle)
    return subprocess.run(
        [*wrap, *argv], input=state, env=env, cwd=bundle, capture_output=True, text=True,
        timeout=TIMEOUT_S, check=False,
    )


def limits_env(request_mib: int = REQUEST_MIB, limit_mib: int = LIMIT_MIB) -> dict[str, str]:
    return {"NVIDIA_GPU_MEMORY_REQUEST": str(request_mib),
            "NVIDIA_GPU_MEMORY_LIMIT": str(limit_mib)}


# ---- NVML through the stand-in, from another process -----------------------------------


class _SetLimits(ctypes.Structure):  # nvmlSetMemoryLimits_v1_t
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong),
                ("hardLimit", ctypes.c_ulonglong)]


class _GetLimits(ctypes.Structure):  # nvmlGetMemoryLimits_v1_t
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong),
                ("hardLimit", ctypes.c_ulonglong), ("currentUsed", ctypes.c_ulonglong)]


class _Memory2(ctypes.Structure):  # nvmlMemory_v2_t
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def nvml_ops(lib_path: str, uuid_: str, ops: list[list[Any]]) -> list[dict[str, int]]:
    """Runs NVML calls in this process (the helper's entry: see _nvml_main): ["set", ns,
    soft, hard], ["get", ns] (ns None: a NULL nameSpace), ["meminfo"]."""
    lib = ctypes.CDLL(lib_path)
    dev = ctypes.c_void_p()
    rc = lib.nvmlInit_v2()
    assert rc == SUCCESS, f"nvmlInit_v2: {rc}"
    rc = lib.nvmlDeviceGetHandleByUUID(uuid_.encode(), ctypes.byref(dev))
    assert rc == SUCCESS, f"nvmlDeviceGetHandleByUUID: {rc}"
    out: list[dict[str, int]] = []
    for op in ops:
        ns = op[1].encode() if len(op) > 1 and op[1] is not None else None
        if op[0] == "set":
            s = _SetLimits(ns, op[2], op[3])
            out.append({"rc": lib.nvmlDeviceSetMemoryLimits_v1(dev, ctypes.byref(s))})
        elif op[0] == "get":
            g = _GetLimits(ns, 0, 0, 0)
            rc = lib.nvmlDeviceGetMemoryLimits_v1(dev, ctypes.byref(g))
            out.append({"rc": rc, "soft": g.softLimit, "hard": g.hardLimit,
                        "used": g.currentUsed})
        elif op[0] == "meminfo":
            m = _Memory2(ctypes.sizeof(_Memory2) | 2 << 24, 0, 0, 0, 0)
            rc = lib.nvmlDeviceGetMemoryInfo_v2(dev, ctypes.byref(m))
            out.append({"rc": rc, "total": m.total, "free": m.free, "used": m.used})
    lib.nvmlShutdown()
    return out


def _nvml_main() -> None:
    print(json.dumps(nvml_ops(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))))


def nvml(ctr: Container, driver: Driver, ops: list[list[Any]], *, in_cgroup: bool = False,
         **env: str) -> list[dict[str, int]]:
    """nvml_ops in a fresh process in the container's namespace (its cgroup or not)."""
    code = "from tests.enforcement.test_cdi_memory_limits_hook import _nvml_main; _nvml_main()"
    proc = ctr.run(
        [sys.executable, "-c", code, driver.nvml, UUID, json.dumps(ops)],
        {**driver.env(**env), "PYTHONPATH": str(REPO)}, in_cgroup=in_cgroup, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: list[dict[str, int]] = json.loads(proc.stdout.splitlines()[-1])
    return result


def workload(ctr: Container, driver: Driver, chunk_mib: int, *, in_cgroup: bool,
             **env: str) -> dict[str, Any]:
    proc = ctr.run([driver.workload, "--chunk-mib", str(chunk_mib), "--max-chunks", "4096"],
                   driver.env(**env), in_cgroup=in_cgroup)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, f"rc {proc.returncode}: {proc.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(lines[-1])
    return out


# ---- the tests -------------------------------------------------------------------------


def test_the_hook_sets_the_containers_cgroup_limits_and_the_driver_enforces_them(
    cdi_hook: str, driver: Driver, tmp_path: Path
) -> None:
    with cgroup2_container() as ctr:
        proc = run_hook(cdi_hook, driver, tmp_path / "bundle", ctr.pid, limits_env(), ctr=ctr)
        assert proc.returncode == 0, proc.stderr[-3000:]

        # Recorded for exactly the container's cgroup, in bytes, seen by another process.
        got, root = nvml(ctr, driver, [["get", ctr.cgroup], ["get", "/sys/fs/cgroup"]])
        assert (got["rc"], got["soft"], got["hard"], got["used"]) == (
            SUCCESS, REQUEST_MIB * MIB, LIMIT_MIB * MIB, 0), got
        assert root["rc"] == NOT_FOUND, root

        # In the cgroup: the limit is the device, and one chunk past it is refused.
        for chunk in (256, 1024):
            r = workload(ctr, driver, chunk, in_cgroup=True)
            assert r["refused"] and r["refused_error"] == OOM, r
            assert (r["allocated_mib"], r["meminfo_total_mib"]) == (LIMIT_MIB, LIMIT_MIB), r
        (mem,) = nvml(ctr, driver, [["meminfo"]], in_cgroup=True)
        assert (mem["rc"], mem["total"], mem["free"]) == (SUCCESS, LIMIT_MIB * MIB,
                                                          LIMIT_MIB * MIB), mem

        # The same workload beside it (same mounts, pytest's cgroup): the whole device.
        r = workload(ctr, driver, 1024, in_cgroup=False)
        assert (r["allocated_mib"], r["meminfo_total_mib"], r["refused_error"]) == (
            DEVICE_MIB, DEVICE_MIB, OOM), r
        (mem,) = nvml(ctr, driver, [["meminfo"]])
        assert mem["total"] == DEVICE_MIB * MIB, mem


def test_the_limit_is_shared_by_every_process_of_the_cgroup(
    cdi_hook: str, driver: Driver, tmp_path: Path
) -> None:
    """One process of the container holds 2 GiB: NVML reports it against the cgroup's
    limit, and a second process there gets only the rest of the 3 GiB."""
    with cgroup2_container() as ctr:
        proc = run_hook(cdi_hook, driver, tmp_path / "bundle", ctr.pid, limits_env(), ctr=ctr)
        assert proc.returncode == 0, proc.stderr[-3000:]
        argv = [driver.workload, "--chunk-mib", "256", "--target-mib", "2048",
                "--hold-seconds", "60"]
        held = runtime.Container(
            subprocess.Popen(ctr.enter(argv, in_cgroup=True), env=driver.env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            Path(tempfile.mkdtemp(prefix="gs-held-", dir=tmp_path)),
        )
        try:
            assert runtime.wait_holding(held, TIMEOUT_S) == 2048
            (got,) = nvml(ctr, driver, [["get", ctr.cgroup]])
            assert got["used"] == 2048 * MIB, got
            r = workload(ctr, driver, 256, in_cgroup=True)
            assert (r["allocated_mib"], r["meminfo_free_mib_before"], r["refused_error"]) == (
                LIMIT_MIB - 2048, LIMIT_MIB - 2048, OOM), r
        finally:
            runtime.stop(held)
        deadline = time.monotonic() + TIMEOUT_S  # the killed holder's record is dropped
        while nvml(ctr, driver, [["get", ctr.cgroup]])[0]["used"] and time.monotonic() < deadline:
            time.sleep(0.2)
        r = workload(ctr, driver, 256, in_cgroup=True)
        assert r["allocated_mib"] == LIMIT_MIB, r


def test_on_cgroup_v1_the_hook_fails_so_the_runtime_fails_the_container(
    cdi_hook: str, driver: Driver, tmp_path: Path
) -> None:
    """Fail closed: with the limits asked for and no cgroup v2 at /sys/fs/cgroup, the
    hook exits non-zero (a createRuntime hook's failure fails the container)."""
    fs = subprocess.run(["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True,
                        text=True, timeout=TIMEOUT_S, check=False).stdout.strip()
    # This host's own cgroup v1 layout; on a v2 host, a tmpfs over /sys/fs/cgroup in a
    # private mount namespace stands in for it.
    wrap = [] if fs != "cgroup2fs" else [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        'mount -t tmpfs none /sys/fs/cgroup && exec "$@"', "v1"]
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        proc = run_hook(cdi_hook, driver, tmp_path / "bundle", sleeper.pid, limits_env(),
                        ctr=None, wrap=wrap)
    finally:
        sleeper.kill()
        sleeper.wait(TIMEOUT_S)
    assert proc.returncode != 0, proc.stderr
    assert "only supported in cgroup v2" in proc.stderr, proc.stderr


def test_without_the_env_the_hook_does_nothing(
    cdi_hook: str, driver: Driver, tmp_path: Path
) -> None:
    """Neither NVIDIA_GPU_MEMORY_REQUEST nor _LIMIT: exit 0 and nothing recorded, the
    container unlimited (so the agent must always set them where it relies on them)."""
    with cgroup2_container() as ctr:
        proc = run_hook(cdi_hook, driver, tmp_path / "bundle", ctr.pid, {}, ctr=ctr)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (got,) = nvml(ctr, driver, [["get", ctr.cgroup]])
        assert got["rc"] == NOT_FOUND, got
        r = workload(ctr, driver, 1024, in_cgroup=True)
        assert (r["allocated_mib"], r["meminfo_total_mib"]) == (DEVICE_MIB, DEVICE_MIB), r


def test_a_driver_without_memory_limits_fails_the_hook(
    cdi_hook: str, driver: Driver, tmp_path: Path
) -> None:
    with cgroup2_container() as ctr:
        proc = run_hook(cdi_hook, driver, tmp_path / "bundle", ctr.pid, limits_env(), ctr=ctr,
                        hook_env={"GPU_SHARE_STANDIN_MEMORY_LIMITS": "0"})
        assert proc.returncode != 0, proc.stderr
        assert "failed to set memory limits" in proc.stderr, proc.stderr
        assert "Not Supported" in proc.stderr, proc.stderr
        (got,) = nvml(ctr, driver, [["get", ctr.cgroup]])
        assert got["rc"] == NOT_FOUND, got


def test_the_stand_ins_nvml_memory_limits_contract(
    cdi_hook: str, driver: Driver, tmp_path: Path
) -> None:
    """The return codes NVIDIA documents for nvmlDevice{Set,Get}MemoryLimits_v1, and a
    limit past the device failing the hook."""
    dev = DEVICE_MIB * MIB
    with cgroup2_container() as ctr:
        cg = ctr.cgroup
        got = nvml(ctr, driver, [
            ["set", cg, 2 * MIB, MIB],            # soft above hard
            ["set", cg, 0, dev + MIB],            # hard above the device
            ["set", cg, dev + MIB, NO_LIMIT],     # soft above the device
            ["set", None, 0, MIB],                # no nameSpace
            ["set", cg + "/nope", 0, MIB],        # no such cgroup
            ["set", str(tmp_path), 0, MIB],       # a directory, not a cgroup
            ["get", cg + "/nope"],
            ["get", cg],                          # nothing set yet
            ["set", cg + "/", MIB, dev],          # the same cgroup, spelled with a slash
            ["get", cg],
            ["set", cg, MIB, NO_LIMIT],           # a soft limit only
            ["get", cg],
            ["set", cg, 0, NO_LIMIT],             # clears
            ["get", cg],
        ])
        assert [g["rc"] for g in got] == [
            INVALID_ARGUMENT, INVALID_ARGUMENT, INVALID_ARGUMENT, INVALID_ARGUMENT,
            OPERATING_SYSTEM, OPERATING_SYSTEM, OPERATING_SYSTEM, NOT_FOUND,
            SUCCESS, SUCCESS, SUCCESS, SUCCESS, SUCCESS, NOT_FOUND,
        ], got
        assert (got[9]["soft"], got[9]["hard"]) == (MIB, dev), got[9]
        assert (got[11]["soft"], got[11]["hard"]) == (MIB, NO_LIMIT), got[11]
        # A hard limit of none: the container sees the whole device.
        nvml(ctr, driver, [["set", cg, MIB, NO_LIMIT]])
        r = workload(ctr, driver, 1024, in_cgroup=True)
        assert r["allocated_mib"] == DEVICE_MIB, r

        off = nvml(ctr, driver, [["get", cg], ["set", cg, 0, MIB]],
                   GPU_SHARE_STANDIN_MEMORY_LIMITS="0")
        assert [g["rc"] for g in off] == [NOT_SUPPORTED, NOT_SUPPORTED], off

        proc = run_hook(cdi_hook, driver, tmp_path / "bundle", ctr.pid,
                        limits_env(REQUEST_MIB, DEVICE_MIB + 1), ctr=ctr)
        assert proc.returncode != 0 and "Invalid Argument" in proc.stderr, proc.stderr
        # Only the limit: the request defaults to it.
        proc = run_hook(cdi_hook, driver, tmp_path / "bundle", ctr.pid,
                        {"NVIDIA_GPU_MEMORY_LIMIT": str(LIMIT_MIB)}, ctr=ctr)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (got1,) = nvml(ctr, driver, [["get", cg]])
        assert (got1["soft"], got1["hard"]) == (LIMIT_MIB * MIB, LIMIT_MIB * MIB), got1


def test_the_agents_own_slice_is_limited_through_its_cdi_spec(
    cdi_hook: str, driver: Driver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole chain of the nvidia-memory-limits mode: the agent (dummy devices, real
    gRPC, a kubelet-side stub) allocates a 3-unit slice; its response names the slice's
    CDI devices; they are resolved through the spec the agent writes (its hook-only
    devices), and each hook they carry is run as a runtime would with the response's env
    in the container's spec; the workload in the container's cgroup then stops at 3 GiB."""
    from gpu_share.agent.cdi import CdiSpecWriter
    from gpu_share.devices.dummy import DummyBackend
    from testkit.harness.nvidia_limits import fake_node
    from tests.agent.served_agent import rig_with
    from tests.enforcement.slices import Node

    # The node can enforce: cgroup v2 (the namespace below), the hook, the driver's NVML.
    fake_node(tmp_path, monkeypatch, v2=True, hook=True, nvml=driver.nvml)
    runtime_section = {
        "enforcement": "nvidia-memory-limits",
        "deviceListStrategy": ["cdi-cri"],
        "nvidiaMemoryLimits": {"hookPath": cdi_hook, "driverRoot": str(driver.root)},
    }
    with rig_with({"runtime": runtime_section, "memoryUnitMiB": 1024}) as rig:
        assert rig.agent is not None
        resp = Node(rig, runtime.HostImage("")).slice("a", 3)
        devs = rig.agent.backend.devices()
        table = ";".join(f"{d.uuid}={d.memory_mib}" for d in devs)
        writer = CdiSpecWriter(rig.cfg, devs, DummyBackend(rig.cfg.dummy, "node-a").naming(),
                               spec_dir=str(tmp_path / "cdi"), scan_dirs=())
        writer.write()
    envs = dict(resp.envs)
    assert envs["NVIDIA_GPU_MEMORY_LIMIT"] == envs["NVIDIA_GPU_MEMORY_REQUEST"] == "3072"
    spec = json.loads(writer.hook_path.read_text())
    by_name = {f"{spec['kind']}={d['name']}": d for d in spec["devices"]}
    names = [c.name for c in resp.cdi_devices]
    hooks = [h for n in names if n in by_name for h in by_name[n]["containerEdits"]["hooks"]]
    assert len(hooks) == 1 and hooks[0]["hookName"] == "createRuntime", names

    with cgroup2_container() as ctr:
        state = bundle_state(tmp_path / "bundle", ctr.pid, envs)
        proc = ctr.run([hooks[0]["path"], *hooks[0]["args"][1:]],
                       driver.env(GPU_SHARE_STANDIN_DEVICES=table), in_cgroup=False,
                       stdin=state, cwd=tmp_path / "bundle")
        assert proc.returncode == 0, proc.stderr[-3000:]
        r = workload(ctr, driver, 512, in_cgroup=True, GPU_SHARE_STANDIN_DEVICES=table,
                     **{k: v for k, v in envs.items() if k.endswith("VISIBLE_DEVICES")})
        assert (r["allocated_mib"], r["refused_error"], r["meminfo_total_mib"]) == (
            3072, OOM, 3072), r


def test_the_agent_reads_the_real_hooks_version(cdi_hook: str) -> None:
    """The node check's version read (a hook older than 1.20.1 lacks the subcommand)."""
    assert enforcement.hook_version(cdi_hook) == "NVIDIA CDI Hook version 1.20.2"
    rt = RuntimeConfig.model_validate({"enforcement": "nvidia-memory-limits",
                                       "nvidiaMemoryLimits": {"hookPath": cdi_hook}})
    assert not any("toolkit's hook" in p for p in enforcement.check_nvidia_memory_limits(rt))
