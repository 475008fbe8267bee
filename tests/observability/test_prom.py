"""observability.prom: the agent's own text exposition (0.0.4), checked against
``prometheus_client`` (a test dependency only): what it writes for the same metrics,
and what its parser reads back from ours."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from typing import Any

import prometheus_client as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpu_share.observability import prom
from gpu_share.observability.http import start_http
from gpu_share.observability.metrics import LATENCY_BUCKETS, REASON_CAP, Metrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(data: bytes) -> list[Any]:
    return list(text_string_to_metric_families(data.decode("utf-8")))


def samples(data: bytes) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in parse(data)
        for s in f.samples
    }


# ---- same families as prometheus_client wrote before --------------------------------

MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"

# What observability/metrics.py declared with prometheus_client before it moved to
# observability.prom (kind, name, help, labels): the exposition must not change.
OLD: list[tuple[str, str, str, tuple[str, ...]]] = [
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
     ["reason"]),
    ("gauge", "gpu_share_enforcement_ready",
     "1 while the node can enforce its pool's mode (no new slices otherwise; the node Event "
     "EnforcementUnavailable says what is missing), 0 otherwise.",
     ["mode"]),
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
    ("counter", "gpu_share_loop_errors_total",
     "Failed passes of a supervised background loop (it went on after a pause).", ("loop",)),
    ("gauge", "gpu_share_memory_unit_bytes",
     "Memory unit size in bytes, configured and in use (they differ while slices cut in "
     "an older size run).", ("unit",)),
]


def _old_metrics() -> tuple[pc.CollectorRegistry, dict[str, Any]]:
    reg = pc.CollectorRegistry()
    made: dict[str, Any] = {}
    for kind, name, doc, labels in OLD:
        if kind == "counter":
            made[name] = pc.Counter(name, doc, labels, registry=reg)
        elif kind == "gauge":
            made[name] = pc.Gauge(name, doc, labels, registry=reg)
        else:
            made[name] = pc.Histogram(name, doc, labels, buckets=LATENCY_BUCKETS, registry=reg)
    return reg, made


def _new_metrics() -> tuple[prom.Registry, dict[str, Any]]:
    m = Metrics()
    return m.registry, {f.name: f for f in m.registry.families()}


def _exercise(made: dict[str, Any]) -> None:
    """The same updates on either side, one or two series per family."""
    for kind, name, _doc, labels in OLD:
        metric = made[name]
        targets = [metric] if not labels else [
            metric.labels(**{n: f"{n}-{i}" for n in labels}) for i in range(2)
        ]
        for t in targets:
            if kind == "counter":
                t.inc(3)
            elif kind == "gauge":
                t.set(2.5)
            else:
                for v in (0.0003, 0.02, 7.0):
                    t.observe(v)


def _shape(data: bytes, *, drop_created: bool) -> dict[str, tuple[str, str, set[Any]]]:
    out = {}
    for f in parse(data):
        if drop_created and f.name.endswith("_created"):
            continue
        label_sets = {(s.name, tuple(sorted(s.labels))) for s in f.samples}
        out[f.name] = (f.type, f.documentation, label_sets)
    return out


def test_the_families_are_those_prometheus_client_wrote() -> None:
    old_reg, old = _old_metrics()
    new_reg, new = _new_metrics()
    assert set(new) == set(old)  # no metric added or lost on either side of this table
    for made in (old, new):
        _exercise(made)
    old_data, new_data = pc.generate_latest(old_reg), new_reg.expose()
    # The client's extra `*_created` gauges (creation timestamps) are not written any more.
    assert _shape(new_data, drop_created=False) == _shape(old_data, drop_created=True)
    old_samples = {k: v for k, v in samples(old_data).items() if not k[0].endswith("_created")}
    assert samples(new_data) == old_samples
    # Untouched, too: the same family lines (HELP/TYPE of labelled families with no series).
    assert _shape(Metrics().render(), drop_created=False) == _shape(
        pc.generate_latest(_old_metrics()[0]), drop_created=True
    )


def test_type_and_help_lines_name_the_counter_with_its_total_suffix() -> None:
    text = Metrics().render().decode()
    assert "# TYPE gpu_share_ledger_writes_total counter\n" in text
    doc = "Writes of the persisted allocation ledger."
    assert f"# HELP gpu_share_ledger_writes_total {doc}\n" in text
    assert "\ngpu_share_ledger_writes_total 0.0\n" in text
    assert "_created" not in text


# ---- values, labels, help ------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [0.0, -1.5, 3.0, 1e300, -2.5e-300, 5e-324, 123456789012345.0, 0.1,
              math.inf, -math.inf, math.nan],
)
def test_gauge_values_round_trip(value: float) -> None:
    reg = prom.Registry()
    prom.Gauge("g", "a gauge", registry=reg).set(value)
    got = samples(reg.expose())[("g", ())]
    assert (math.isnan(got) and math.isnan(value)) or got == value


def test_float_formatting() -> None:
    f = prom.format_float
    assert (f(math.inf), f(-math.inf), f(math.nan)) == ("+Inf", "-Inf", "NaN")
    assert (f(1), f(0.00025), f(1e16), f(-0.0)) == ("1.0", "0.00025", "1e+16", "-0.0")


HOSTILE = ['a"b', "back\\slash", "new\nline", '\\"\n', "", "}{,=", "é ☃ \t", 'x\\n"y"\\']


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_label_values_round_trip(value: str) -> None:
    reg = prom.Registry()
    c = prom.Counter("c_total", "c", ["a", "b"], registry=reg)
    c.labels(a=value, b="plain").inc(2)
    h = prom.Histogram("h", "h", ["a"], buckets=[1.0], registry=reg)
    h.labels(value).observe(0.5)
    got = samples(reg.expose())
    assert got[("c_total", (("a", value), ("b", "plain")))] == 2
    assert got[("h_bucket", (("a", value), ("le", "1.0")))] == 1
    assert got[("h_count", (("a", value),))] == 1


def test_escaping_is_exactly_that_of_the_format() -> None:
    assert prom.escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    assert prom.escape_help('a\\b"c\nd') == 'a\\\\b"c\\nd'  # HELP keeps double quotes
    reg = prom.Registry()
    prom.Gauge("g", 'say "hi"\\\nnow', ["l"], registry=reg).labels('q"\\\n').set(1)
    assert reg.expose().decode() == (
        '# HELP g say "hi"\\\\\\nnow\n# TYPE g gauge\ng{l="q\\"\\\\\\n"} 1.0\n'
    )


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.text(max_size=40), min_size=1, max_size=5, unique=True),
       doc=st.text(max_size=60))
def test_any_label_value_and_help_text_round_trip(values: list[str], doc: str) -> None:
    reg = prom.Registry()
    g = prom.Gauge("g", doc, ["v"], registry=reg)
    for i, v in enumerate(values):
        g.labels(v=v).set(i)
    data = reg.expose()
    assert data.decode().startswith(f"# HELP g {prom.escape_help(doc)}\n# TYPE g gauge\n")
    (family,) = parse(data)
    # That parser strips each line's ends (Prometheus does not): compare what it keeps.
    assert family.documentation.strip() == doc.strip()
    assert {s.labels["v"]: s.value for s in family.samples} == {
        v: float(i) for i, v in enumerate(values)
    }


def test_not_unicode_label_value_does_not_fail_the_scrape() -> None:
    reg = prom.Registry()
    prom.Counter("c_total", "c", ["l"], registry=reg).labels("bad\udc80").inc()
    assert samples(reg.expose())[("c_total", (("l", "bad?"),))] == 1


# ---- histograms ----------------------------------------------------------------------


def test_histogram_buckets_are_cumulative_with_inf_sum_and_count() -> None:
    reg = prom.Registry()
    h = prom.Histogram("lat_seconds", "latency", buckets=[0.1, 0.5, 1.0], registry=reg)
    observed = [0.1, 0.05, -3.0, 0.1000001, 0.5, 0.7, 1.0, 2.0, math.inf]
    for v in observed:
        h.observe(v)
    (family,) = parse(reg.expose())
    assert family.type == "histogram"
    buckets = [(s.labels["le"], s.value) for s in family.samples if s.name.endswith("_bucket")]
    # le is inclusive: 0.1 counts in le=0.1; +Inf counts everything.
    assert buckets == [("0.1", 3), ("0.5", 5), ("1.0", 7), ("+Inf", 9)]
    by = {s.name: s.value for s in family.samples if not s.name.endswith("_bucket")}
    assert by == {"lat_seconds_count": 9, "lat_seconds_sum": sum(observed)}
    h.observe(math.nan)  # counted (in +Inf only), the sum becomes NaN
    assert reg.get_sample_value("lat_seconds_bucket", {"le": "1.0"}) == 7
    assert reg.get_sample_value("lat_seconds_count") == 10
    assert math.isnan(reg.get_sample_value("lat_seconds_sum") or 0.0)


def test_histogram_bounds_are_checked_and_inf_appended_once() -> None:
    assert prom.Histogram("a", "a", buckets=[1, 2]).buckets == (1.0, 2.0, math.inf)
    assert prom.Histogram("b", "b", buckets=[1, math.inf]).buckets == (1.0, math.inf)
    for bad in ([2.0, 1.0], [1.0, 1.0], [math.nan]):
        with pytest.raises(ValueError):
            prom.Histogram("c", "c", buckets=bad)
    with pytest.raises(ValueError, match="le"):
        prom.Histogram("d", "d", ["le"], buckets=[1.0])


# ---- API and checks ------------------------------------------------------------------


def test_names_labels_and_registration_are_checked() -> None:
    reg = prom.Registry()
    with pytest.raises(ValueError, match="_total"):
        prom.Counter("requests", "r")
    for name in ("1abc", "a-b", ""):
        with pytest.raises(ValueError, match="metric name"):
            prom.Gauge(name, "g")
    for label in ("__x", "a-b", "1a"):
        with pytest.raises(ValueError, match="label name"):
            prom.Gauge("g", "g", [label])
    with pytest.raises(ValueError, match="duplicate"):
        prom.Gauge("g", "g", ["a", "a"])
    prom.Histogram("h", "h", buckets=[1.0], registry=reg)
    with pytest.raises(ValueError, match="already registered"):
        prom.Gauge("h_count", "clashes with the histogram's count", registry=reg)
    c = prom.Counter("c_total", "c", ["a", "b"], registry=reg)
    with pytest.raises(ValueError):
        c.labels("only-one")
    with pytest.raises(ValueError):
        c.labels(a="x", c="y")
    with pytest.raises(ValueError):
        c.labels("x", b="y")
    with pytest.raises(ValueError, match="use labels"):
        c.inc()
    with pytest.raises(ValueError, match="only goes up"):
        c.labels("x", "y").inc(-1)
    with pytest.raises(KeyError):
        c.remove("never", "made")
    with pytest.raises(ValueError, match="no labels"):
        prom.Gauge("plain", "p").labels()


def test_gauge_set_inc_dec_remove_and_sample_lookup() -> None:
    reg = prom.Registry()
    g = prom.Gauge("g", "g", ["d"], registry=reg)
    g.labels("a").set(5)
    g.labels(d="a").inc(2)
    g.labels("a").dec(0.5)
    g.labels("b").set(1)
    assert reg.get_sample_value("g", {"d": "a"}) == 6.5
    g.remove("a")
    assert reg.get_sample_value("g", {"d": "a"}) is None
    assert reg.get_sample_value("g", {"x": "a"}) is None
    assert reg.get_sample_value("nope") is None
    assert samples(reg.expose()) == {("g", (("d", "b"),)): 1.0}
    plain = prom.Gauge("p", "p")
    plain.inc()
    plain.dec(3)
    assert plain.get() == -2


# ---- bounded cardinality -------------------------------------------------------------


def test_capped_label_folds_new_values_into_overflow() -> None:
    reg = prom.Registry()
    c = prom.Counter("e_total", "e", ["resource", "reason"], capped={"reason": 3},
                     registry=reg)
    for i in range(100):
        c.labels(resource="mem", reason=f"r{i % 5}").inc()
    c.labels(resource="core", reason="r0").inc()  # admitted value, other resource: kept
    c.labels(resource="mem", reason="x" * (prom.MAX_LABEL_VALUE_CHARS + 1)).inc()
    c.labels(resource="mem", reason=prom.OVERFLOW).inc()  # cannot be claimed as a value
    got = samples(reg.expose())
    reasons = {dict(k[1])["reason"] for k in got}
    assert reasons == {"r0", "r1", "r2", prom.OVERFLOW}
    assert got[("e_total", (("reason", prom.OVERFLOW), ("resource", "mem")))] == 40 + 2
    assert got[("e_total", (("reason", "r0"), ("resource", "core")))] == 1
    assert sum(got.values()) == 103
    with pytest.raises(ValueError, match="not labels"):
        prom.Counter("f_total", "f", ["a"], capped={"b": 1})


def test_agent_metrics_bound_the_series_of_free_text_labels() -> None:
    m = Metrics()
    for i in range(10 * REASON_CAP):
        m.kube_errors_total.labels(op=f"op-{i}").inc()
        m.allocation_failures_total.labels(resource=MEM, reason=f"why-{i}").inc()
        m.loop_errors_total.labels(loop=f"loop-{i}").inc()
    got = samples(m.render())
    for name in ("gpu_share_kube_errors_total", "gpu_share_allocation_failures_total",
                 "gpu_share_loop_errors_total"):
        series = {k: v for k, v in got.items() if k[0] == name}
        assert len(series) == REASON_CAP + 1
        assert sum(series.values()) == 10 * REASON_CAP


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


def test_concurrent_updates_are_exact_and_every_scrape_is_consistent() -> None:
    reg = prom.Registry()
    c = prom.Counter("c_total", "c", ["w"], registry=reg)
    shared = prom.Counter("s_total", "s", registry=reg)
    g = prom.Gauge("g", "g", registry=reg)
    h = prom.Histogram("h", "h", ["k"], buckets=[0.5, 1.0], registry=reg)
    writers, rounds = 8, 3000
    done = threading.Event()
    problems: list[str] = []
    scrapes = 0

    def scrape() -> None:
        nonlocal scrapes
        last = 0.0
        while not done.is_set():
            got = samples(reg.expose())
            scrapes += 1
            total = got.get(("s_total", ()), 0.0)
            if total < last:
                problems.append(f"counter went down {last} -> {total}")
            last = total
            for k in ("a", "b"):
                inf = got.get(("h_bucket", (("k", k), ("le", "+Inf"))))
                count = got.get(("h_count", (("k", k),)))
                low = got.get(("h_bucket", (("k", k), ("le", "0.5"))), 0.0)
                if inf != count or (inf is not None and low > inf):
                    problems.append(f"histogram {k}: +Inf {inf}, count {count}, low {low}")

    def write(_: int) -> None:
        for r in range(rounds):
            shared.inc()
            c.labels(w=str(r % 7)).inc(0.5)  # series created while others scrape
            g.inc()
            g.dec()
            h.labels("a" if r % 2 else "b").observe(0.25 if r % 3 else 0.75)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        _run_threads(writers, write)
    finally:
        done.set()
        scraper.join(60)
    assert not problems, problems[:5]
    assert scrapes > 0
    got = samples(reg.expose())
    assert got[("s_total", ())] == writers * rounds
    assert sum(v for k, v in got.items() if k[0] == "c_total") == writers * rounds * 0.5
    assert got[("g", ())] == 0
    assert got[("h_count", (("k", "a"),))] + got[("h_count", (("k", "b"),))] == writers * rounds
    low = sum(got[("h_bucket", (("k", k), ("le", "0.5")))] for k in "ab")
    assert low == writers * sum(1 for r in range(rounds) if r % 3)


# ---- the endpoint and the agent's imports --------------------------------------------


def test_metrics_endpoint_serves_the_0_0_4_text_format() -> None:
    m = Metrics()
    m.registrations_total.labels(resource=MEM).inc()
    handle = start_http(m.registry, bind_address="127.0.0.1", port=0)
    try:
        url = f"http://127.0.0.1:{handle.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            ctype, body = r.headers["Content-Type"], r.read()
    finally:
        handle.stop()
    assert ctype == "text/plain; version=0.0.4; charset=utf-8" == prom.CONTENT_TYPE
    assert samples(body)[("gpu_share_registrations_total", (("resource", MEM),))] == 1


def test_agent_path_does_not_import_prometheus_client() -> None:
    code = (
        "import sys, gpu_share.cli.plugin_main, gpu_share.observability\n"
        "from gpu_share.observability.metrics import Metrics\n"
        "Metrics().render()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'prometheus_client')\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
