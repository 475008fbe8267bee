"""The one poll helper of the tests and benchmarks (``wait_until``), and its two short
forms: ``until`` (raises when it times out) and ``poll`` (a bool)."""

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


def until(check: Callable[[], T], timeout: float = 30.0, what: str = "",
          interval: float = 0.05) -> T:
    """``wait_until`` with a default name: the value ``check`` returned, or raises."""
    return wait_until(what or "condition", check, timeout, interval)


def poll(check: Callable[[], object], timeout_s: float = 10.0, step_s: float = 0.01) -> bool:
    """Whether ``check`` turned truthy within ``timeout_s`` (checked once more at the end)."""
    return bool(wait_until("", check, timeout_s, step_s, fail=False))
