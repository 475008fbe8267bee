"""bench/soak.py's arithmetic on fixed inputs (no cluster, no time asserted)."""

from __future__ import annotations

import pytest

from bench.soak import Sample, proc_figures, segments, slope_per_hour, summary

STATUS = "Name:\tgpu-share-plugi\nVmHWM:\t  99000 kB\nVmRSS:\t   95432 kB\nThreads:\t23\n"


def test_proc_figures_reads_rss_and_threads() -> None:
    assert proc_figures(STATUS) == (95432, 23)
    with pytest.raises(ValueError):
        proc_figures("Name:\tx\n")


def test_slope_per_hour() -> None:
    assert slope_per_hour([(0, 100), (1800, 150), (3600, 200)]) == pytest.approx(100)
    assert slope_per_hour([(0, 5)]) == 0.0
    assert slope_per_hour([(10, 5), (10, 7)]) == 0.0


def test_a_restart_starts_a_new_segment_and_the_summary_names_both() -> None:
    samples = [
        Sample(0, 11, 90000, 20, 30),
        Sample(10, 11, 91000, 21, 31),
        Sample(20, 12, 80000, 18, 25),
    ]
    segs = segments(samples)
    assert [(s.pid, len(s.samples)) for s in segs] == [(11, 2), (12, 1)]
    assert segs[0].figures("rss_kib") == {
        "start": 90000,
        "end": 91000,
        "max": 91000,
        "slope_per_h": pytest.approx(360000),
        "late_slope_per_h": 0.0,  # one sample in the second half
    }
    text = "\n".join(summary(samples))
    assert "agent pid 11: 2 samples over 10 s" in text
    assert "agent pid 12: 1 samples" in text
