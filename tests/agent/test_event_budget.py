"""Events about one object are rate limited like the kubelet's recorder (a burst, then
one per refill period), so a fault repeated on every kubelet call is not an API write
per call; what is not sent is counted by why, and the budget's own memory is bounded."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_share.agent.publisher import EVENT_BURST, BackgroundPublisher, EventBudget
from gpu_share.observability.loops import LoopSupervisor
from tests.agent.served_agent import FakeClock


class _Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str | None, str, str]] = []

    def annotate_node(self, node_name: str, annotations: Mapping[str, str | None],
                      labels: Mapping[str, str | None] | None = None) -> bool:
        return True

    def annotate_pod(self, namespace: str, name: str,
                     annotations: Mapping[str, str | None]) -> bool:
        return True

    def pod_event(self, namespace: str, name: str, *, reason: str, message: str,
                  warning: bool) -> None:
        self.events.append((namespace, name, message))

    def node_event(self, node_name: str, *, reason: str, message: str, warning: bool) -> None:
        self.events.append((None, node_name, message))


def test_a_burst_then_one_per_refill_period_per_object() -> None:
    clock = FakeClock()
    budget = EventBudget(burst=3, refill_s=60.0, clock=clock)
    node = (None, "node-a")
    assert [budget.take(node) for _ in range(5)] == [True, True, True, False, False]
    assert budget.take(("ns", "pod")), "another object has its own burst"
    clock.t += 59.0
    assert not budget.take(node)
    clock.t += 1.0
    assert budget.take(node) and not budget.take(node)
    clock.t += 3600.0  # refills up to the burst, not beyond
    assert [budget.take(node) for _ in range(4)] == [True, True, True, False]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0.0, 200.0)), max_size=80))
def test_never_more_than_the_burst_plus_the_refills(steps: list[tuple[int, float]]) -> None:
    clock = FakeClock()
    budget = EventBudget(burst=4, refill_s=30.0, clock=clock)
    start = clock.t
    sent: dict[int, int] = {}
    for obj, dt in steps:
        clock.t += dt
        if budget.take(("ns", f"p{obj}")):
            sent[obj] = sent.get(obj, 0) + 1
    for n in sent.values():
        assert n <= 4 + (clock.t - start) / 30.0


def test_the_buckets_kept_are_bounded() -> None:
    budget = EventBudget(burst=1, refill_s=300.0, max_objects=8, clock=FakeClock())
    for i in range(100):
        assert budget.take(("ns", f"p{i}"))
    assert len(budget._tokens) == 8
    assert budget.take(("ns", "p0")), "a forgotten object starts a fresh burst"
    assert not budget.take(("ns", "p99"))


def test_the_publisher_sends_the_burst_and_counts_the_rest() -> None:
    sink = _Sink()
    dropped: list[str] = []
    pub = BackgroundPublisher(sink, "node-a", lambda: {}, lambda ns, n: None,
                              on_event_dropped=dropped.append)
    pub.start(LoopSupervisor())
    try:
        for i in range(EVENT_BURST + 40):
            pub.event(None, "node-a", reason="DegradedAllocation", message=f"m{i}",
                      warning=True)
        pub.event("ns", "p", reason="AllocationFailed", message="x", warning=True)
        assert pub.flush(10)
    finally:
        pub.stop()
    node_events = [e for e in sink.events if e[0] is None]
    assert [m for _, _, m in node_events] == [f"m{i}" for i in range(EVENT_BURST)]
    assert ("ns", "p", "x") in sink.events
    assert dropped == ["rate_limited"] * 40


def test_a_full_queue_drops_and_counts() -> None:
    dropped: list[str] = []
    pub = BackgroundPublisher(_Sink(), "node-a", lambda: {}, lambda ns, n: None,
                              on_event_dropped=dropped.append)  # not started: nothing drains
    for i in range(1005):
        pub.event("ns", f"p{i}", reason="AllocationFailed", message="x", warning=True)
    assert dropped == ["queue_full"] * 5
