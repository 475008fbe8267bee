"""Durable state of the node agent: the ledger as a snapshot (``ledger.json``, written
atomically) and an append-only journal of changes after it (``ledger.journal.<gen>``),
compacted into a new snapshot in the background."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from gpu_share.errors import LedgerError
from gpu_share.sharing.node.ledger import MALFORMED, Ledger

LEDGER_FILE = "ledger.json"
JOURNAL_PREFIX = "ledger.journal."
QUARANTINE_PREFIX = f"{LEDGER_FILE}.corrupt."
# A real ledger is a few KiB per container; anything near this is not ours.
MAX_LEDGER_BYTES = 64 * 1024 * 1024
# Quarantined files kept for a person to inspect; older ones are deleted.
MAX_QUARANTINED = 5

# LedgerError reasons raised here (the others come from sharing.node.ledger).
UNREADABLE = "LedgerUnreadable"  # I/O error, or not a regular file
TOO_LARGE = "LedgerTooLarge"
WRITE_FAILED = "LedgerWriteFailed"  # disk full, EACCES, read-only file system, ...


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


class LedgerStore:
    """Reads and writes ``<stateDir>/ledger.json``.

    Writes go to a temp file in the same directory that is renamed over the old one, so a
    reader (or a restarted agent) sees either the old or the new ledger, never a torn one.
    No fsync: the ledger must survive the agent's restarts (the page cache does), while
    after a power loss every container is started anew and reconciliation with the
    kubelet's PodResources rebuilds the ledger; an fsync per kubelet call was the largest
    part of Allocate's latency.
    """

    def __init__(self, state_dir: str) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / LEDGER_FILE
        self._journal_fd: int | None = None
        self.journal_gen = 0  # generation appends go to
        self.journal_records = 0  # appended to it since it was opened

    def load(self) -> str | None:
        """The snapshot's text, or None when there is none yet. Raises ``LedgerError``
        only (unreadable, not a regular file, over ``MAX_LEDGER_BYTES``, not UTF-8)."""
        return self._read(self.path)

    def read(self) -> tuple[Ledger | None, int]:
        """The snapshot with its journal replayed (None: neither exists), and how many
        torn records were left out. ``LedgerError`` when either cannot be read whole."""
        data = self.load()
        ledger = Ledger.from_json(data) if data is not None else None
        records, torn = self.load_journal(ledger.journal if ledger is not None else 0)
        if records and ledger is None:
            ledger = Ledger()
        for i, record in enumerate(records):
            assert ledger is not None
            ledger.apply_record(record, f"journal record {i}")
        return ledger, torn

    def next_gen(self, ledger: Ledger | None) -> int:
        """A generation after every one on disk (never append after a torn record)."""
        gens = [g for g, _ in self.journals()]
        return max([ledger.journal if ledger is not None else 0, *gens]) + 1

    def journals(self) -> list[tuple[int, Path]]:
        """Journal files, by generation."""
        found: list[tuple[int, Path]] = []
        with contextlib.suppress(OSError):
            for p in self.dir.iterdir():
                n = p.name[len(JOURNAL_PREFIX):]
                if p.name.startswith(JOURNAL_PREFIX) and n.isascii() and n.isdigit() \
                        and len(n) <= 18:
                    found.append((int(n), p))
        return sorted(found)

    def load_journal(self, since: int) -> tuple[list[str], int]:
        """The journal records of generations ``since`` and later, in order, and how many
        torn records were left out: the last line of a generation cut short by a crash
        (no newline, or not JSON) is dropped, never fatal. ``LedgerError`` as ``load``."""
        records: list[str] = []
        torn = 0
        for gen, path in self.journals():
            if gen < since:
                continue
            text = self._read(path) or ""
            lines = text.split("\n")
            tail = lines.pop()  # "" after a complete last line
            if tail:
                torn += 1
            if lines and not _is_json(lines[-1]):
                lines.pop()
                torn += 1
            records.extend(line for line in lines if line)
        return records, torn

    def open_journal(self, gen: int) -> None:
        """Append to generation ``gen`` from now on (the previous file is closed)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.dir / f"{JOURNAL_PREFIX}{gen}",
                         os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise LedgerError(f"cannot open ledger journal in {self.dir}: {exc}",
                              reason=WRITE_FAILED) from exc
        self.close_journal()
        self._journal_fd, self.journal_gen, self.journal_records = fd, gen, 0

    def append(self, record: str) -> None:
        """One record, one write (no fsync, like the snapshot). ``LedgerError`` when it
        cannot be written (the caller then writes a snapshot instead)."""
        if self._journal_fd is None:
            raise LedgerError("ledger journal is not open", reason=WRITE_FAILED)
        data = (record + "\n").encode()
        try:
            while data:
                data = data[os.write(self._journal_fd, data):]
        except OSError as exc:
            raise LedgerError(f"cannot append to the ledger journal: {exc}",
                              reason=WRITE_FAILED) from exc
        self.journal_records += 1

    @property
    def journal_open(self) -> bool:
        return self._journal_fd is not None

    def close_journal(self) -> None:
        if self._journal_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._journal_fd)
            self._journal_fd = None
        self.journal_records = 0

    def drop_journals(self, before: int) -> None:
        """Delete generations older than ``before`` (a snapshot now covers them)."""
        for gen, path in self.journals():
            if gen < before:
                with contextlib.suppress(OSError):
                    path.unlink()

    def _read(self, path: Path) -> str | None:
        try:
            # O_NONBLOCK: a FIFO planted as ledger.json must not hang the start.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LedgerError(f"cannot read ledger {path}: {exc}", reason=UNREADABLE) from exc
        try:
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fh.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise LedgerError(f"ledger {path} is not a file", reason=UNREADABLE)
                data = fh.read(MAX_LEDGER_BYTES + 1)
        except OSError as exc:
            raise LedgerError(f"cannot read ledger {path}: {exc}", reason=UNREADABLE) from exc
        if len(data) > MAX_LEDGER_BYTES:
            raise LedgerError(
                f"ledger {path} is larger than {MAX_LEDGER_BYTES} bytes", reason=TOO_LARGE
            )
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LedgerError(
                f"ledger {path} is not UTF-8 text (byte {exc.start})", reason=MALFORMED
            ) from exc

    def save(self, text: str) -> None:
        """Raises ``LedgerError(reason=LedgerWriteFailed)`` when the file cannot be written
        (the old ledger, if any, is left as it was)."""
        payload = text.encode()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".ledger-", dir=self.dir)
        except OSError as exc:
            raise LedgerError(f"cannot write ledger in {self.dir}: {exc}",
                              reason=WRITE_FAILED) from exc
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
            os.replace(tmp, self.path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise LedgerError(f"cannot write ledger {self.path}: {exc}",
                                  reason=WRITE_FAILED) from exc
            raise

    def quarantined(self) -> list[Path]:
        """Quarantined ledgers, oldest first."""
        found: list[tuple[int, Path]] = []
        with contextlib.suppress(OSError):
            for p in self.dir.iterdir():
                n = p.name[len(QUARANTINE_PREFIX):]
                ok = n.isascii() and n.isdigit() and len(n) <= 18
                if p.name.startswith(QUARANTINE_PREFIX) and ok:
                    found.append((int(n), p))
        return [p for _, p in sorted(found)]

    def quarantine(self) -> Path | None:
        """Move an unreadable ledger aside as ``ledger.json.corrupt.<n>`` (kept for a
        person to inspect; only the newest ``MAX_QUARANTINED`` are kept). None when there
        was nothing to move; ``LedgerError`` when it cannot be moved."""
        journals = self.journals()
        if not os.path.lexists(self.path) and not journals:
            return None
        old = self.quarantined()
        n = int(old[-1].name[len(QUARANTINE_PREFIX):]) + 1 if old else 0
        dest = self.path.with_name(f"{QUARANTINE_PREFIX}{n}")
        try:
            # The journal goes with the snapshot: ledger.journal.<gen>.corrupt.<n>.
            for _gen, path in journals:
                os.replace(path, path.with_name(f"{path.name}.corrupt.{n}"))
            if os.path.lexists(self.path):
                os.replace(self.path, dest)
        except OSError as exc:
            raise LedgerError(f"cannot move ledger {self.path} aside: {exc}",
                              reason=UNREADABLE) from exc
        for p in old[: max(0, len(old) + 1 - MAX_QUARANTINED)]:
            gone = p.name[len(QUARANTINE_PREFIX):]
            for extra in self.dir.glob(f"{JOURNAL_PREFIX}*.corrupt.{gone}"):
                with contextlib.suppress(OSError):
                    extra.unlink()
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
        return dest
