"""Annotations are state: one the API server refused (it was away) is written again once
it is back; Events are not retried (a duplicate Event is worse than a lost one)."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import pytest

from gpu_share.agent import publisher as publisher_mod
from gpu_share.agent.publisher import BackgroundPublisher
from gpu_share.errors import KubeAccessError
from gpu_share.observability.loops import LoopSupervisor
from testkit.harness.wait import poll


class _FlakyApi:
    """Fails every call while ``down`` is set, like a client whose server is away:
    raising, or (``quiet``, as KubePublisher does) logging it and answering False."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.down = threading.Event()
        self.pods: list[tuple[str, str, Mapping[str, str | None]]] = []
        self.nodes: list[Mapping[str, str | None]] = []
        self.events: list[str] = []
        self.calls = 0

    def _call(self) -> bool:
        self.calls += 1
        if self.down.is_set():
            if self.quiet:
                return False
            raise KubeAccessError("connection refused")
        return True

    def annotate_node(self, node_name: str, annotations: Mapping[str, str | None],
                      labels: Mapping[str, str | None] | None = None) -> bool:
        if not self._call():
            return False
        self.nodes.append(dict(annotations))
        return True

    def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> bool:
        if not self._call():
            return False
        self.pods.append((namespace, name, dict(annotations)))
        return True

    def pod_event(
        self, namespace: str, name: str, *, reason: str, message: str, warning: bool
    ) -> None:
        if self._call():
            self.events.append(reason)

    def node_event(self, node_name: str, *, reason: str, message: str, warning: bool) -> None:
        if self._call():
            self.events.append(reason)


@pytest.mark.parametrize("quiet", [False, True], ids=["raises", "answers-false"])
def test_failed_annotations_are_written_when_the_server_is_back(
    monkeypatch: pytest.MonkeyPatch, quiet: bool
) -> None:
    monkeypatch.setattr(publisher_mod, "RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(publisher_mod, "RETRY_MAX_S", 0.2)
    api = _FlakyApi(quiet)
    api.down.set()
    pub = BackgroundPublisher(
        api, "node-a", lambda: {"inv": "1"}, lambda ns, n: {"assign": f"{ns}/{n}"}
    )
    pub.start(LoopSupervisor())
    try:
        pub.pod_changed("ns", "p0")
        pub.node_changed()
        pub.event("ns", "p0", reason="Degraded", message="m", warning=True)
        assert poll(lambda: api.calls >= 6, 5)  # tried, then tried again (backoff)
        assert api.pods == [] and api.nodes == []
        api.down.clear()
        assert poll(lambda: bool(api.pods and api.nodes), 5)
        assert api.pods == [("ns", "p0", {"assign": "ns/p0"})]
        assert api.nodes == [{"inv": "1"}]
        assert api.events == []  # the Event was dropped with the outage, not replayed
        assert pub.flush(2.0)
    finally:
        pub.stop(2.0)


def test_retries_pause_and_do_not_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_mod, "RETRY_FIRST_S", 0.2)
    monkeypatch.setattr(publisher_mod, "RETRY_MAX_S", 0.4)
    api = _FlakyApi()
    api.down.set()
    pub = BackgroundPublisher(api, "node-a", lambda: {"inv": "1"}, lambda ns, n: None)
    pub.start(LoopSupervisor())
    try:
        pub.node_changed()
        threading.Event().wait(1.5)
        # 1.5 s with pauses of 0.2, 0.4, 0.4, ...: a handful of tries, not thousands.
        assert 2 <= api.calls <= 8, api.calls
    finally:
        pub.stop(2.0)
