"""What the agent's exposition promises, on prometheus_client: every family's name,
type, help and labels; no ``_created`` samples; label values made valid text and capped
(``observability.families``); the endpoint's content type."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpu_share.observability import families
from gpu_share.observability.families import MAX_LABEL_VALUE_CHARS, OVERFLOW
from gpu_share.observability.http import start_http
from gpu_share.observability.metrics import REASON_CAP, Metrics, _counter, _Table

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(data: bytes) -> list[Any]:
    return list(text_string_to_metric_families(data.decode("utf-8")))


def samples(data: bytes) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in parse(data)
        for s in f.samples
    }


# ---- the families the agent exports --------------------------------------------------

MEM = "vendor.com/vcuda-memory"

# (kind, name, help, labels) of every family of Metrics: dashboards, rules and users'
# queries depend on them, so a change here is a change of the product.
EXPORTED: list[tuple[str, str, str, tuple[str, ...]]] = [
    ("counter", "gpu_share_allocations_total",
     "Allocate answers given, by resource and by what decided the device.",
     ("resource", "source")),
    ("counter", "gpu_share_allocation_failures_total",
     "Allocate or GetPreferredAllocation calls refused, by error reason.",
     ("resource", "reason")),
    ("counter", "gpu_share_degraded_decisions_total",
     "Placements made without full pod knowledge, by why.", ("reason",)),
    ("counter", "gpu_share_identity_ambiguous_total",
     "Kubelet calls whose pod/container could not be told apart from another.", ()),
    ("gauge", "gpu_share_device_units",
     "Units of a device by resource and state (used|free).", ("device", "resource", "state")),
    ("gauge", "gpu_share_device_healthy", "1 when the device is healthy, 0 otherwise.",
     ("device",)),
    ("gauge", "gpu_share_device_cordoned",
     "1 when the device takes no new slice (running ones stay): an admin cordoned it, or "
     "DRA claims prepared before a switch to device-plugin mode may hold it; 0 otherwise.",
     ("device",)),
    ("counter", "gpu_share_dra_prepare_failures_total",
     "DRA claims the agent refused to prepare, by reason (ClaimEnforcementLowered, "
     "EnforcementUnavailable, DeviceCordoned, ClaimOverCapacity, ...).",
     ("reason",)),
    ("gauge", "gpu_share_enforcement_ready",
     "1 while the node can enforce its pool's mode (no new slices otherwise; the node Event "
     "EnforcementUnavailable says what is missing), 0 otherwise.",
     ("mode",)),
    ("counter", "gpu_share_cordon_annotations_ignored_total",
     "Cordon annotations on the node the agent ignored, by why (Malformed, UnknownDevice, "
     "TooMany).", ("reason",)),
    ("histogram", "gpu_share_allocate_seconds", "Time to answer one kubelet Allocate call.",
     ("resource",)),
    ("histogram", "gpu_share_preferred_allocation_seconds",
     "Time to answer one kubelet GetPreferredAllocation call.", ("resource",)),
    ("counter", "gpu_share_registrations_total",
     "Successful registrations with the kubelet, by resource.", ("resource",)),
    ("counter", "gpu_share_reregistrations_total",
     "Re-registrations after the kubelet restarted or removed our socket.", ()),
    ("counter", "gpu_share_ledger_writes_total", "Writes of the persisted allocation ledger.",
     ()),
    ("counter", "gpu_share_ledger_write_failures_total",
     "Writes of the ledger file that failed (disk full, EACCES, ...).", ()),
    ("counter", "gpu_share_ledger_quarantined_total",
     "Unreadable ledger files moved aside at start, by why.", ("reason",)),
    ("counter", "gpu_share_ledger_anomalies_total",
     "Loaded ledger entries that cannot be true on this node (kept), by why.", ("reason",)),
    ("counter", "gpu_share_kube_errors_total",
     "Failed calls to the API server or PodResources, by operation.", ("op",)),
    ("counter", "gpu_share_events_dropped_total",
     "Events not sent, by why (rate_limited: past an object's burst of 25, then one per 5 "
     "minutes; queue_full); the log keeps each occurrence.", ("why",)),
    ("counter", "gpu_share_loop_errors_total",
     "Failed passes of a supervised background loop (it went on after a pause).", ("loop",)),
    ("gauge", "gpu_share_memory_unit_bytes",
     "Memory unit size in bytes, configured and in use (they differ while slices cut in "
     "an older size run).", ("unit",)),
]

SUFFIXES = {"counter": ("",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}


def test_every_family_keeps_its_name_type_help_and_labels() -> None:
    m = Metrics()
    by_name = {name: family for name, _, family in m.families()}
    assert list(by_name) == [name for _, name, _, _ in EXPORTED]
    for kind, name, _, labels in EXPORTED:
        series: Any = by_name[name]
        if labels:
            series = series.labels(*(f"{n}-x" for n in labels))
        if kind == "histogram":
            series.observe(0.02)
        else:
            series.inc(3)
    text = m.render().decode()
    got = {}
    for f in parse(m.render()):
        # The parser names a counter family without _total; the TYPE line carries it.
        name = f"{f.name}_total" if f.type == "counter" else f.name
        assert f"# TYPE {name} {f.type}\n" in text
        label_sets = {(s.name, tuple(sorted(s.labels))) for s in f.samples}
        got[name] = (f.type, f.documentation, label_sets)
    want = {}
    for kind, name, doc, labels in EXPORTED:
        extra = ("le",) if kind == "histogram" else ()
        want[name] = (kind, doc, {
            (name + suffix, tuple(sorted(labels + (extra if suffix == "_bucket" else ()))))
            for suffix in SUFFIXES[kind]
        })
    assert got == want
    assert "_created" not in text


def test_unlabelled_families_are_exported_at_zero_and_labelled_ones_without_series() -> None:
    text = Metrics().render().decode()
    doc = "Writes of the persisted allocation ledger."
    assert (f"# HELP gpu_share_ledger_writes_total {doc}\n"
            "# TYPE gpu_share_ledger_writes_total counter\n"
            "gpu_share_ledger_writes_total 0.0\n") in text
    assert "# TYPE gpu_share_kube_errors_total counter\n# HELP" in text
    assert "gpu_share_kube_errors_total{" not in text


def test_a_counter_row_must_be_named_total() -> None:
    class Bad(_Table):
        prefix = "x_"
        requests = _counter("r")

    with pytest.raises(ValueError, match="_total"):
        Bad(CollectorRegistry())


def test_tables_use_their_own_registries() -> None:
    a, b = Metrics(), Metrics()  # the same names twice: no clash
    a.ledger_writes_total.inc()
    assert a.registry.get_sample_value("gpu_share_ledger_writes_total") == 1
    assert b.registry.get_sample_value("gpu_share_ledger_writes_total") == 0


# ---- label values --------------------------------------------------------------------

HOSTILE = ['a"b', "back\\slash", "new\nline", '\\"\n', "", "}{,=", "é ☃ \t", 'x\\n"y"\\']


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_label_values_round_trip(value: str) -> None:
    m = Metrics()
    m.allocation_failures_total.labels(resource=MEM, reason=value).inc(2)
    m.allocate_seconds.labels(value).observe(0.5)
    got = samples(m.render())
    assert got[("gpu_share_allocation_failures_total", (("reason", value), ("resource", MEM)))] == 2
    assert got[("gpu_share_allocate_seconds_bucket", (("le", "0.5"), ("resource", value)))] == 1
    assert got[("gpu_share_allocate_seconds_count", (("resource", value),))] == 1


def test_not_unicode_label_value_does_not_fail_the_scrape() -> None:
    m = Metrics()
    m.set_device_healthy("bad\udc80", True)
    m.kube_errors_total.labels(op="\ud800op").inc()
    got = samples(m.render())
    assert got[("gpu_share_device_healthy", (("device", "bad?"),))] == 1
    assert got[("gpu_share_kube_errors_total", (("op", "?op"),))] == 1
    m.forget_device("bad\udc80", [])  # the same value removes it
    assert ("gpu_share_device_healthy", (("device", "bad?"),)) not in samples(m.render())


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.text(max_size=40), min_size=1, max_size=5, unique=True))
def test_any_label_value_round_trips_or_is_made_valid(values: list[str]) -> None:
    m = Metrics()
    for i, v in enumerate(values):
        m.set_device_healthy(v, bool(i % 2))
    got = {dict(k[1])["device"]: v for k, v in samples(m.render()).items()
           if k[0] == "gpu_share_device_healthy"}
    want = {v.encode("utf-8", "replace").decode(): float(i % 2) for i, v in enumerate(values)}
    assert got == want


def test_labels_by_name_or_position_and_their_errors() -> None:
    m = Metrics()
    m.allocations_total.labels(resource="r", source="s").inc()
    m.allocations_total.labels("r", "s").inc()
    assert m.registry.get_sample_value(
        "gpu_share_allocations_total", {"resource": "r", "source": "s"}) == 2
    for args, kw in (((), {"resource": "r"}), (("r",), {}), (("r",), {"source": "s"}),
                     ((), {"resource": "r", "source": "s", "x": "y"})):
        with pytest.raises(ValueError):
            m.allocations_total.labels(*args, **kw)
    with pytest.raises(ValueError):
        m.identity_ambiguous_total.labels()
    with pytest.raises(ValueError):
        m.allocations_total.inc()  # a labelled family has no value of its own


# ---- bounded cardinality -------------------------------------------------------------


def test_capped_label_folds_new_values_into_overflow() -> None:
    reg = CollectorRegistry()
    c = families.Counter("e_total", "e", ["resource", "reason"], registry=reg)
    c.cap_labels({"reason": 3})
    c.labels("mem", OVERFLOW).inc()  # cannot be claimed as a value: takes no room
    for i in range(100):
        c.labels(resource="mem", reason=f"r{i % 5}").inc()
    c.labels(resource="core", reason="r0").inc()  # admitted value, other resource: kept
    c.labels(resource="mem", reason="x" * (MAX_LABEL_VALUE_CHARS + 1)).inc()
    got = samples(generate_latest(reg))
    reasons = {dict(k[1])["reason"] for k in got}
    assert reasons == {"r0", "r1", "r2", OVERFLOW}
    assert got[("e_total", (("reason", OVERFLOW), ("resource", "mem")))] == 40 + 2
    assert got[("e_total", (("reason", "r0"), ("resource", "core")))] == 1
    assert sum(got.values()) == 103
    with pytest.raises(ValueError, match="not labels"):
        c.cap_labels({"b": 1})


def test_too_long_values_and_overflow_itself_fold_while_the_cap_has_room() -> None:
    m = Metrics()
    longest = "y" * MAX_LABEL_VALUE_CHARS
    for op in (longest, longest + "y", OVERFLOW, "z" * 1000, "plain"):
        m.kube_errors_total.labels(op=op).inc()
    got = {dict(k[1])["op"]: v for k, v in samples(m.render()).items()
           if k[0] == "gpu_share_kube_errors_total"}
    assert got == {longest: 1, OVERFLOW: 3, "plain": 1}


def test_agent_metrics_bound_the_series_of_free_text_labels() -> None:
    m = Metrics()
    for i in range(10 * REASON_CAP):
        m.kube_errors_total.labels(op=f"op-{i}").inc()
        m.allocation_failures_total.labels(resource=MEM, reason=f"why-{i}").inc()
        m.loop_errors_total.labels(loop=f"loop-{i}").inc()
        m.ledger_quarantined_total.labels(f"q-{i}").inc()
    got = samples(m.render())
    for name in ("gpu_share_kube_errors_total", "gpu_share_allocation_failures_total",
                 "gpu_share_loop_errors_total", "gpu_share_ledger_quarantined_total"):
        series = {k: v for k, v in got.items() if k[0] == name}
        assert len(series) == REASON_CAP + 1
        assert sum(series.values()) == 10 * REASON_CAP


def test_labels_of_closed_sets_are_not_capped() -> None:
    m = Metrics()
    for i in range(2 * REASON_CAP):
        m.set_device_healthy(f"GPU-{i}", True)
    got = samples(m.render())
    assert sum(1 for k in got if k[0] == "gpu_share_device_healthy") == 2 * REASON_CAP


# ---- threads -------------------------------------------------------------------------


def _run_threads(n: int, work: Callable[[int], None]) -> None:
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait()
        work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)


def test_concurrent_new_values_of_a_capped_label_stay_within_the_cap() -> None:
    """Writers racing to add values past the cap while scrapes run: never more than the
    cap's series, no update lost."""
    m = Metrics()
    writers, rounds = 8, 2000
    done = threading.Event()
    problems: list[str] = []

    def scrape() -> None:
        while not done.is_set():
            n = sum(1 for k in samples(m.render()) if k[0] == "gpu_share_kube_errors_total")
            if n > REASON_CAP + 1:
                problems.append(f"{n} series")

    def write(w: int) -> None:
        for r in range(rounds):
            m.kube_errors_total.labels(op=f"op-{(w * rounds + r) % (3 * REASON_CAP)}").inc()

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        _run_threads(writers, write)
    finally:
        done.set()
        scraper.join(60)
    assert not problems, problems[:5]
    got = {k: v for k, v in samples(m.render()).items() if k[0] == "gpu_share_kube_errors_total"}
    assert len(got) == REASON_CAP + 1
    assert sum(got.values()) == writers * rounds


# ---- the endpoint --------------------------------------------------------------------


def test_metrics_endpoint_serves_the_text_format_with_its_content_type() -> None:
    m = Metrics()
    m.registrations_total.labels(resource=MEM).inc()
    handle = start_http(m.registry, bind_address="127.0.0.1", port=0)
    try:
        url = f"http://127.0.0.1:{handle.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            ctype, body = r.headers["Content-Type"], r.read()
    finally:
        handle.stop()
    assert ctype == CONTENT_TYPE_LATEST
    assert ctype.startswith("text/plain; version=")
    assert body == m.render()
    assert samples(body)[("gpu_share_registrations_total", (("resource", MEM),))] == 1
