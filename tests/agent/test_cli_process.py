"""L2: ``gpu-share-plugin`` as a real process, standalone on the dummy backend."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.host_agent import agent_argv
from tests.support.kubelet_stub import FakePodResources, KubeletStub, wait_until


@pytest.fixture
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gsc-", dir="/tmp"))
    (d / "dp").mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _spawn(d: Path, *extra: str, env_extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_SHARE_", "KUBE"))}
    env.update(env_extra or {})
    env.update(
        {
            "GPU_SHARE_IDENTITY__USE_API_SERVER": "false",
            "GPU_SHARE_PUBLISH__NODE_ANNOTATION": "false",
            "GPU_SHARE_PUBLISH__POD_ANNOTATION": "false",
            "GPU_SHARE_PUBLISH__EVENTS": "false",
            "GPU_SHARE_DUMMY__FAULT_FILE": str(d / "faults.json"),
        }
    )
    return subprocess.Popen(
        [
            *agent_argv("n1", str(d / "dp"), str(d / "pr.sock"), str(d / "state"), 0),
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_serves_registers_and_cleans_up_on_sigterm(workdir: Path) -> None:
    kubelet = KubeletStub(workdir / "dp").start()
    pr = FakePodResources(workdir / "pr.sock").start()
    proc = _spawn(workdir, "--metrics-port", "19431")
    try:
        assert kubelet.wait_for_registrations(2, timeout_s=20), proc.stdout
        sockets = sorted(p.name for p in (workdir / "dp").iterdir())
        assert sockets == [
            "gpu-share-vcuda-core.sock",
            "gpu-share-vcuda-memory.sock",
            "kubelet.sock",
        ]
        client = kubelet.plugin("gpu-share-vcuda-memory.sock").watch()
        assert len(client.wait_for_list(lambda ds: len(ds) > 0)) == 4 * 16
        ready = wait_until(lambda: _get("http://127.0.0.1:19431/readyz") == 200, 10)
        assert ready
        body = urllib.request.urlopen("http://127.0.0.1:19431/metrics", timeout=5).read()
        assert b"gpu_share_registrations_total" in body
        client.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
        left = sorted(p.name for p in (workdir / "dp").iterdir())
        assert left == ["kubelet.sock"]  # ours removed, the kubelet's untouched
        assert (workdir / "state" / "ledger.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        pr.stop()
        kubelet.stop()


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except Exception:
        return 0


def test_invalid_config_exits_2_naming_the_key(workdir: Path) -> None:
    cfg = workdir / "c.yaml"
    cfg.write_text("version: v1\ndummy:\n  memoryMib: 3\n")
    proc = _spawn(workdir, "--config", str(cfg))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "dummy.memoryMib" in out


def test_unknown_config_version_is_refused(workdir: Path) -> None:
    cfg = workdir / "c.yaml"
    cfg.write_text("version: v7\n")
    proc = _spawn(workdir, "--config", str(cfg))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "v7" in out and "v1" in out


def test_device_list_over_1mib_is_refused_with_a_unit_suggestion(workdir: Path) -> None:
    # 64 devices x 80 GiB at 1 MiB units: over five million ids, far over the limit.
    proc = _spawn(
        workdir,
        "--memory-unit-mib",
        "1",
        "--dummy-device-count",
        "64",
        env_extra={"GPU_SHARE_DUMMY__MEMORY_MIB": "81920"},
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "memoryUnitMiB" in out, out
