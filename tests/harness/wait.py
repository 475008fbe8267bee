"""The one poll helper of the cluster-level tests and benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    what: str,
    check: Callable[[], T],
    timeout: float,
    interval: float = 1.0,
    *,
    fail: bool = True,
) -> T:
    """Calls ``check`` every ``interval`` seconds until it returns something truthy, and
    returns that. After ``timeout`` seconds: an AssertionError naming ``what`` and the
    last value, or with ``fail=False`` the last (falsy) value itself, for callers that
    assert later or only record that it did not happen. ``check`` may raise to stop early.
    """
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            if not fail:
                return last
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})"
            )
        time.sleep(interval)
