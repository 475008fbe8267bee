"""One list+watch loop for every watch on the API server (the agent's node pod cache,
the extender's node and pod views).

``ListWatch`` lists, then watches from the list's resourceVersion, and hands the owner
the list (``on_list``: replace everything) and each event in order (``on_event``):

- a watch that ends cleanly (the server's ``timeoutSeconds``) is reopened from the last
  resourceVersion seen (events and bookmarks advance it); no relist;
- 410 Gone / an expired resourceVersion (as an HTTP answer or an ERROR event) relists
  at once; so does a periodic resync (``resync_s``), which repairs any event missed;
- any other failure (list, watch, a line that does not parse, the owner's handler)
  relists after a jittered exponential pause bounded by ``WatchBackoff.max_s``; it is
  logged (rate-limited) and reported to ``on_error(name)``, the signature of
  ``LoopSupervisor``'s error hook (the ``gpu_share_loop_errors_total`` metric);
- the watch answer is closed on every exit path; ``stop()`` sets the stop event and
  interrupts the open answer, and every pause waits on that event;
- ``beat()`` is called on each pass, list and event, so a supervisor's heartbeat
  (``LoopSupervisor.beater``) shows a live watch; ``start(loops)`` runs ``run`` under
  ``LoopSupervisor.spawn`` with that heartbeat.

The API is two callables (``list_fn``, ``watch_fn``), so tests pass fakes. The agent and
the extender build them on ``kube.rest`` (``rest_watch``, ``rest_paged_list``).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpu_share.errors import KubeAccessError
from gpu_share.kube.rest import ApiError, RestClient
from gpu_share.observability.loops import LoopSupervisor, describe_error

log = logging.getLogger(__name__)

__all__ = [
    "ListWatch",
    "ResourceExpired",
    "WatchBackoff",
    "WatchEventError",
    "WatchStream",
    "rest_paged_kept",
    "rest_paged_list",
    "rest_watch",
]

# One event is one object; etcd caps objects at 1.5 MiB, so this only stops a runaway.
MAX_EVENT_BYTES = 16 * 2**20
MAX_LIST_PAGES = 1000  # a server that keeps answering with a continue token
_EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")


class ResourceExpired(Exception):
    """The watch's resourceVersion is too old (HTTP 410 Gone): relist."""


class WatchEventError(KubeAccessError):
    """The watch sent an ERROR event (other than 410) or something that is no event."""


class WatchStream(Protocol):
    """An open watch: decoded events in order; ``close`` frees the connection;
    ``interrupt`` (from another thread) makes a blocked iteration end soon."""

    def __iter__(self) -> Iterator[Mapping[str, Any]]: ...

    def close(self) -> None: ...

    def interrupt(self) -> None: ...


ListFn = Callable[[], "tuple[Sequence[Mapping[str, Any]], str]"]  # (items, resourceVersion)
WatchFn = Callable[[str, int], WatchStream]  # (resourceVersion, timeout_s)


@dataclass(frozen=True)
class WatchBackoff:
    """Pause after the n-th consecutive failure: ``initial_s * 2**(n-1)``, at most
    ``max_s``, scaled by a factor in [0.5, 1) from ``rand`` (so watches do not retry in
    step)."""

    initial_s: float = 0.5
    max_s: float = 30.0

    def delay(self, failures: int, rand: float) -> float:
        base = min(self.max_s, self.initial_s * 2.0 ** min(max(failures - 1, 0), 32))
        return base * (0.5 + min(max(rand, 0.0), 1.0) / 2)


def _is_gone(exc: BaseException) -> bool:
    return isinstance(exc, ResourceExpired) or getattr(exc, "status", None) == 410


def _gone_event(obj: Mapping[str, Any]) -> bool:
    return obj.get("code") == 410 or obj.get("reason") in ("Expired", "Gone")

# A quiet watch beats once per server-side timeout: the default max age allows that, a
# read timeout and the longest pause, with room.
QUIET_SLACK_S = 180.0


