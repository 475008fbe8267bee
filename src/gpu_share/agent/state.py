"""Durable state of the node agent: the ledger file, written atomically."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from gpu_share.errors import LedgerError
from gpu_share.sharing.ledger import MALFORMED

LEDGER_FILE = "ledger.json"
QUARANTINE_PREFIX = f"{LEDGER_FILE}.corrupt."
# A real ledger is a few KiB per container; anything near this is not ours.
MAX_LEDGER_BYTES = 64 * 1024 * 1024
# Quarantined files kept for a person to inspect; older ones are deleted.
MAX_QUARANTINED = 5

# LedgerError reasons raised here (the others come from sharing.ledger).
UNREADABLE = "LedgerUnreadable"  # I/O error, or not a regular file
TOO_LARGE = "LedgerTooLarge"
WRITE_FAILED = "LedgerWriteFailed"  # disk full, EACCES, read-only file system, ...


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

    def load(self) -> str | None:
        """The ledger's text, or None when there is none yet. Raises ``LedgerError`` only
        (unreadable, not a regular file, over ``MAX_LEDGER_BYTES``, not UTF-8)."""
        try:
            # O_NONBLOCK: a FIFO planted as ledger.json must not hang the start.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LedgerError(f"cannot read ledger {self.path}: {exc}", reason=UNREADABLE) from exc
        try:
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fh.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise LedgerError(f"ledger {self.path} is not a file", reason=UNREADABLE)
                data = fh.read(MAX_LEDGER_BYTES + 1)
        except OSError as exc:
            raise LedgerError(f"cannot read ledger {self.path}: {exc}", reason=UNREADABLE) from exc
        if len(data) > MAX_LEDGER_BYTES:
            raise LedgerError(
                f"ledger {self.path} is larger than {MAX_LEDGER_BYTES} bytes", reason=TOO_LARGE
            )
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LedgerError(
                f"ledger {self.path} is not UTF-8 text (byte {exc.start})", reason=MALFORMED
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
        if not os.path.lexists(self.path):
            return None
        old = self.quarantined()
        n = int(old[-1].name[len(QUARANTINE_PREFIX):]) + 1 if old else 0
        dest = self.path.with_name(f"{QUARANTINE_PREFIX}{n}")
        try:
            os.replace(self.path, dest)
        except OSError as exc:
            raise LedgerError(f"cannot move ledger {self.path} aside: {exc}",
                              reason=UNREADABLE) from exc
        for p in old[: max(0, len(old) + 1 - MAX_QUARANTINED)]:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
        return dest
