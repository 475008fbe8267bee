"""Durable state of the node agent: the ledger file, written atomically."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from gpu_share.errors import LedgerError

LEDGER_FILE = "ledger.json"


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
        """The ledger's text, or None when there is none yet."""
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LedgerError(f"cannot read ledger {self.path}: {exc}") from exc

    def save(self, text: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        payload = text.encode()
        fd, tmp = tempfile.mkstemp(prefix=".ledger-", dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def quarantine(self) -> Path | None:
        """Move an unreadable ledger aside (kept for a person to inspect)."""
        if not self.path.exists():
            return None
        n = 0
        while True:
            dest = self.path.with_name(f"{LEDGER_FILE}.corrupt.{n}")
            if not dest.exists():
                os.replace(self.path, dest)
                return dest
            n += 1
