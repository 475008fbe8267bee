"""The metric families of our tables: prometheus_client's Counter, Gauge and Histogram,
whose ``labels()`` first bounds the label values it is given.

* A label fed from text outside our code (error reasons, operation names) may be capped
  (``cap_labels``): past the cap, or for a value longer than ``MAX_LABEL_VALUE_CHARS``, a
  new value is exported as ``OVERFLOW``, so the series count stays bounded whatever a
  caller passes. ``OVERFLOW`` itself cannot be claimed as a value.
* A value that is not valid Unicode (a lone surrogate, from a decoded file name or
  socket) has its bad code points replaced by ``?``: the exposition encodes to UTF-8
  strictly, and one such value would otherwise fail every later scrape.

``_created`` samples are not exported (``disable_created_metrics``, process-wide): the
exposition carries values only, as the dashboards and rules expect.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Self

import prometheus_client
from prometheus_client.metrics import MetricWrapperBase

OVERFLOW = "other"
MAX_LABEL_VALUE_CHARS = 128

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


class LabelCap:
    """The values one capped label may take: the first ``limit`` seen, then ``OVERFLOW``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def admit(self, value: str) -> str:
        if value in self._seen:  # the usual path: no lock
            return value
        with self._lock:
            if value in self._seen:
                return value
            fits = len(self._seen) < self.limit and len(value) <= MAX_LABEL_VALUE_CHARS
            if fits and value != OVERFLOW:
                self._seen.add(value)
                return value
        return OVERFLOW


def _valid_text(value: str) -> str:
    if value.isascii():
        return value
    return value.encode("utf-8", "replace").decode("utf-8")


class _BoundedLabels(MetricWrapperBase):
    """``labels()`` with every value made valid text and capped labels capped, in front
    of prometheus_client's own (which makes or finds the series)."""

    # Per label position; set on the parent family only (children take no labels).
    _caps: Mapping[int, LabelCap] = {}

    def cap_labels(self, caps: Mapping[str, int]) -> None:
        """Cap these labels at their number of distinct values."""
        unknown = set(caps) - set(self._labelnames)
        if unknown:
            raise ValueError(f"capped labels {sorted(unknown)} are not labels of {self}")
        self._caps = {self._labelnames.index(k): LabelCap(n) for k, n in caps.items()}

    def labels(self, *labelvalues: object, **labelkwargs: object) -> Self:
        names = self._labelnames
        if labelkwargs and not labelvalues and labelkwargs.keys() == set(names):
            labelvalues, labelkwargs = tuple(labelkwargs[n] for n in names), {}
        if labelkwargs or len(labelvalues) != len(names):
            return super().labels(*labelvalues, **labelkwargs)  # its error
        return super().labels(*self._bounded(labelvalues))

    def remove(self, *labelvalues: object) -> None:
        """Stop exporting one series (none: nothing to do)."""
        super().remove(*(_valid_text(str(v)) for v in labelvalues))

    def _bounded(self, values: tuple[object, ...]) -> list[str]:
        out = [_valid_text(str(v)) for v in values]
        for pos, cap in self._caps.items():
            out[pos] = cap.admit(out[pos])
        return out


class Counter(_BoundedLabels, prometheus_client.Counter):
    pass


class Gauge(_BoundedLabels, prometheus_client.Gauge):
    pass


class Histogram(_BoundedLabels, prometheus_client.Histogram):
    pass
