"""Pure helpers of the agent benchmark: percentiles, summaries, Prometheus histograms
(parse, diff two scrapes, quantile), RSS parsing and the printed table. No I/O, no
clock: tests/bench checks them on fixed inputs."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]) of a non-empty sample."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q} outside [0, 1]")
    ordered = sorted(samples)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Summary:
    """Median and range of the values of one figure over the rounds."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Summary | None:
        got = [v for v in values if v is not None and not math.isnan(v)]
        if not got:
            return None
        return cls(statistics.median(got), min(got), max(got), len(got))


def ratio(a: Summary | None, b: Summary | None) -> float | None:
    """a.median / b.median, or None when either is missing or b is 0."""
    if a is None or b is None or b.median == 0:
        return None
    return a.median / b.median


# ---- Prometheus histograms ------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    """One histogram series: cumulative counts per upper bound (ascending, +Inf last)."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, before: Histogram | None) -> Histogram:
        """What was observed between the scrape ``before`` and this one."""
        if before is None:
            return self
        old = dict(before.buckets)
        return Histogram(
            tuple((le, c - old.get(le, 0.0)) for le, c in self.buckets),
            self.sum - before.sum,
            self.count - before.count,
        )

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear within the bucket holding rank q*count;
        the largest finite bound when the rank falls in +Inf; None without samples."""
        if self.count <= 0:
            return None
        rank = q * self.count
        prev_le, prev_c = 0.0, 0.0
        finite = [le for le, _ in self.buckets if not math.isinf(le)]
        for le, c in self.buckets:
            if c >= rank and c > prev_c:
                if math.isinf(le):
                    return finite[-1] if finite else None
                return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
            prev_le, prev_c = le, c
        return finite[-1] if finite else None


LabelKey = tuple[tuple[str, str], ...]


def parse_histograms(text: str, name: str) -> dict[LabelKey, Histogram]:
    """Every series of histogram ``name`` in a text exposition, keyed by its labels
    (sorted, ``le`` removed)."""
    raw: dict[LabelKey, dict[str, object]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k != "le"}
            key: LabelKey = tuple(sorted(labels.items()))
            slot = raw.setdefault(key, {"buckets": {}, "sum": 0.0, "count": 0.0})
            if s.name.endswith("_bucket"):
                buckets = slot["buckets"]
                assert isinstance(buckets, dict)
                buckets[float(s.labels["le"])] = float(s.value)
            elif s.name.endswith("_sum"):
                slot["sum"] = float(s.value)
            elif s.name.endswith("_count"):
                slot["count"] = float(s.value)
    out: dict[LabelKey, Histogram] = {}
    for key, slot in raw.items():
        buckets = slot["buckets"]
        assert isinstance(buckets, dict)
        s_sum, s_count = slot["sum"], slot["count"]
        assert isinstance(s_sum, float) and isinstance(s_count, float)
        out[key] = Histogram(tuple(sorted(buckets.items())), s_sum, s_count)
    return out


def series(hists: Mapping[LabelKey, Histogram], **labels: str) -> Histogram | None:
    """The one series whose labels include ``labels``; None when there is none."""
    want = set(labels.items())
    found = [h for key, h in hists.items() if want <= set(key)]
    if len(found) > 1:
        raise ValueError(f"{len(found)} series match {labels}")
    return found[0] if found else None


def counter_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of counter/gauge ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in (name, name + "_total") and want <= set(s.labels.items()):
                total += float(s.value)
    return total


# ---- processes ------------------------------------------------------------------------


def rss_mib_from_status(status_text: str) -> float:
    """VmRSS of a /proc/<pid>/status text, in MiB."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 3 and parts[2].lower() == "kb":
                return int(parts[1]) / 1024.0
    raise ValueError("no VmRSS line in status text")


# ---- the table --------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the side-by-side table."""

    figure: str
    unit: str
    ours: Summary | None
    peer: Summary | None
    target: str = ""


def fmt_summary(s: Summary | None, digits: int = 3) -> str:
    if s is None:
        return "n/a"
    return f"{s.median:.{digits}g} ({s.lo:.{digits}g}-{s.hi:.{digits}g})"


def fmt_ratio(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}x"


def render_table(
    rows: Sequence[Row], title_ours: str = "gpu-share", title_peer: str = "sample (Go)"
) -> str:
    """A Markdown table: figure | unit | ours median (min-max) | peer | ratio | target."""
    header = (
        "figure",
        "unit",
        f"{title_ours} median (min-max)",
        f"{title_peer} median (min-max)",
        "ratio",
        "target",
    )
    body = [
        (
            r.figure,
            r.unit,
            fmt_summary(r.ours),
            fmt_summary(r.peer),
            fmt_ratio(ratio(r.ours, r.peer)),
            r.target,
        )
        for r in rows
    ]
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)
    ]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) + " |" for b in body
    ]
    return "\n".join(lines)
