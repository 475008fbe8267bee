"""The lock every user of the one local cluster holds (tests, demo, benchmarks):
``flock`` on /tmp/gpu-share-cluster.lock (GPU_SHARE_CLUSTER_LOCK), the same file that
hack/lib/common.sh's ``cluster_lock`` takes from the shell scripts."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from typing import IO

LOCK_FILE = os.environ.get("GPU_SHARE_CLUSTER_LOCK", "/tmp/gpu-share-cluster.lock")


class _Held:
    # One open file per process: flock locks belong to the open file, so a second open
    # of the same path in this process would wait for ourselves. Re-entrant by count.
    fh: IO[str] | None = None
    depth = 0


def lock_held() -> bool:
    return _Held.fh is not None


def acquire_lock(
    timeout: float, *, on_wait: Callable[[], None] | None = None, poll: float = 2.0
) -> None:
    """Takes the cluster lock (re-entrant within this process); ``on_wait`` is called
    once if someone else holds it. TimeoutError after ``timeout`` seconds."""
    if _Held.fh is not None:
        _Held.depth += 1
        return
    fh = open(LOCK_FILE, "w")  # noqa: SIM115 - kept open while the lock is held
    deadline = time.monotonic() + timeout
    waited = False
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                fh.close()
                raise TimeoutError(
                    f"{LOCK_FILE} still held by someone else after {timeout:.0f}s"
                ) from None
            if not waited and on_wait is not None:
                on_wait()
            waited = True
            time.sleep(poll)
    _Held.fh, _Held.depth = fh, 1


def release_lock() -> None:
    if _Held.fh is None:
        return
    _Held.depth -= 1
    if _Held.depth > 0:
        return
    fcntl.flock(_Held.fh, fcntl.LOCK_UN)
    _Held.fh.close()
    _Held.fh = None


@contextlib.contextmanager
def cluster_lock(timeout: float, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    acquire_lock(timeout, on_wait=on_wait)
    try:
        yield
    finally:
        release_lock()
