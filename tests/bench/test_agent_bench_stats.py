"""The agent benchmark's parsing and arithmetic (bench/agent/stats.py, the kubelet log
parser of bench/agent/cluster.py). Fixed inputs only: no timing is asserted anywhere."""

from __future__ import annotations

import datetime as dt
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.agent.cluster import klog_registrations
from bench.agent.stats import (
    Histogram,
    Row,
    Summary,
    counter_value,
    parse_histograms,
    percentile,
    ratio,
    render_table,
    rss_mib_from_status,
    series,
)

KUBELET_BEFORE = """\
# HELP kubelet_device_plugin_alloc_duration_seconds Allocate time.
# TYPE kubelet_device_plugin_alloc_duration_seconds histogram
kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="ex.com/r",le="0.005"} 2
kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="ex.com/r",le="0.01"} 2
kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="ex.com/r",le="+Inf"} 2
kubelet_device_plugin_alloc_duration_seconds_sum{resource_name="ex.com/r"} 0.004
kubelet_device_plugin_alloc_duration_seconds_count{resource_name="ex.com/r"} 2
# HELP kubelet_device_plugin_registration_total Registrations.
# TYPE kubelet_device_plugin_registration_total counter
kubelet_device_plugin_registration_total{resource_name="ex.com/r"} 3
kubelet_device_plugin_registration_total{resource_name="v.com/mem"} 1
"""

KUBELET_AFTER = """\
# TYPE kubelet_device_plugin_alloc_duration_seconds histogram
kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="ex.com/r",le="0.005"} 10
kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="ex.com/r",le="0.01"} 12
kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="ex.com/r",le="+Inf"} 12
kubelet_device_plugin_alloc_duration_seconds_sum{resource_name="ex.com/r"} 0.034
kubelet_device_plugin_alloc_duration_seconds_count{resource_name="ex.com/r"} 12
kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="v.com/mem",le="0.005"} 0
kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="v.com/mem",le="0.01"} 4
kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="v.com/mem",le="+Inf"} 5
kubelet_device_plugin_alloc_duration_seconds_sum{resource_name="v.com/mem"} 0.07
kubelet_device_plugin_alloc_duration_seconds_count{resource_name="v.com/mem"} 5
"""

NAME = "kubelet_device_plugin_alloc_duration_seconds"


def test_histogram_diff_between_two_scrapes() -> None:
    before = series(parse_histograms(KUBELET_BEFORE, NAME), resource_name="ex.com/r")
    after = series(parse_histograms(KUBELET_AFTER, NAME), resource_name="ex.com/r")
    assert before is not None and after is not None
    delta = after.minus(before)
    assert delta.count == 10
    assert delta.sum == pytest.approx(0.03)
    assert delta.buckets == ((0.005, 8.0), (0.01, 10.0), (math.inf, 10.0))
    assert delta.mean == pytest.approx(0.003)


def test_series_absent_before_counts_everything_after() -> None:
    after = series(parse_histograms(KUBELET_AFTER, NAME), resource_name="v.com/mem")
    before = series(parse_histograms(KUBELET_BEFORE, NAME), resource_name="v.com/mem")
    assert before is None and after is not None
    assert after.minus(before) == after


def test_quantile_interpolates_like_prometheus() -> None:
    h = Histogram(((0.005, 8.0), (0.01, 10.0), (math.inf, 10.0)), 0.03, 10.0)
    # rank 5 of 8 in the first bucket [0, 5 ms]
    assert h.quantile(0.5) == pytest.approx(0.005 * 5 / 8)
    # rank 9.9 lies in (5 ms, 10 ms]: 1.9 of its 2 samples
    assert h.quantile(0.99) == pytest.approx(0.005 + 0.005 * 1.9 / 2)


def test_quantile_in_inf_bucket_is_the_largest_finite_bound() -> None:
    h = series(parse_histograms(KUBELET_AFTER, NAME), resource_name="v.com/mem")
    assert h is not None
    assert h.quantile(0.99) == 0.01
    assert h.quantile(0.5) == pytest.approx(0.005 + 0.005 * 2.5 / 4)


def test_quantile_of_empty_histogram_is_none() -> None:
    assert Histogram(((0.1, 0.0), (math.inf, 0.0)), 0.0, 0.0).quantile(0.5) is None


def test_series_refuses_an_ambiguous_selection() -> None:
    with pytest.raises(ValueError, match="2 series"):
        series(parse_histograms(KUBELET_AFTER, NAME))


def test_counter_value_sums_matching_samples() -> None:
    name = "kubelet_device_plugin_registration"
    assert counter_value(KUBELET_BEFORE, name, resource_name="ex.com/r") == 3
    assert counter_value(KUBELET_BEFORE, name) == 4


def test_percentile_nearest_rank() -> None:
    samples = [float(i) for i in range(1, 101)]
    assert percentile(samples, 0.5) == 50.0
    assert percentile(samples, 0.99) == 99.0
    assert percentile(samples, 1.0) == 100.0
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 0.5)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 1))
def test_percentile_is_a_sample_within_range(samples: list[float], q: float) -> None:
    p = percentile(samples, q)
    assert p in samples
    assert sum(s <= p for s in samples) >= q * len(samples)


def test_summary_and_ratio() -> None:
    a = Summary.of([3.0, 1.0, 2.0, None])
    b = Summary.of([2.0, 2.0])
    assert a == Summary(2.0, 1.0, 3.0, 3)
    assert ratio(a, b) == 1.0
    assert Summary.of([None, math.nan]) is None
    assert ratio(a, None) is None
    assert ratio(a, Summary(0.0, 0.0, 0.0, 1)) is None


def test_rss_from_proc_status() -> None:
    status = "Name:\tpython\nVmPeak:\t  900000 kB\nVmRSS:\t   51200 kB\nThreads:\t9\n"
    assert rss_mib_from_status(status) == 50.0
    with pytest.raises(ValueError):
        rss_mib_from_status("Name:\tx\n")


def test_table_has_one_line_per_row_and_the_ratio() -> None:
    text = render_table(
        [
            Row(
                "admission", "s", Summary(30.0, 28.0, 33.0, 3), Summary(20.0, 19.0, 21.0, 3), "1.5x"
            ),
            Row("health push", "s", Summary(0.5, 0.4, 0.6, 3), None),
        ]
    )
    lines = text.splitlines()
    assert len(lines) == 4
    assert "30 (28-33)" in lines[2] and "20 (19-21)" in lines[2] and "1.50x" in lines[2]
    assert "n/a" in lines[3]
    assert len({len(line) for line in lines}) == 1  # columns aligned


def test_klog_registration_lines() -> None:
    log = (
        'I1121 21:37:31.894663    1560 server.go:160] "Got registration request from device'
        ' plugin with resource" resourceName="vendor.com/vcuda-memory"\n'
        'I1121 21:37:32.000000    1560 manager.go:1] "something else"\n'
        'I1121 21:37:31.903496    1560 server.go:160] "Got registration request from device'
        ' plugin with resource" resourceName="vendor.com/vcuda-core"\n'
    )
    regs = klog_registrations(log, 2025)
    assert [r for _, r in regs] == ["vendor.com/vcuda-memory", "vendor.com/vcuda-core"]
    want = dt.datetime(2025, 11, 21, 21, 37, 31, 894663).timestamp()
    assert regs[0][0] == pytest.approx(want)
