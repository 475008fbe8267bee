"""One agent per state dir: an exclusive, non-blocking ``flock`` on
``<stateDir>/agent.lock``, taken before any socket or the ledger is touched.

The kernel drops the lock when the process ends, however it ends, so a crashed agent
never blocks its successor. The file is never removed (removing it would let two
processes lock two different files of the same name); it holds the owner's pid, for the
message a second agent prints.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from gpu_share.errors import GpuShareError

LOCK_FILE = "agent.lock"
AGENT_ALREADY_RUNNING = "AgentAlreadyRunning"
STATE_DIR_UNUSABLE = "StateDirUnusable"


class InstanceLockError(GpuShareError):
    """Another agent holds the state dir, or the lock cannot be taken at all."""

    reason = AGENT_ALREADY_RUNNING


class InstanceLock:
    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise ``InstanceLockError`` at once (never waits)."""
        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise InstanceLockError(
                f"cannot open {self.path}: {exc}", reason=STATE_DIR_UNUSABLE
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            raise InstanceLockError(
                f"another gpu-share agent{owner} holds {self.path}: one agent per state"
                " directory; this one exits without touching its sockets or ledger"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise InstanceLockError(
                f"cannot lock {self.path}: {exc}", reason=STATE_DIR_UNUSABLE
            ) from exc
        with contextlib.suppress(OSError):  # the pid is only for messages
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock


def _read_owner(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        if text.isdigit():
            return f" (pid {int(text)})"
    return ""
