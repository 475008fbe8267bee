"""A small Prometheus metrics registry: counters, gauges and histograms, exposed in the
text exposition format 0.0.4.

It replaces ``prometheus_client`` on the agent's path (about 5 MiB of RSS and 25 ms of
import for the dozen metrics we export). What it writes, per family::

    # HELP <name> <help, with \\ and newline escaped>
    # TYPE <name> counter|gauge|histogram
    <name>{<label>="<value, with \\, " and newline escaped>",...} <float>

Counters are named ``*_total`` (the TYPE line carries that name); a histogram writes
``<name>_bucket{...,le="<bound>"}`` with cumulative counts ending in ``le="+Inf"``, then
``<name>_sum`` and ``<name>_count``. Floats are Python's shortest round-trip form, which
Go's ``ParseFloat`` reads, and ``+Inf``, ``-Inf``, ``NaN``.

Locking: creating a series takes its family's lock; updating one takes only that series'
lock (a counter's ``+=`` is not atomic across threads); exposing copies each family's
series list under the family lock and reads each series under its own. No lock is held
across families, so a scrape never stalls the kubelet calls for long.

Label values that can come from outside our code (error reasons, operation names) may be
capped per label (``capped``): past the cap, or for a value longer than
``MAX_LABEL_VALUE_CHARS``, a new value is exported as ``OVERFLOW`` so the series count
stays bounded.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypedDict, TypeVar, Unpack

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OVERFLOW = "other"
MAX_LABEL_VALUE_CHARS = 128
INF = math.inf

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def format_float(value: float) -> str:
    """A sample value or bucket bound as the exposition format writes it."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def escape_label_value(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label_text(names: Sequence[str], values: Sequence[str]) -> str:
    """``name="value",...`` (no braces) for one series."""
    return ",".join(f'{n}="{escape_label_value(v)}"' for n, v in zip(names, values, strict=True))


class _Series:
    """One labelled series; ``label_text`` is rendered once, when it is created."""

    __slots__ = ("label_text", "lock")

    def __init__(self, label_text: str) -> None:
        self.label_text = label_text
        self.lock = threading.Lock()

    def lines(self, name: str) -> list[str]:
        raise NotImplementedError


class _CounterSeries(_Series):
    __slots__ = ("value",)

    def __init__(self, label_text: str) -> None:
        super().__init__(label_text)
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"a counter only goes up (inc by {amount})")
        with self.lock:
            self.value += amount

    def get(self) -> float:
        return self.value

    def lines(self, name: str) -> list[str]:
        braces = "{" + self.label_text + "}" if self.label_text else ""
        return [f"{name}{braces} {format_float(self.value)}\n"]


class _GaugeSeries(_CounterSeries):
    __slots__ = ()

    def set(self, value: float) -> None:
        with self.lock:  # else an inc racing with it could undo it
            self.value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        with self.lock:
            self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        with self.lock:
            self.value -= amount


class _HistogramSeries(_Series):
    __slots__ = ("bounds", "counts", "le_texts", "sum")

    def __init__(self, label_text: str, bounds: tuple[float, ...], le_texts: list[str]) -> None:
        super().__init__(label_text)
        self.bounds = bounds  # ascending, +Inf last
        self.le_texts = le_texts
        self.counts = [0] * len(bounds)  # per bucket, not cumulative
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # First bound >= value ("le"); NaN compares false everywhere: the +Inf bucket.
        i = len(self.bounds) - 1 if math.isnan(value) else bisect.bisect_left(self.bounds, value)
        with self.lock:
            self.counts[i] += 1
            self.sum += value

    def snapshot(self) -> tuple[list[int], float]:
        """Cumulative bucket counts and the sum, consistent with each other."""
        with self.lock:
            counts, total = list(self.counts), self.sum
        running = 0
        for i, c in enumerate(counts):
            running += c
            counts[i] = running
        return counts, total

    def lines(self, name: str) -> list[str]:
        counts, total = self.snapshot()
        sep = "," if self.label_text else ""
        out = [
            f"{name}_bucket{{{self.label_text}{sep}{le}}} {format_float(c)}\n"
            for le, c in zip(self.le_texts, counts, strict=True)
        ]
        braces = "{" + self.label_text + "}" if self.label_text else ""
        out.append(f"{name}_sum{braces} {format_float(total)}\n")
        out.append(f"{name}_count{braces} {format_float(counts[-1])}\n")
        return out


