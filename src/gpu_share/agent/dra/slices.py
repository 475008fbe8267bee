"""DRA mode: keeps the node's ResourceSlice in step with the inventory.

A supervised loop (``observability.loops``) rebuilds the slice content from the
inventory every pass (cheap: a few devices), publishes it when its digest differs from
what was last published (a health change, a new memory unit size) and, whatever the
digest, every ``resync_s`` (someone may have deleted or edited the slice). A failed
publish is logged and counted by the supervisor (``gpu_share_loop_errors_total{loop=
"dra-slices"}``) and reported to ``on_error`` (``AgentMetrics.kube_error``:
``gpu_share_kube_errors_total{op="resourceslices"}``); the supervisor retries after a
growing pause and the content stays due, so nothing is lost. The loop never raises into
the agent.

A kubelet that starts deletes every ResourceSlice of its node (in the background, retried
until it succeeds, possibly after our driver registered again), and so does one that lost
the driver for a while. ``recheck()`` (called on each registration) therefore checks the
slice at once and a few more times over the next two minutes: each check is one LIST,
and a write only when the slice is missing or differs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from gpu_share.observability.loops import LoopSupervisor
from gpu_share.sharing.dra.slices import SliceContent

log = logging.getLogger(__name__)

__all__ = ["DRA_SLICES_LOOP", "KUBE_OP", "DraSliceLoop", "SliceSink"]

DRA_SLICES_LOOP = "dra-slices"
RESYNC_S = 300.0
# The loop wakes at least this often (heartbeat, stop, inventory read).
IDLE_WAIT_S = 1.0
# A publish is a few API calls per attempt (kube.resourceslices.MAX_ATTEMPTS), each
# bounded by the client's timeouts (about 20 s): room for all of them.
MAX_AGE_S = 300.0
# The operation named to ``on_error`` (a kube_errors_total label value).
KUBE_OP = "resourceslices"
# Seconds after a registration at which the slice is checked again (see the module doc).
RECHECK_AFTER_S = (0.0, 3.0, 10.0, 30.0, 60.0, 120.0)


class SliceSink(Protocol):
    """Where the slice goes (``kube.resourceslices.ResourceSlicePublisher``)."""

    def publish(self, content: SliceContent) -> object:
        """Raises on failure."""
        ...

    def remove_all(self) -> int: ...


def _ignore(_op: str) -> None:
    pass


class DraSliceLoop:
    """Publishes the slice from a supervised thread; see the module docstring.

    ``content()``: the slice the node's current device table makes (``slice_content``);
    ``wait_for_change(seen, timeout)``: blocks until the inventory's version differs
    from ``seen`` (``ChangeFeed``) and returns the new one.
    """

    def __init__(
        self,
        sink: SliceSink,
        content: Callable[[], SliceContent],
        *,
        wait_for_change: Callable[[int, float], int] | None = None,
        resync_s: float = RESYNC_S,
        on_error: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sink = sink
        self._content = content
        self._wait = wait_for_change
        self._resync_s = resync_s
        self._on_error = on_error or _ignore
        self._clock = clock
        self._stop = threading.Event()
        self._poke = threading.Event()
        self._seen = 0  # the inventory version of the last pass
        self._published: str | None = None  # digest last published
        self._resync_at = 0.0
        self._rechecks: list[float] = []  # clock times of pending checks
        self._rechecks_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._supervisor: LoopSupervisor | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self, supervisor: LoopSupervisor | None = None) -> threading.Thread:
        self._supervisor = supervisor or LoopSupervisor()
        self._thread = self._supervisor.spawn(
            DRA_SLICES_LOOP, self.step, max_age_s=MAX_AGE_S, stop=self._stop
        )
        return self._thread

    def changed(self) -> None:
        """Publish soon (e.g. health changed where no feed is wired)."""
        self._poke.set()

    def recheck(self, after_s: tuple[float, ...] = RECHECK_AFTER_S) -> None:
        """Check the slice on the API server at these delays from now (the kubelet
        registered the driver: it may have wiped the node's slices, or be about to)."""
        now = self._clock()
        with self._rechecks_lock:
            self._rechecks = sorted({*self._rechecks, *(now + d for d in after_s)})
        self._poke.set()

    def stop(self, *, remove: bool, timeout_s: float = 5.0) -> bool:
        """Stop the loop; with ``remove`` (uninstall, clean exit) delete the node's slices.
        True when they were removed (or not asked to); never raises."""
        self._stop.set()
        self._poke.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if not remove:
            return True
        try:
            n = self._sink.remove_all()
        except Exception as exc:  # at exit: say so, do not fail the shutdown
            log.warning("could not remove the node's resource slices: %s", exc)
            self._failed()
            return False
        log.info("resource slices removed", extra={"count": n})
        return True

    # ---------------------------------------------------------------- one pass

    def step(self) -> None:
        """Publish if due, then wait (bounded) for a change. Raises when publishing
        failed (the supervisor logs, counts and pauses)."""
        version = self._seen
        content = self._content()
        now = self._clock()
        with self._rechecks_lock:
            recheck = bool(self._rechecks) and self._rechecks[0] <= now
        if content.digest != self._published or now >= self._resync_at or recheck:
            self._publish(content)
            # Done only once published: a failed check stays due.
            with self._rechecks_lock:
                self._rechecks = [t for t in self._rechecks if t > now]
        self._idle(version)

    def _publish(self, content: SliceContent) -> None:
        try:
            self._sink.publish(content)
        except Exception:
            self._failed()
            raise
        self._published = content.digest
        self._resync_at = self._clock() + self._resync_s

    def _idle(self, version: int) -> None:
        if self._wait is not None:
            self._seen = self._wait(version, IDLE_WAIT_S)
        else:
            self._poke.wait(IDLE_WAIT_S)
        self._poke.clear()

    def _failed(self) -> None:
        try:
            self._on_error(KUBE_OP)
        except Exception:  # a broken metric must not break publishing
            log.debug("slice error callback failed", exc_info=True)
