"""Stopping a child process the tests or benchmarks started."""

from __future__ import annotations

import signal
import subprocess
from typing import Any


def stop_process(
    proc: subprocess.Popen[Any], *, grace_s: float, kill_wait_s: float, sig: int = signal.SIGTERM
) -> None:
    """If ``proc`` still runs: ``sig`` (SIGTERM by default), up to ``grace_s`` for it to
    exit, then SIGKILL and up to ``kill_wait_s``."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=kill_wait_s)