S = TypeVar("S", bound=_Series)
V = TypeVar("V", bound=_CounterSeries)


class _FamilyOptions(TypedDict, total=False):
    registry: Registry | None
    capped: Mapping[str, int] | None


class _Family(Generic[S]):
    """A named metric with a fixed label set and one series per label-value tuple."""

    kind = ""
    name_suffix = ""  # what every name of this kind must end in
    series_type: Callable[[str], S]

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        registry: Registry | None = None,
        capped: Mapping[str, int] | None = None,
    ) -> None:
        if not name.endswith(self.name_suffix):
            raise ValueError(f"{self.kind} {name!r} must be named *{self.name_suffix}")
        if not _METRIC_NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        names = tuple(labelnames)
        for label in names:
            if not _LABEL_NAME.match(label) or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate label names in {names}")
        unknown = set(capped or ()) - set(names)
        if unknown:
            raise ValueError(f"capped labels {sorted(unknown)} are not labels of {name}")
        self.name = name
        self.documentation = documentation
        self.labelnames = names
        self._labelset = frozenset(names)
        self._lock = threading.Lock()
        self._series: dict[tuple[str, ...], S] = {}
        # Per capped label position: its cap and the values admitted so far.
        self._caps = {names.index(k): (n, set[str]()) for k, n in (capped or {}).items()}
        self._default: S | None = None if names else self._new_series(())
        if self._default is not None:
            self._series[()] = self._default
        if registry is not None:
            registry.register(self)

    def _new_series(self, values: tuple[str, ...]) -> S:
        return self.series_type(_label_text(self.labelnames, values))

    def sample_names(self) -> tuple[str, ...]:
        """Names this family writes samples under (for clash checks)."""
        return (self.name,)

    def _key(self, values: tuple[object, ...], kw: Mapping[str, object]) -> tuple[str, ...]:
        if values and kw:
            raise ValueError("labels() takes values by position or by name, not both")
        if kw:
            if kw.keys() != self._labelset:
                raise ValueError(f"{self.name} has labels {self.labelnames}, got {sorted(kw)}")
            values = tuple(kw[n] for n in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} has labels {self.labelnames}, got {len(values)}")
        return tuple(str(v) for v in values)

    def _capped(self, key: tuple[str, ...]) -> tuple[str, ...]:
        """``key`` with each capped label's new value past the cap made ``OVERFLOW``.
        Called under ``self._lock``."""
        out = list(key)
        for pos, (cap, seen) in self._caps.items():
            v = out[pos]
            if v in seen:
                continue
            if len(seen) < cap and len(v) <= MAX_LABEL_VALUE_CHARS and v != OVERFLOW:
                seen.add(v)
            else:
                out[pos] = OVERFLOW
        return tuple(out)

    def labels(self, *values: object, **kw: object) -> S:
        """The series of these label values (created at first use)."""
        if not self.labelnames:
            raise ValueError(f"{self.name} has no labels")
        key = self._key(values, kw)
        series = self._series.get(key)  # lock-free on the usual path
        if series is not None:
            return series
        with self._lock:
            series = self._series.get(key)
            if series is not None:
                return series
            # An overflowed key is not stored: its series is the OVERFLOW one.
            real = self._capped(key) if self._caps else key
            series = self._series.get(real)
            if series is None:
                series = self._series[real] = self._new_series(real)
            return series

    def remove(self, *values: object, **kw: object) -> None:
        """Stop exporting one series; KeyError when it does not exist."""
        key = self._key(values, kw)
        with self._lock:
            del self._series[key]

    def _only(self) -> S:
        if self._default is None:
            raise ValueError(f"{self.name} has labels {self.labelnames}: use labels()")
        return self._default

    def lines(self) -> list[str]:
        with self._lock:
            series = list(self._series.values())
        out = [
            f"# HELP {self.name} {escape_help(self.documentation)}\n",
            f"# TYPE {self.name} {self.kind}\n",
        ]
        for s in series:
            out.extend(s.lines(self.name))
        return out


