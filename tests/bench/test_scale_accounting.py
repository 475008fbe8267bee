"""bench.scale's accounting of a stream: the machine's CPU per process kind (bench/scale/cpu.py,
idle use taken out per bound pod) and the API server's requests (bench/scale/apiserver.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.scale import cpu


def _sample(by_name: dict[str, float], busy: float, total: float, steal: float = 0) -> cpu.Sample:
    return cpu.Sample(by_name, busy, steal, total)


def test_usage_is_the_difference_and_other_is_what_no_listed_process_accounts_for() -> None:
    before = _sample({"kube-apiserver": 10.0, "etcd": 5.0, "bench": 1.0}, busy=100, total=400)
    after = _sample(
        {"kube-apiserver": 16.0, "etcd": 5.0, "bench": 2.0}, busy=110, total=420, steal=1
    )
    use = cpu.usage(before, after, wall_s=10)
    # etcd spent nothing: not listed; 10 busy seconds, 7 of them accounted for.
    assert use.seconds == pytest.approx({"kube-apiserver": 6.0, "bench": 1.0, "other": 3.0})
    assert use.busy_cores == pytest.approx(1.0)
    assert use.steal_pct == pytest.approx(5.0)


def test_per_pod_takes_out_what_each_process_spends_idle() -> None:
    use = cpu.Usage({"kube-apiserver": 6.0, "kwok": 2.0}, wall_s=10, busy_cores=0.8)
    idle = cpu.Usage({"kube-apiserver": 0.5, "kwok": 1.0}, wall_s=5, busy_cores=0.3)
    # apiserver: 6 - 0.1 core x 10 s = 5 s over 100 pods; kwok: 2 - 0.2 x 10 = 0.
    assert use.per_pod_ms(100, idle) == pytest.approx({"kube-apiserver": 50.0, "kwok": 0.0})
    assert use.per_pod_ms(100) == pytest.approx({"kube-apiserver": 60.0, "kwok": 20.0})
    assert use.per_pod_ms(0, idle) == {}
    note = use.note(100, idle)
    assert note.startswith("CPU ms per bound pod, above idle: kube-apiserver 50.0, kwok 0.0")
    assert "total 50.0" in note and "busy 0.80 cores (idle 0.30)" in note


def test_a_sample_finds_a_busy_child_by_its_pid_and_this_process_as_the_bench() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        s0, t0 = cpu.sample(child.pid), time.monotonic()
        time.sleep(1.0)
        use = cpu.usage(s0, cpu.sample(child.pid), time.monotonic() - t0)
    finally:
        child.kill()
        child.wait()
    assert use.seconds.get("extender", 0) > 0.3  # the spinning child, counted by pid
    assert "bench" in cpu.sample().by_name
    assert use.busy_cores > 0


def test_component_names_match_their_truncated_comm() -> None:
    # /proc/<pid>/comm holds 15 bytes: kube-controller-manager reads "kube-controller".
    assert cpu.BY_COMM["kube-controller"] == "kube-controller-manager"
    assert all(len(k) <= 15 for k in cpu.BY_COMM)


METRICS = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 7
apiserver_request_total{code="409",resource="pods",subresource="",verb="POST"} 1
apiserver_request_total{code="200",resource="resourceclaims",subresource="status",verb="PUT"} 4
# HELP apiserver_request_duration_seconds x
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_count{resource="pods",verb="POST"} 99
"""


def test_the_api_servers_requests_by_verb_and_resource_per_bound_pod() -> None:
    from bench.scale import apiserver

    after = apiserver.parse(METRICS)
    # Codes summed; other families (the duration histogram) not counted.
    assert after == {"POST pods": 8, "PUT resourceclaims/status": 4}
    before = apiserver.parse(METRICS.replace("} 7", "} 3"))
    note = apiserver.note(before, after, pods=2)
    assert note == ("API server requests per bound pod (all clients): POST pods 2.00; all 2.00")
    assert apiserver.note(after, after, pods=2).endswith(": -")
