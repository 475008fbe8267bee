"""The hami-core pool's per-container host dirs as the ledger's entries come and go: one
made and seeded with the slice's limits at Allocate, renamed or trashed when its entry
leaves the ledger, swept after reconciles (``agent/hostdirs.py`` does the file work).
Other modes have none: every call is then a no-op."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from gpu_share.agent.hostdirs import HostDirs, Keys, seed_region
from gpu_share.errors import AllocationError, AllocationReason
from gpu_share.sharing.model import AllocateSpec
from gpu_share.sharing.node.ledger import LedgerEntry
from gpu_share.sharing.node.limits import host_dir_key

log = logging.getLogger(__name__)


def _keys(entries: Iterable[LedgerEntry]) -> Keys:
    return {host_dir_key(e): frozenset(e.memory_ids + e.core_ids) for e in entries}


class ContainerDirs:
    """Under ``root`` (the pool's hami-core cache dir), or none when ``root`` is None."""

    def __init__(self, root: str | None) -> None:
        self.dirs = HostDirs(root) if root else None

    def start(self, entries: Iterable[LedgerEntry]) -> None:
        """The ledger as loaded: its dirs are the running containers'."""
        if self.dirs is None:
            return
        try:
            self.dirs.ensure_root()
        except OSError as exc:
            log.error("hami-core cache dir %s unusable: %s", self.dirs.root, exc)
        self.dirs.follow(_keys(entries), initial=True)

    def make(self, entry: LedgerEntry, spec: AllocateSpec) -> None:
        """The container's private cache dir, its HAMi-core region seeded with the
        slice's limits (sharing/node/hami_region.py). Raises ``HOST_DIR_UNAVAILABLE``: a
        slice whose limits cannot reach its container is not handed out."""
        if self.dirs is None:
            return
        try:
            key = host_dir_key(entry)
            self.dirs.create(key)
            seed_region(self.dirs, key, spec.envs)
        except (OSError, ValueError) as exc:
            raise AllocationError(
                f"cache dir not made: {str(exc)[:200]}",
                reason=AllocationReason.HOST_DIR_UNAVAILABLE, ref=entry.ref,
            ) from exc

    def follow(self, entries: Iterable[LedgerEntry]) -> None:
        """The ledger now holds ``entries``: the dirs of those that left it go."""
        if self.dirs is not None:
            self.dirs.follow(_keys(entries))

    def sweep(self) -> None:
        """Delete released dirs (bounded per pass; the next reconcile goes on)."""
        if self.dirs is None:
            return
        try:
            self.dirs.sweep()
        except OSError as exc:
            self.dirs.failures += 1
            log.warning("host dir cleanup: %s", exc)
