"""A version counter that ListAndWatch streams block on."""

from __future__ import annotations

import threading
import time


class ChangeFeed:
    """Monotonic version; ``bump()`` wakes every waiter. Versions start at 1."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 1

    @property
    def version(self) -> int:
        with self._cond:
            return self._version

    def bump(self) -> int:
        with self._cond:
            self._version += 1
            self._cond.notify_all()
            return self._version

    def wait_for_change(self, seen_version: int, timeout_s: float) -> int:
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            while self._version == seen_version:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._version
