"""hack/local-up-cluster.sh's ``start``: a daemon must not inherit the caller's
descriptors, or a lock held while running ``up`` (hack/demo.sh's fd 9, ``flock LOCK
cmd``) stays held for as long as the cluster runs and blocks every later user."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from testkit.harness import REPO, wait_until


@pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1) missing")
def test_daemon_does_not_hold_the_callers_lock(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    script = f"""
source {REPO}/hack/local-up-cluster.sh
exec 9>{lock}
flock 9
start sleeper sleep 60
"""
    env = {**os.environ, "GPU_SHARE_CLUSTER_DIR": str(tmp_path / "cluster")}
    subprocess.run(["bash", "-c", script], env=env, check=True, timeout=30, capture_output=True)
    pid = int((tmp_path / "cluster/run/sleeper.pid").read_text())
    try:
        # The recorded pid is the daemon itself (setsid execs in place; on a busy machine
        # the exec may not have happened yet when the pid file is read).
        cmd = Path(f"/proc/{pid}/cmdline")
        assert wait_until("setsid to exec", lambda: cmd.read_bytes().split(b"\0")[0] == b"sleep",
                          10, interval=0.05, fail=False), cmd.read_bytes()
        held = {os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()}
        assert str(lock) not in held
        free = subprocess.run(["flock", "-n", str(lock), "true"], timeout=10)
        assert free.returncode == 0, "the daemon still holds the caller's lock"
    finally:
        os.kill(pid, signal.SIGKILL)
