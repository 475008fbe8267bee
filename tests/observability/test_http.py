from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from gpu_share.observability.http import Heartbeat, HttpHandle, start_http
from gpu_share.observability.metrics import Metrics


class Flag:
    def __init__(self, value: bool) -> None:
        self.value = value

    def __call__(self) -> bool:
        return self.value


def get(handle: HttpHandle, path: str) -> tuple[int, str, str]:
    url = f"http://127.0.0.1:{handle.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


@pytest.fixture
def served() -> Iterator[tuple[HttpHandle, Metrics, Flag, Flag]]:
    metrics, live, ready = Metrics(), Flag(True), Flag(False)
    handle = start_http(
        metrics.registry, bind_address="127.0.0.1", port=0, liveness=live, readiness=ready
    )
    try:
        yield handle, metrics, live, ready
    finally:
        handle.stop()


def test_metrics_endpoint(served: tuple[HttpHandle, Metrics, Flag, Flag]) -> None:
    handle, metrics, _, _ = served
    assert handle.port > 0
    metrics.ledger_writes_total.inc(3)
    code, ctype, body = get(handle, "/metrics")
    assert code == 200 and ctype.startswith("text/plain")
    assert "gpu_share_ledger_writes_total 3.0" in body


def test_probes_follow_their_callables(served: tuple[HttpHandle, Metrics, Flag, Flag]) -> None:
    handle, _, live, ready = served
    assert get(handle, "/healthz")[0] == 200
    assert get(handle, "/readyz")[0] == 503
    ready.value, live.value = True, False
    assert get(handle, "/readyz")[0] == 200
    assert get(handle, "/healthz")[0] == 503
    assert get(handle, "/nope")[0] == 404


def test_raising_probe_is_not_ready() -> None:
    def boom() -> bool:
        raise RuntimeError("kubelet gone")

    handle = start_http(Metrics().registry, bind_address="127.0.0.1", port=0, readiness=boom)
    try:
        code, _, body = get(handle, "/readyz")
        assert code == 503 and "kubelet gone" in body
        assert get(handle, "/healthz")[0] == 200  # no probe given: alive
    finally:
        handle.stop()
        handle.stop()  # idempotent


def test_heartbeat() -> None:
    now = [0.0]
    beat = Heartbeat(max_age_s=10, clock=lambda: now[0])
    assert beat.alive()
    now[0] = 11
    assert not beat.alive()
    beat.beat()
    assert beat.alive()
