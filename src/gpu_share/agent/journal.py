"""When and how the node agent writes its ledger (``agent/state.py`` is the files): each
change appended to the journal under the agent's lock, the journal folded into a new
snapshot off the call path, a ledger that cannot be read quarantined, and each failing
stretch of writes reported once. The ledger in memory stays authoritative: a failed
write never fails a kubelet call (PodResources rebuilds the file's content after a
restart)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpu_share.agent.ports import AgentMetrics
from gpu_share.agent.state import LedgerStore
from gpu_share.errors import LedgerError
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.node.ledger import Ledger

log = logging.getLogger(__name__)

# The journal is folded into a new ledger.json snapshot (off the call path) this often
# while it has records, or sooner after this many.
COMPACT_INTERVAL_S = 1.0
COMPACT_RECORDS = 500
JOURNAL_TORN = "LedgerJournalTorn"  # ledger_anomaly reason: a crash cut a record short


class LedgerJournal:
    """The ledger's persistence policy over ``store``; ``warn`` is a node Warning Event
    (reason, message)."""

    def __init__(self, store: LedgerStore, metrics: AgentMetrics,
                 warn: Callable[[str, str], None]) -> None:
        self.store = store
        self._metrics = metrics
        self._warn = warn
        self._failing = False  # the last write failed (reported once)
        # An append failed: no more appends (the file may end in a torn record) until a
        # snapshot succeeded and a new journal generation is open.
        self.broken = False
        self.compact_lock = threading.Lock()  # one compaction at a time
        self._compacted_at = 0.0  # time.monotonic() of the last one

    # -- reading

    def load(self, inventory: Inventory) -> Ledger:
        """The persisted ledger. One that cannot be read whole is quarantined (moved
        aside, reported) and the agent starts empty: start() then re-adopts every running
        container from PodResources. What a readable ledger says that cannot be true here
        is reported and kept (docs/allocation.md, "Ledger file")."""
        try:
            read, torn = self.store.read()
            self.store.journal_gen = self.store.next_gen(read)
        except LedgerError as exc:
            self._quarantine(exc)
            return Ledger()
        ledger = read or Ledger()
        if torn:
            self._metrics.ledger_anomaly(JOURNAL_TORN)
            log.warning("ledger journal: %d record(s) cut short by a crash left out;"
                        " PodResources reconciliation restores what they said", torn,
                        extra={"reason": JOURNAL_TORN})
        self._report_anomalies(ledger, inventory)
        return ledger

    def peek(self) -> Ledger | None:
        """The persisted ledger as it is, or None; raises ``LedgerError`` (nothing is
        quarantined or reported: ``load`` does that)."""
        ledger, _torn = self.store.read()
        return ledger

    def _report_anomalies(self, ledger: Ledger, inventory: Inventory) -> None:
        anomalies = ledger.anomalies(inventory)
        for a in anomalies:
            self._metrics.ledger_anomaly(a.reason)
        for a in anomalies[:5]:
            log.warning("ledger inconsistent: %s", a.message, extra={"reason": a.reason})
        if anomalies:
            self._warn(
                "LedgerInconsistent",
                f"{len(anomalies)} ledger entr{'y' if len(anomalies) == 1 else 'ies'} cannot"
                f" be true on this node, kept until PodResources corrects them (their units"
                f" stay counted as used), e.g. {anomalies[0].message}",
            )

    def _quarantine(self, exc: LedgerError) -> None:
        try:
            moved = self.store.quarantine()
        except LedgerError as err:
            moved = None
            log.error("%s", err, extra={"reason": err.reason})
        self._metrics.ledger_quarantined(exc.reason)
        log.error(
            "ledger unreadable, starting empty; PodResources reconciliation re-adopts"
            " every running container",
            extra={"reason": exc.reason, "error": exc.message, "moved_to": str(moved)},
        )
        self._warn(
            "LedgerQuarantined",
            f"ledger unreadable ({exc.reason}: {exc.message}); moved to {moved}; starting"
            " empty, running containers are re-adopted from PodResources",
        )

    # -- writing

    def append(self, ledger: Ledger) -> None:
        """What changed in ``ledger`` since the last call, as one journal record. Under
        the agent's lock."""
        record = ledger.drain_changes()
        if record is None:
            return
        if self.broken:
            self._metrics.ledger_write_failed()  # not written; the next snapshot holds it
            return
        store = self.store
        try:
            if not store.journal_open:
                store.open_journal(store.journal_gen)
            store.append(record)
        except LedgerError as exc:
            self.broken = True
            store.close_journal()
            self._write_failed(exc)
            return
        self._write_ok()

    def cut(self, ledger: Ledger) -> tuple[str, int]:
        """Start the next generation (under the agent's lock, after ``append``): the
        snapshot's text and generation, to be written by ``snapshot`` without the lock."""
        store = self.store
        gen = store.journal_gen + 1
        ledger.journal = gen
        text = ledger.to_json()
        store.journal_gen = gen
        store.close_journal()  # the next append opens ``gen``
        self.broken = False
        self._compacted_at = time.monotonic()
        return text, gen

    def snapshot(self, text: str, gen: int) -> None:
        try:
            self.store.save(text)
        except LedgerError as exc:
            self._write_failed(exc)  # the journals stay: load replays them all
            return
        self.store.drop_journals(gen)
        self._write_ok()

    def due(self) -> bool:
        """Whether the journal should be folded into a snapshot now."""
        records = self.store.journal_records
        late = time.monotonic() - self._compacted_at >= COMPACT_INTERVAL_S
        return records >= COMPACT_RECORDS or bool(records and late) or self.broken

    def _write_failed(self, exc: LedgerError) -> None:
        # Not the kubelet's problem: the ledger in memory stays authoritative and
        # PodResources rebuilds the file's content after a restart; failing the call
        # would only fail the pod. Reported once per failing stretch.
        self._metrics.ledger_write_failed()
        if not self._failing:
            self._failing = True
            log.error("ledger not written: %s", exc, extra={"reason": exc.reason})
            self._warn(exc.reason, f"ledger not written: {exc.message}")

    def _write_ok(self) -> None:
        if self._failing:
            self._failing = False
            log.info("ledger written again")
        self._metrics.ledger_write()
