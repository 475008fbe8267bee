"""Which unit ids of the decided device(s) to offer the kubelet (GetPreferredAllocation)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from gpu_share.errors import AllocationError
from gpu_share.errors import AllocationReason as R
from gpu_share.sharing.ids import Listed, device_of, group_by_device, parse_unit_ids
from gpu_share.sharing.model import ResourceKind
from gpu_share.sharing.node.ledger import LedgerEntry


def _err(e: LedgerEntry, reason: R, msg: str) -> AllocationError:
    return AllocationError(f"{e.ref}: {msg}", reason=reason, ref=e.known_ref)


def pick_ids(
    e: LedgerEntry,
    kind: ResourceKind,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    avoid: frozenset[str] = frozenset(),
) -> list[str]:
    """``must_include`` plus the lowest listed units of each decided device up to its
    share; an exclusive decision may take any unit of its devices for the rest. Units in
    ``avoid`` (offered to another container) come last, so concurrent callers given the
    same list are not offered the same units while others are free."""
    _check_reused(e, must_include)
    want = _want(e, kind, size)
    chosen: list[str] = list(dict.fromkeys(must_include))
    taken = set(chosen)
    on = _by_device(available)
    for d in e.devices:
        have = sum(1 for x in chosen if device_of(x) == d)
        limit = min(size, len(chosen) + max(0, want[d] - have))
        _fill(chosen, taken, _prefer(on(d), avoid), limit)
    if len(chosen) < size and e.exclusive:
        for d in e.devices:
            _fill(chosen, taken, _prefer(on(d), avoid), size)
    if len(chosen) != size:
        raise _err(
            e,
            R.NO_FIT,
            f"decided device(s) {list(e.devices)} have only {len(chosen)} of the {size} "
            f"{kind.value} units the kubelet lists as available",
        )
    return chosen


def _check_reused(e: LedgerEntry, must_include: Sequence[str]) -> None:
    for m in parse_unit_ids(must_include):
        if m.device not in e.devices:
            raise _err(
                e,
                R.DECISION_MISMATCH,
                f"reused id {m} is not on its decided device(s) {list(e.devices)}",
            )


def _want(e: LedgerEntry, kind: ResourceKind, size: int) -> dict[str, int]:
    """Units of ``kind`` per decided device; a single device takes the whole call."""
    want = {s.device: s.amount(kind) for s in e.shares}
    if sum(want.values()) == size:
        return want
    if len(e.devices) == 1:
        return {e.devices[0]: size}
    raise _err(
        e,
        R.DECISION_MISMATCH,
        f"{size} {kind.value} units asked, decision has {sum(want.values())}",
    )


def _fill(chosen: list[str], taken: set[str], units: Iterable[str], limit: int) -> None:
    """Append untaken ``units`` to ``chosen`` until it holds ``limit`` ids."""
    for u in units:
        if len(chosen) >= limit:
            return
        if u not in taken:
            chosen.append(u)
            taken.add(u)


def _by_device(available: Sequence[str]) -> Callable[[str], Iterator[str]]:
    """The listed ids of a device, lowest index first."""
    if isinstance(available, Listed):
        return available.on
    by_dev = group_by_device(available)
    return lambda d: (str(u) for u in by_dev.get(d, []))


def _prefer(units: Iterator[str], avoid: frozenset[str]) -> Iterator[str]:
    if not avoid:
        yield from units
        return
    later = []
    for u in units:
        if u in avoid:
            later.append(u)
        else:
            yield u
    yield from later