class _ValueFamily(_Family[V]):
    """A family whose series hold one value (counters and gauges)."""

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def get(self) -> float:
        return self._only().get()


class Counter(_ValueFamily[_CounterSeries]):
    """A count that only goes up; its name ends in ``_total``."""

    kind = "counter"
    name_suffix = "_total"
    series_type = _CounterSeries


class Gauge(_ValueFamily[_GaugeSeries]):
    """A value that goes up and down."""

    kind = "gauge"
    series_type = _GaugeSeries

    def set(self, value: float) -> None:
        self._only().set(value)

    def dec(self, amount: float = 1.0) -> None:
        self._only().dec(amount)


class Histogram(_Family[_HistogramSeries]):
    """Observations counted into cumulative ``le`` buckets, with their sum and count."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Iterable[float],
        **options: Unpack[_FamilyOptions],
    ) -> None:
        if "le" in labelnames:
            raise ValueError("'le' is the bucket label of a histogram")
        bounds = [float(b) for b in buckets]
        if any(math.isnan(b) for b in bounds) or bounds != sorted(set(bounds)):
            raise ValueError(f"buckets must be strictly ascending numbers: {bounds}")
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
        self.buckets = tuple(bounds)
        self._le_texts = [f'le="{format_float(b)}"' for b in bounds]
        super().__init__(name, documentation, labelnames, **options)

    def _new_series(self, values: tuple[str, ...]) -> _HistogramSeries:
        return _HistogramSeries(
            _label_text(self.labelnames, values), self.buckets, self._le_texts
        )

    def sample_names(self) -> tuple[str, ...]:
        return (self.name, f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")

    def observe(self, value: float) -> None:
        self._only().observe(value)


AnyFamily = _Family[Any]


class Registry:
    """The families one endpoint exposes, in registration order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: list[AnyFamily] = []
        self._names: set[str] = set()

    def register(self, family: AnyFamily) -> None:
        names = set(family.sample_names())
        with self._lock:
            clash = names & self._names
            if clash:
                raise ValueError(f"metric names already registered: {sorted(clash)}")
            self._names |= names
            self._families.append(family)

    def families(self) -> list[AnyFamily]:
        with self._lock:
            return list(self._families)

    def expose(self) -> bytes:
        """Every family in the text exposition format 0.0.4 (``CONTENT_TYPE``)."""
        out: list[str] = []
        for family in self.families():
            out.extend(family.lines())
        # A value that is not valid Unicode (a lone surrogate) must not fail the scrape.
        return "".join(out).encode("utf-8", "replace")

    def get_sample_value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The value of one exposed sample (tests, debugging): None when absent."""
        want = labels or {}
        for family in self.families():
            if name not in family.sample_names() and name != family.name:
                continue
            if set(want) - {"le"} != set(family.labelnames):
                return None
            key = tuple(want[n] for n in family.labelnames)
            with family._lock:
                series = family._series.get(key)
            if series is None:
                return None
            return _sample_of(family, series, name, want.get("le"))
        return None


def _sample_of(family: AnyFamily, series: _Series, name: str, le: str | None) -> float | None:
    if isinstance(series, _HistogramSeries):
        counts, total = series.snapshot()
        if name == f"{family.name}_sum":
            return total
        if name == f"{family.name}_count":
            return float(counts[-1])
        if name == f"{family.name}_bucket" and le is not None:
            for b, c in zip(series.bounds, counts, strict=True):
                if format_float(b) == le:
                    return float(c)
        return None
    if isinstance(series, _CounterSeries):
        return series.value
    return None