class ListWatch:
    """List then watch one kind of object, until ``stop``; see the module docstring."""

    def __init__(
        self,
        name: str,
        list_fn: ListFn,
        watch_fn: WatchFn,
        *,
        on_list: Callable[[Sequence[Mapping[str, Any]]], None],
        on_event: Callable[[str, Mapping[str, Any]], None],
        stop: threading.Event | None = None,
        timeout_s: int = 300,
        resync_s: float | None = 900.0,
        backoff: WatchBackoff | None = None,
        rand: Callable[[], float] = random.random,
        sleep: Callable[[float], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
        beat: Callable[[], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        log_every_s: float = 60.0,
    ) -> None:
        self.name = name
        self._list_fn, self._watch_fn = list_fn, watch_fn
        self._on_list, self._on_event = on_list, on_event
        self.stop_event = stop if stop is not None else threading.Event()
        self._timeout_s = timeout_s
        self._resync_s = resync_s
        self._backoff = backoff or WatchBackoff()
        self._rand = rand
        self._sleep = sleep if sleep is not None else self.stop_event.wait
        self._clock = clock
        self._beat = beat
        self._on_error = on_error
        self._log_every_s = log_every_s
        self._rv: str | None = None  # None: list first
        self._listed_at = 0.0
        self._stream: WatchStream | None = None
        self._applied = 0  # events applied by the current watch
        self._last_log: float | None = None
        self._suppressed = 0
        self.synced = threading.Event()  # set by each list, cleared by a failure
        self.thread: threading.Thread | None = None  # once started
        self.lists = 0  # full lists made
        self.failures = 0  # consecutive
        self.errors = 0  # in all

    # ---- running ----------------------------------------------------------------------

    def start(
        self, loops: LoopSupervisor | None = None, *, max_age_s: float | None = None
    ) -> threading.Thread:
        """``run`` in a daemon thread (``self.thread``) supervised by ``loops``, a private
        supervisor when None (its heartbeat, unless a ``beat`` was given, is this
        watch's). ``max_age_s`` defaults to the watch timeout plus ``QUIET_SLACK_S``."""
        loops = loops or LoopSupervisor()
        if self._beat is None:
            self._beat = loops.beater(self.name)
        if max_age_s is None:
            max_age_s = self._timeout_s + QUIET_SLACK_S
        self.thread = loops.spawn(self.name, self.run, max_age_s=max_age_s, stop=self.stop_event)
        return self.thread

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.step()

    def stop(self, join_timeout_s: float | None = None) -> None:
        """Stop the watch; with ``join_timeout_s``, wait that long for its thread."""
        self.stop_event.set()
        stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.interrupt()
        if join_timeout_s is not None and self.thread is not None:
            self.thread.join(join_timeout_s)

    def step(self) -> None:
        """One pass: list when needed, then one watch until it ends. Never raises: a
        failure is reported and paused for."""
        self._tick()
        listed = self._rv is None or self._resync_due()
        try:
            if listed:
                self._relist()
            expired = self._watch(self._rv or "")
        except Exception as exc:  # any failure: report, pause, relist
            self._failed(exc)
            return
        if expired and listed and not self._applied:
            # Expired right after a fresh list: pause, or a confused server is hammered.
            self._failed(ResourceExpired(f"watch {self.name}: expired right after a list"))
        elif expired:
            log.info("watch %s: resourceVersion expired (410); relisting", self.name)
            self._rv = None

    # ---- one pass ---------------------------------------------------------------------

    def _tick(self) -> None:
        if self._beat is not None:
            self._beat()

    def _resync_due(self) -> bool:
        return self._resync_s is not None and self._clock() - self._listed_at >= self._resync_s

    def _relist(self) -> None:
        self._rv = None
        items, rv = self._list_fn()
        self._on_list(items)
        self._rv, self._listed_at = rv, self._clock()
        self.lists += 1
        self.synced.set()
        self._tick()

    def _watch(self, rv: str) -> bool:
        """Follow one watch from ``rv``; True when the resourceVersion expired."""
        self._applied = 0
        if self.stop_event.is_set():
            return False
        try:
            stream = self._watch_fn(rv, self._timeout_s)
        except Exception as exc:
            if _is_gone(exc):
                return True
            raise
        self._stream = stream
        try:
            return self._follow(stream)
        except Exception as exc:
            if _is_gone(exc):
                return True
            if self.stop_event.is_set():
                return False  # interrupted by stop()
            raise
        finally:
            self._stream = None
            with contextlib.suppress(Exception):
                stream.close()

    def _follow(self, stream: WatchStream) -> bool:
        # stop() may have run just before _stream was set: check after setting it.
        if self.stop_event.is_set():
            return False
        for event in stream:
            if self.stop_event.is_set():
                return False
            if self._event(event):
                return True
        self._recovered()
        return False

    def _event(self, event: Mapping[str, Any]) -> bool:
        """Apply one event; True when it says the resourceVersion expired."""
        etype = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, Mapping):
            raise WatchEventError(f"watch {self.name}: event without an object")
        if etype == "ERROR":
            if _gone_event(obj):
                return True
            raise WatchEventError(f"watch {self.name}: {str(obj.get('message', 'error'))[:200]}")
        if etype in _EVENT_TYPES:
            self._on_event(str(etype), obj)
            self._applied += 1
        elif etype != "BOOKMARK":
            raise WatchEventError(f"watch {self.name}: unknown event type {str(etype)[:40]!r}")
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        if rv:
            self._rv = str(rv)
        self._recovered()
        self._tick()
        return False

    # ---- failures ---------------------------------------------------------------------

    def _failed(self, exc: Exception) -> None:
        self._rv = None
        if self.stop_event.is_set():
            return
        self.synced.clear()
        self.failures += 1
        self.errors += 1
        delay = self._backoff.delay(self.failures, self._rand())
        self._report(exc, delay)
        if self._on_error is not None:
            try:
                self._on_error(self.name)
            except Exception:  # a broken metric must not stop the watch
                log.debug("watch error callback failed", exc_info=True)
        self._sleep(delay)

    def _report(self, exc: Exception, delay: float) -> None:
        now = self._clock()
        if self._last_log is not None and now - self._last_log < self._log_every_s:
            self._suppressed += 1
            return
        more = f" ({self._suppressed} more since the last report)" if self._suppressed else ""
        self._last_log, self._suppressed = now, 0
        log.warning(
            "watch %s failed: %s%s; relisting in %.1fs", self.name, describe_error(exc), more,
            delay, extra={"loop": self.name},
        )

    def _recovered(self) -> None:
        if self.failures:
            log.info("watch %s recovered after %d failure(s)", self.name, self.failures)
            self.failures = 0


def _lines(resp: Any) -> Iterator[bytes]:
    """Newline-delimited JSON events of a streaming answer."""
    buf = bytearray()
    for chunk in resp.stream(amt=None, decode_content=False):
        buf += chunk
        start = 0
        while (nl := buf.find(b"\n", start)) >= 0:
            line = bytes(buf[start:nl])
            start = nl + 1
            if line.strip():
                yield line
        del buf[:start]
        if len(buf) > MAX_EVENT_BYTES:
            raise WatchEventError(f"a watch event is larger than {MAX_EVENT_BYTES} bytes")
    if bytes(buf).strip():
        yield bytes(buf)


def _all_pages(
    op: str,
    fetch: Callable[[str | None], Mapping[str, Any]],
    keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """Every item of a paged list (``fetch(continue_token)`` answers one page) and the
    list's resourceVersion; at most MAX_LIST_PAGES pages. ``keep`` trims each item as
    its page arrives, so a long list never holds every whole object at once. Raises
    KubeAccessError."""
    items: list[dict[str, Any]] = []
    cont: str | None = None
    rv = ""
    for _ in range(MAX_LIST_PAGES):
        page = fetch(cont)
        got = page.get("items") or ()
        items.extend(got if keep is None else (keep(x) for x in got))
        meta = page.get("metadata") or {}
        rv = str(meta.get("resourceVersion") or rv)
        cont = meta.get("continue") or None
        if not cont:
            return items, rv
    raise KubeAccessError(f"{op}: too many pages")


# ---------------------------------------------------------------- on kube.rest


def rest_watch(api: RestClient, op: str, path: str, **selectors: str) -> WatchFn:
    """A ``WatchFn`` over a list path of ``api`` (``/api/v1/pods``) with ``selectors``
    (``fieldSelector=...``)."""

    def open_watch(rv: str, timeout_s: int) -> WatchStream:
        query = {"watch": True, "resourceVersion": rv, "allowWatchBookmarks": True,
                 "timeoutSeconds": timeout_s, **selectors}
        try:
            # The server ends the watch after timeout_s; the read timeout only catches
            # a connection that went silent without closing.
            return api.watch(op, path, query, timeout_s + api.t.read)
        except ApiError as e:
            if e.status == 410:
                raise ResourceExpired(op) from e
            raise

    return open_watch


def rest_paged_list(
    api: RestClient, op: str, path: str, *, page_size: int = 500, **selectors: str
) -> tuple[list[dict[str, Any]], str]:
    """Every object of a list path, page by page, and the list's resourceVersion.
    Raises KubeAccessError."""
    return rest_paged_kept(api, op, path, selectors, page_size=page_size)


def rest_paged_kept(
    api: RestClient, op: str, path: str, selectors: Mapping[str, str], *,
    page_size: int = 500, keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], str]:
    """``rest_paged_list`` with each item trimmed by ``keep`` as its page arrives."""

    def page(cont: str | None) -> Mapping[str, Any]:
        query: dict[str, Any] = {"limit": page_size, **selectors}
        if cont:
            query["continue"] = cont
        answer: Mapping[str, Any] = api.get(op, path, query)
        return answer

    return _all_pages(op, page, keep)
