"""Supervised background loops, each with a heartbeat.

Every background loop (the agent's health, reconcile, refresh, publisher, plugins and
kube-init; the pod and cluster-view watches) runs through ``LoopSupervisor.run``: it
calls the loop's *step* again and again until its stop event is set. A step that raises
(anything, ``RecursionError`` included) is logged -- one line, at most once per loop and
``log_every_s``, with a count of what was suppressed -- reported to ``on_error`` (the
``gpu_share_loop_errors_total`` metric), and the loop goes on after a bounded, growing
pause. Each step beats the loop's heartbeat; ``check()`` (liveness) names every loop
whose last beat is older than its own max age.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Required, TypedDict, TypeVar, Unpack

from gpu_share.errors import GpuShareError

log = logging.getLogger(__name__)

T = TypeVar("T")

LOOP_STALLED = "LoopStalled"
_MAX_ERROR_TEXT = 200  # an exception's text can hold tenant or file input: keep it short


class LoopStalledError(GpuShareError):
    """One or more loops have not beaten within their max age."""

    reason = LOOP_STALLED


@dataclass(frozen=True)
class Backoff:
    """Pause after consecutive failures: initial, doubled each time, at most ``max_s``,
    each scaled by a random factor in [0.5, 1) so loops do not retry in step."""

    initial_s: float = 0.5
    max_s: float = 30.0

    def delay(self, failures: int) -> float:
        base = min(self.max_s, self.initial_s * 2.0 ** min(max(failures - 1, 0), 32))
        return base * (0.5 + random.random() / 2)


class LoopOptions(TypedDict, total=False):
    """How ``LoopSupervisor.run`` (and ``spawn``) runs a loop."""

    max_age_s: Required[float]  # liveness fails when the loop has not beaten for longer
    stop: threading.Event | None  # default: the supervisor's stop_event
    once: bool  # stop after the first call that succeeds


@dataclass
class _Loop:
    name: str
    max_age_s: float
    last_beat: float
    failures: int = 0  # consecutive
    errors: int = 0  # in all
    last_log: float | None = None
    suppressed: int = 0


def describe_error(exc: BaseException) -> str:
    """``Type: text``, the text cut to a bounded length."""
    text = str(exc)
    if len(text) > _MAX_ERROR_TEXT:
        text = text[:_MAX_ERROR_TEXT] + f"... ({len(text)} chars)"
    return f"{type(exc).__name__}: {text}"


class LoopSupervisor:
    """Runs loops, keeps their heartbeats, answers liveness."""

    def __init__(
        self,
        *,
        on_error: Callable[[str], None] | None = None,
        backoff: Backoff | None = None,
        log_every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_error = on_error
        self._backoff = backoff or Backoff()
        self._log_every_s = log_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._loops: dict[str, _Loop] = {}
        self.stop_event = threading.Event()  # the default stop of every loop

    # ---- heartbeats -----------------------------------------------------------------

    def register(self, name: str, max_age_s: float) -> None:
        """Watch ``name`` from now on (a fresh beat); ``run`` does this itself."""
        with self._lock:
            self._loops[name] = _Loop(name, max_age_s, self._clock())

    def beat(self, name: str) -> None:
        with self._lock:
            loop = self._loops.get(name)
            if loop is not None:
                loop.last_beat = self._clock()

    def beater(self, name: str) -> Callable[[], None]:
        return lambda: self.beat(name)

    def retire(self, name: str) -> None:
        """Stop watching ``name`` (a one-shot loop that finished, a loop that stopped)."""
        with self._lock:
            self._loops.pop(name, None)

    def stale(self) -> list[tuple[str, float, float]]:
        """(name, seconds since its last beat, max age) of every loop past its max age."""
        now = self._clock()
        with self._lock:
            return [
                (lp.name, now - lp.last_beat, lp.max_age_s)
                for lp in self._loops.values()
                if now - lp.last_beat > lp.max_age_s
            ]

    def errors(self, name: str) -> int:
        with self._lock:
            loop = self._loops.get(name)
            return loop.errors if loop is not None else 0

    def alive(self) -> bool:
        return not self.stale()

    def check(self) -> bool:
        """Liveness probe: True, or raises ``LoopStalledError`` naming the stalled loops
        (a probe that raises answers "not ok" with the message)."""
        stale = self.stale()
        if not stale:
            return True
        text = ", ".join(f"loop {n} has not beaten for {age:.0f}s (max {mx:.0f}s)"
                         for n, age, mx in stale)
        log.error("liveness failing: %s", text)
        raise LoopStalledError(text)

    # ---- running --------------------------------------------------------------------

    def spawn(
        self, name: str, step: Callable[[], None], **options: Unpack[LoopOptions]
    ) -> threading.Thread:
        """``run`` in a daemon thread called ``name``."""
        self.register(name, options["max_age_s"])
        t = threading.Thread(
            target=self.run,
            args=(name, step),
            kwargs={**options, "registered": True},
            name=name,
            daemon=True,
        )
        t.start()
        return t

    def run(
        self,
        name: str,
        step: Callable[[], None],
        *,
        max_age_s: float,
        stop: threading.Event | None = None,
        once: bool = False,
        registered: bool = False,
    ) -> None:
        """Call ``step`` until ``stop`` is set (``once``: until one call succeeds)."""
        stop = stop if stop is not None else self.stop_event
        if not registered:
            self.register(name, max_age_s)
        try:
            while not stop.is_set():
                self.beat(name)
                try:
                    step()
                except Exception as exc:  # supervision: any failure, then go on
                    if stop.is_set():
                        return
                    stop.wait(self._failed(name, exc))
                    continue
                self._succeeded(name)
                if once:
                    return
        finally:
            self.retire(name)

    def _failed(self, name: str, exc: Exception) -> float:
        now = self._clock()
        with self._lock:
            loop = self._loops.setdefault(name, _Loop(name, float("inf"), now))
            loop.failures += 1
            loop.errors += 1
            delay = self._backoff.delay(loop.failures)
            due = loop.last_log is None or now - loop.last_log >= self._log_every_s
            if due:
                loop.last_log = now
                suppressed, loop.suppressed = loop.suppressed, 0
            else:
                loop.suppressed += 1
        if due:
            more = f" ({suppressed} more since the last report)" if suppressed else ""
            log.error(
                "loop %s failed: %s%s; retrying in %.1fs", name, describe_error(exc), more, delay,
                extra={"loop": name},
            )
        if self._on_error is not None:
            try:
                self._on_error(name)
            except Exception:  # a broken metric must not stop the loop
                log.debug("loop error callback failed", exc_info=True)
        return delay

    def _succeeded(self, name: str) -> None:
        with self._lock:
            loop = self._loops.get(name)
            if loop is None or loop.failures == 0:
                return
            failures, loop.failures = loop.failures, 0
        log.info("loop %s recovered after %d failure(s)", name, failures, extra={"loop": name})


class Interrupted(Exception):
    """``stop`` was set before the call finished (the call goes on, abandoned)."""


def interruptible(
    fn: Callable[[], T], stop: threading.Event, *, name: str, poll_s: float = 0.05
) -> T:
    """``fn()`` in a daemon thread; its result, or its exception re-raised, or
    ``Interrupted`` as soon as ``stop`` is set. For calls that cannot be interrupted
    themselves (NVML init, a kubelet or API call in its timeout) on a path that must
    still answer SIGTERM at once."""
    results: list[T] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def target() -> None:
        try:
            results.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=target, name=name, daemon=True).start()
    while not done.wait(poll_s):
        if stop.is_set():
            raise Interrupted(name)
    if errors:
        raise errors[0]
    return results[0]
