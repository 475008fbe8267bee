"""The memory unit size a starting agent cuts devices in (docs/allocation.md, "Unit size
changes"): the configured one, except while the persisted ledger holds slices cut in
another size. Their ids, and the MiB their containers were told, are in that size; read
in a new one, every device would be over- or under-counted (a rollback to smaller units
over-commits). That size is kept until no slice is left; the agent then switches."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpu_share.agent.journal import LedgerJournal
from gpu_share.agent.ports import AgentMetrics
from gpu_share.errors import LedgerError
from gpu_share.sharing.node.engine import AllocationEngine

log = logging.getLogger(__name__)


def unit_in_use(want: int, journal: LedgerJournal, warn: Callable[[str, str], None]) -> int:
    """``want`` (MiB), or the size the persisted slices were cut in. An unreadable ledger
    is left to the journal's load."""
    try:
        old = journal.peek()
    except LedgerError:
        return want
    if old is None or not old.entries or old.unit_mib in (0, want):
        return want  # 0: recorded by an older agent, the size is unknown
    log.warning(
        "memory unit size change deferred: running slices use the old size",
        extra={"configured_mib": want, "in_use_mib": old.unit_mib, "entries": len(old.entries)},
    )
    warn(
        "MemoryUnitChangeDeferred",
        f"memoryUnitMiB {want} is configured but {len(old.entries)} slice(s) were cut in"
        f" {old.unit_mib} MiB units: the node keeps advertising {old.unit_mib} MiB units"
        f" until no slice is left, then switches to {want} MiB",
    )
    return old.unit_mib


def apply_configured_unit(
    want: int, engine: Callable[[], AllocationEngine], lock: threading.RLock,
    persist: Callable[[], None], metrics: AgentMetrics, event: Callable[[str, str], None],
) -> bool:
    """A deferred unit size change takes effect once the ledger is empty (checked after
    each reconcile with PodResources: every running slice is then in it). True when the
    size changed (the agent then sends the new unit list)."""
    with lock:
        eng = engine()
        was = eng.inventory.unit_mib
        if not eng.set_unit_mib(want):
            return False
        persist()
    log.info("memory unit size changed", extra={"from_mib": was, "to_mib": want})
    metrics.memory_unit(want, want)
    event("MemoryUnitChanged", f"no slice left: memory units are now {want} MiB (were {was} MiB)")
    return True
