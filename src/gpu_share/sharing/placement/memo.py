"""The placement's memo tables: a dict that empties itself when it is full. Lookups stay
the dict's own ``get`` (the filter path's hottest call); only a store checks the bound.
Emptying, not evicting one entry: every value is cheap to recompute and a table's keys
go stale together (a node's state moves on)."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedMemo(dict[K, V]):
    def put(self, key: K, value: V, limit: int) -> V:
        """Stores ``value`` (first emptying the table when it holds ``limit`` entries) and
        returns it."""
        if len(self) >= limit:
            self.clear()
        self[key] = value
        return value
