"""``kube.listwatch.ListWatch`` on a fake API (two callables, no network): events in
order, relist on 410, the watch closed on every exit, bounded jittered backoff, resync,
a prompt stop, heartbeats."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from gpu_share.kube.listwatch import (
    ListWatch,
    ResourceExpired,
    WatchBackoff,
    _lines,
)
from gpu_share.observability.loops import LoopSupervisor


def obj(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


def ev(etype: str, name: str, rv: str) -> dict[str, Any]:
    return {"type": etype, "object": obj(name, rv)}


class FakeWatch:
    """A watch answer: its events, then (``block``) waits until interrupted."""

    def __init__(self, events: Sequence[Mapping[str, Any]] = (), *, block: bool = False,
                 fail: BaseException | None = None) -> None:
        self.events = list(events)
        self.block = block
        self.fail = fail
        self.closed = False
        self.interrupted = threading.Event()

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        yield from self.events
        if self.fail is not None:
            raise self.fail
        if self.block:
            self.interrupted.wait(10)

    def close(self) -> None:
        self.closed = True

    def interrupt(self) -> None:
        self.interrupted.set()


class FakeApi:
    """Lists answer ``lists`` in turn (an exception is raised), the last one repeated;
    watches likewise from ``watches``. Records every call."""

    def __init__(self, lists: list[Any], watches: list[Any]) -> None:
        self.lists, self.watches = lists, watches
        self.calls: list[tuple[str, str]] = []
        self.opened: list[FakeWatch] = []

    def list(self) -> tuple[list[dict[str, Any]], str]:
        self.calls.append(("list", ""))
        got = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
        if isinstance(got, BaseException):
            raise got
        return got

    def watch(self, rv: str, timeout_s: int) -> FakeWatch:
        self.calls.append(("watch", rv))
        got = self.watches.pop(0) if len(self.watches) > 1 else self.watches[0]
        if isinstance(got, BaseException):
            raise got
        w = got() if callable(got) else got
        self.opened.append(w)
        return w


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_list(self, items: Sequence[Mapping[str, Any]]) -> None:
        self.seen.append(("LIST", ",".join(i["metadata"]["name"] for i in items)))

    def on_event(self, etype: str, o: Mapping[str, Any]) -> None:
        self.seen.append((etype, o["metadata"]["name"]))


def make(api: FakeApi, rec: Recorder, **kw: Any) -> tuple[ListWatch, list[float]]:
    sleeps: list[float] = []
    kw.setdefault("sleep", sleeps.append)
    kw.setdefault("rand", lambda: 0.5)
    lw = ListWatch("w", api.list, api.watch, on_list=rec.on_list, on_event=rec.on_event, **kw)
    return lw, sleeps


def test_events_in_order_and_the_watch_resumes_from_the_last_resource_version() -> None:
    api = FakeApi(
        [([obj("a", "5")], "10")],
        [FakeWatch([ev("ADDED", "b", "11"), ev("MODIFIED", "a", "12"),
                    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
                    ev("DELETED", "b", "16")]),
         FakeWatch([ev("ADDED", "c", "17")])],
    )
    rec = Recorder()
    lw, sleeps = make(api, rec)
    lw.step()
    lw.step()
    assert rec.seen == [("LIST", "a"), ("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b"),
                        ("ADDED", "c")]
    # One list; the second watch starts where the first ended (bookmarks count).
    assert api.calls == [("list", ""), ("watch", "10"), ("watch", "16")]
    assert lw.lists == 1 and lw.synced.is_set() and sleeps == []
    assert all(w.closed for w in api.opened)


@pytest.mark.parametrize(
    "expire",
    [
        pytest.param(lambda: ResourceExpired("old"), id="ResourceExpired"),
        pytest.param(lambda: type("ApiError", (Exception,), {"status": 410})(), id="status-410"),
        pytest.param(lambda: FakeWatch([{"type": "ERROR", "object": {
            "kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}]),
            id="error-event"),
        pytest.param(lambda: FakeWatch(fail=ResourceExpired("old")), id="mid-stream"),
    ],
)
def test_410_relists_at_once_without_a_pause(expire: Any) -> None:
    first = expire()
    watches: list[Any] = [FakeWatch([ev("ADDED", "b", "11")]), first, FakeWatch()]
    api = FakeApi([([], "10"), ([obj("b", "20")], "20")], watches)
    rec = Recorder()
    lw, sleeps = make(api, rec)
    lw.step()  # list, watch ends cleanly at 11
    lw.step()  # watch from 11: expired
    lw.step()  # relist, watch from the new list's version
    assert api.calls == [("list", ""), ("watch", "10"), ("watch", "11"), ("list", ""),
                         ("watch", "20")]
    assert rec.seen == [("LIST", ""), ("ADDED", "b"), ("LIST", "b")]
    assert sleeps == [] and lw.errors == 0 and lw.lists == 2
    assert all(w.closed for w in api.opened)


def test_expired_right_after_a_fresh_list_pauses() -> None:
    api = FakeApi([([], "10")], [ResourceExpired("old")])
    errors: list[str] = []
    lw, sleeps = make(api, Recorder(), on_error=errors.append)
    lw.step()
    lw.step()
    assert [c[0] for c in api.calls] == ["list", "watch", "list", "watch"]
    assert len(sleeps) == 2 and errors == ["w", "w"]


def test_errors_close_the_watch_relist_and_pause_bounded_and_jittered() -> None:
    boom = RuntimeError("cut")
    api = FakeApi(
        [OSError("down")] * 6 + [([], "1")],
        [lambda: FakeWatch([ev("ADDED", "a", "2")], fail=boom), FakeWatch()],
    )
    rands = iter([0.0, 0.999, 0.5, 0.0, 0.0, 0.999, 0.5, 0.5])
    errors: list[str] = []
    lw, sleeps = make(api, Recorder(), backoff=WatchBackoff(1.0, 8.0),
                      rand=lambda: next(rands), on_error=errors.append)
    for _ in range(7):
        lw.step()
    # 6 failed lists: base 1, 2, 4, 8, 8, 8 (capped), times 0.5 + rand/2.
    assert sleeps[:6] == pytest.approx([0.5, 1.999, 3.0, 4.0, 4.0, 7.996])
    assert all(s <= 8.0 for s in sleeps)
    # The 7th pass listed, watched, got an event, then the stream broke: closed, and the
    # consecutive count restarted (the event proved the watch healthy).
    assert api.opened[0].closed
    assert lw.failures == 1 and lw.errors == 7 and errors == ["w"] * 7
    assert sleeps[-1] == pytest.approx(0.75)  # first failure again: 1 * (0.5 + 0.5/2)
    assert not lw.synced.is_set()
    lw.step()  # relists after the failure
    assert [c for c in api.calls if c[0] == "list"][-1] == ("list", "")
    assert lw.synced.is_set() and lw.lists == 2


def test_backoff_delay_stays_in_its_bounds() -> None:
    b = WatchBackoff(0.5, 30.0)
    for n in range(1, 200):
        for r in (0.0, 0.3, 0.9999999, 2.0, -1.0):
            d = b.delay(n, r)
            base = min(30.0, 0.5 * 2 ** (n - 1))
            assert base / 2 <= d <= base


def test_a_failing_handler_is_a_failure_and_the_watch_is_closed() -> None:
    api = FakeApi([([], "1")], [lambda: FakeWatch([ev("ADDED", "bad", "2")])])
    rec = Recorder()

    def on_event(etype: str, o: Mapping[str, Any]) -> None:
        raise ValueError("handler bug")

    sleeps: list[float] = []
    lw = ListWatch("w", api.list, api.watch, on_list=rec.on_list, on_event=on_event,
                   sleep=sleeps.append, rand=lambda: 0.0)
    lw.step()
    assert api.opened[0].closed and lw.errors == 1 and sleeps == [0.25]
    assert not lw.synced.is_set()


def test_unknown_and_error_events_are_failures() -> None:
    api = FakeApi([([], "1")], [
        FakeWatch([{"type": "ERROR", "object": {"code": 500, "message": "etcd"}}]),
        FakeWatch([{"type": "SURPRISE", "object": {}}]),
        FakeWatch([{"type": "ADDED", "object": "not an object"}]),
        FakeWatch(),
    ])
    lw, sleeps = make(api, Recorder())
    for _ in range(3):
        lw.step()
    assert lw.errors == 3 and len(sleeps) == 3 and all(w.closed for w in api.opened)


def test_periodic_resync_relists() -> None:
    now = [0.0]
    api = FakeApi([([], "1")], [FakeWatch()])
    lw, _ = make(api, Recorder(), resync_s=100.0, clock=lambda: now[0])
    lw.step()
    now[0] = 50.0
    lw.step()
    now[0] = 100.0
    lw.step()
    assert [c[0] for c in api.calls] == ["list", "watch", "watch", "list", "watch"]
    assert lw.lists == 2


def test_stop_interrupts_the_open_watch_closes_it_and_ends_promptly() -> None:
    api = FakeApi([([], "1")], [lambda: FakeWatch(block=True)])
    sup = LoopSupervisor()
    beats: list[str] = []
    real_beat = sup.beat
    sup.beat = lambda name: (beats.append(name), real_beat(name))  # type: ignore[method-assign]
    lw = ListWatch("lw", api.list, api.watch, on_list=lambda items: None,
                   on_event=lambda e, o: None)
    t = lw.start(sup, max_age_s=60)
    deadline = time.monotonic() + 10
    while not api.opened and time.monotonic() < deadline:
        time.sleep(0.01)
    assert api.opened and lw.synced.is_set() and sup.alive()
    assert "lw" in beats  # the watch beats the supervisor's heartbeat
    t0 = time.monotonic()
    lw.stop()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 2
    w = api.opened[0]
    assert w.interrupted.is_set() and w.closed
    assert sup.stale() == [] and "lw" not in [n for n, _, _ in sup.stale()]


def test_stop_during_a_pause_ends_it() -> None:
    api = FakeApi([OSError("down")], [FakeWatch()])
    lw = ListWatch("w", api.list, api.watch, on_list=lambda items: None,
                   on_event=lambda e, o: None, backoff=WatchBackoff(30.0, 30.0))
    t = threading.Thread(target=lw.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while lw.errors == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    lw.stop()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 2


def test_failures_after_stop_are_not_reported() -> None:
    api = FakeApi([([], "1")], [lambda: FakeWatch(fail=OSError("shut down"))])
    errors: list[str] = []
    lw, sleeps = make(api, Recorder(), on_error=errors.append)
    lw.stop_event.set()
    lw.step()
    assert errors == [] and sleeps == []


class Chunks:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def stream(self, amt: Any = None, decode_content: Any = None) -> Iterator[bytes]:
        yield from self.chunks


def test_lines_split_across_chunks_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    got = list(_lines(Chunks([b'{"a":', b"1}\n\n{", b'"b":2}\n{"c"', b":3}"])))
    assert got == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
    import gpu_share.kube.listwatch as lwmod

    monkeypatch.setattr(lwmod, "MAX_EVENT_BYTES", 8)
    with pytest.raises(lwmod.WatchEventError):
        list(_lines(Chunks([b"0123456789"])))
