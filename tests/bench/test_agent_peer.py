"""The agent benchmark's Go peer (bench/agent/peer: Kubernetes' sample device plugin with N
devices) still builds against the cluster's Kubernetes module graph and serves: it
registers with a kubelet, lists its devices and answers Allocate. Built here so that a
Kubernetes upgrade that breaks it fails the test command instead of ``make bench``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from testkit.harness.env import REPO, loud_skip
from testkit.kubelet_stub import KubeletStub

BUILD = REPO / "bench" / "agent" / "build-peer.sh"


def _cache() -> Path:
    return Path(os.environ.get("GPU_SHARE_CACHE", Path.home() / ".cache" / "gpu-share"))


@pytest.fixture(scope="module")
def peer() -> Path:
    if shutil.which("go") is None:
        loud_skip("the Go peer of bench/agent", "no Go toolchain")
    out = _cache() / "bench" / "peer"
    proc = subprocess.run(["bash", str(BUILD), str(out)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{BUILD} failed:\n{proc.stderr[-4000:]}"
    return out


def test_the_peer_registers_lists_and_allocates(peer: Path, sock_dir: Path) -> None:
    kubelet = KubeletStub(sock_dir).start()
    proc = subprocess.Popen(
        [str(peer)],
        env={**os.environ, "PEER_DEVICE_COUNT": "3", "PLUGIN_SOCK_DIR": str(sock_dir),
             "PEER_KUBELET_SOCKET": str(sock_dir / "kubelet.sock")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        (reg,) = kubelet.wait_for_registrations(1, timeout_s=30)
        assert reg.resource_name == "example.com/resource"
        client = kubelet.plugin(reg.endpoint).watch()
        devices = client.wait_for_list(lambda ds: len(ds) == 3, 10)
        assert sorted(d.id for d in devices) == ["Dev-1", "Dev-2", "Dev-3"]
        assert all(d.healthy for d in devices)
        resp = client.allocate(["Dev-2"])
        assert [(m.container_path, m.host_path) for m in resp.mounts] == [
            ("/tmp/Dev-2", "/tmp/Dev-2")]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out = proc.communicate(timeout=15)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        kubelet.stop()
    assert proc.returncode == 0, out[-3000:]
