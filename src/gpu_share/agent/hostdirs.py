"""Per-container host directories under one root (HAMi-core's cache dir).

Created at Allocate (named ``sharing.node.limits.host_dir_key``: pod UID + container, so a
later pod of the same name never inherits one) and removed when the ledger entry is
released, whatever released it: ``follow`` is given the keys of the ledger after every
change and trashes the dirs whose keys left it (a blind entry's key that left because the
entry was named, its ids now the named key's, is renamed to that key instead: its
container runs).
The container owns its dir's contents (symlinks, deep trees, many files), so:
every step is relative to a descriptor of the root opened with ``O_NOFOLLOW``; a
released dir is first renamed to ``.trash-*`` inside the root (atomic; its name is free
at once), then deleted without following symlinks, with a bounded number of entries per
pass and of open descriptors (a subtree deeper than ``max_depth`` is moved up into the
trash and deleted on its own). Whatever a pass leaves is resumed by the next ``sweep``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import TypeAlias

from gpu_share.sharing.node.limits import passes_on

log = logging.getLogger(__name__)
Keys: TypeAlias = Mapping[str, frozenset[str]]  # host dir key -> unit ids its entry holds


TRASH_PREFIX = ".trash-"
ROOT_MODE = 0o711  # host users cannot list the root (the names are pod UIDs)
# The container's user is unknown to the agent (image USER, runAsUser); the dir is
# mounted into that one container only.
LEAF_MODE = 0o777
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_serial = itertools.count()


def seed_region(dirs: HostDirs, key: str, envs: Mapping[str, str]) -> None:
    """HAMi-core's region in the dir ``key``, its limits those of ``envs`` (the slice's
    response): set before any process of the container runs (sharing/node/hami_region.py)."""
    # Loaded on first use: only pools enforcing with HAMi-core seed regions (~0.5 MiB).
    from gpu_share.sharing.node import hami_region

    parts = hami_region.region_parts(*hami_region.limits_from_env(envs))
    dirs.seed(key, hami_region.CACHE_FILE, parts, hami_region.FILE_SIZE)


class HostDirs:
    def __init__(self, root: str, *, budget: int = 20_000, max_depth: int = 32) -> None:
        self.root = os.path.abspath(root)
        self._budget = budget
        self._max_depth = max_depth
        self._known: dict[str, frozenset[str]] = {}
        self.failures = 0  # filesystem operations that failed (logged)

    def path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def ensure_root(self) -> None:
        """Create the root (and parents) if missing; it must be a real directory."""
        os.makedirs(self.root, mode=ROOT_MODE, exist_ok=True)
        fd = self._open_root()
        try:
            os.fchmod(fd, ROOT_MODE)
        finally:
            os.close(fd)

    def create(self, key: str) -> str:
        """Create (or keep: the container's other Allocate) the dir ``key``; OSError when
        something else is in its place (a symlink, a file, another owner's dir)."""
        _check_key(key)
        root = self._open_root()
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(key, LEAF_MODE, dir_fd=root)
            fd = os.open(key, _DIR_FLAGS, dir_fd=root)  # ELOOP/ENOTDIR: not a plain dir
            try:
                if os.fstat(fd).st_uid != os.geteuid():
                    raise PermissionError(f"{self.path(key)} is not owned by the agent")
                os.fchmod(fd, LEAF_MODE)  # mkdir's mode went through the umask
            finally:
                os.close(fd)
        finally:
            os.close(root)
        return self.path(key)

    def seed(self, key: str, name: str, parts: Iterable[tuple[int, bytes]], size: int) -> bool:
        """Write file ``name`` of ``size`` bytes, ``parts`` (offset, bytes) in it and zeros
        elsewhere (sparse), in the dir ``key`` unless it is there already (the
        container's other Allocate, or its process was first); True when written. Never
        through a symlink; mode 0666: the container's user is unknown."""
        _check_key(key)
        _check_key(name)
        root = self._open_root()
        try:
            leaf = os.open(key, _DIR_FLAGS, dir_fd=root)
        finally:
            os.close(root)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.stat(name, dir_fd=leaf, follow_symlinks=False)
                return False  # there already: the first writer's limits stand
            tmp = f"{TRASH_PREFIX}{name}-{os.getpid()}-{next(_serial)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o666, dir_fd=leaf)
            try:
                os.fchmod(fd, 0o666)
                for offset, data in parts:
                    _pwrite_all(fd, data, offset)
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
            try:  # link, not rename: a file already there (the first writer's) stays
                os.link(tmp, name, src_dir_fd=leaf, dst_dir_fd=leaf, follow_symlinks=False)
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp, dir_fd=leaf)
        finally:
            os.close(leaf)

    def follow(self, current: Keys, *, initial: bool = False) -> None:
        """The ledger now holds ``current``: trash (or, when named, rename) the dirs of
        keys that left it since the last call. ``initial``: only remember ``current``."""
        gone = [k for k in self._known if k not in current]
        new = {k: ids for k, ids in current.items() if k not in self._known}
        previous, self._known = self._known, dict(current)
        if initial:
            return
        for key in gone:
            heir = _heir(key, previous[key], new)
            try:
                if heir is None or not self._rename(key, heir):
                    self.trash(key)
            except (OSError, ValueError) as exc:
                self.failures += 1
                log.warning("host dir %s not released: %s", self.path(key), exc)

    def trash(self, key: str) -> bool:
        """Move ``key`` out of the way (the next ``sweep`` deletes it); False if absent."""
        _check_key(key)
        return self._rename(key, _trash_name(key))

    def sweep(self) -> bool:
        """Delete trash, at most ``budget`` entries; True when no trash is left."""
        root = self._open_root()
        try:
            budget = self._budget
            for name in sorted(os.listdir(root)):
                if not name.startswith(TRASH_PREFIX):
                    continue
                if budget <= 0:
                    return False
                budget = self._remove(root, name, budget)
            return budget > 0
        finally:
            os.close(root)

    # -- internals

    def _open_root(self) -> int:
        return os.open(self.root, _DIR_FLAGS)

    def _rename(self, src: str, dst: str) -> bool:
        """Rename within the root unless ``dst`` exists; False when ``src`` is absent."""
        _check_key(src)
        root = self._open_root()
        try:
            try:
                os.stat(dst, dir_fd=root, follow_symlinks=False)
                return False
            except FileNotFoundError:
                pass
            try:
                os.rename(src, dst, src_dir_fd=root, dst_dir_fd=root)
            except FileNotFoundError:
                return False
            return True
        finally:
            os.close(root)

    def _remove(self, root: int, name: str, budget: int) -> int:
        """Delete ``name`` (in ``root``) as far as ``budget`` allows; the budget left."""
        try:
            top = os.open(name, _DIR_FLAGS, dir_fd=root)
        except FileNotFoundError:
            return budget
        except OSError:  # a symlink or a file (ELOOP/ENOTDIR): unlink the entry itself
            os.unlink(name, dir_fd=root)
            return budget - 1
        stack: list[tuple[int, str, int]] = [(root, name, top)]  # (parent fd, name, fd)
        try:
            while stack and budget > 0:
                _, _, fd = stack[-1]
                child, budget = self._empty_step(root, fd, len(stack), budget)
                if child is not None:
                    stack.append(child)
                elif budget > 0:
                    parent, dname, dfd = stack.pop()
                    os.close(dfd)
                    os.rmdir(dname, dir_fd=parent)
                    budget -= 1
        finally:
            for _, _, fd in stack:
                os.close(fd)
        return budget

    def _empty_step(
        self, root: int, fd: int, depth: int, budget: int
    ) -> tuple[tuple[int, str, int] | None, int]:
        """Unlink non-directories of ``fd``; stop at the first subdirectory and return it
        opened (or, too deep, moved to the trash). None when ``fd`` is (now) empty."""
        with os.scandir(fd) as it:
            for entry in it:
                if budget <= 0:
                    return None, 0
                budget -= 1
                if not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.name, dir_fd=fd)
                    continue
                if depth >= self._max_depth:
                    dst = _trash_name("deep")
                    os.rename(entry.name, dst, src_dir_fd=fd, dst_dir_fd=root)
                    continue
                try:
                    sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    os.unlink(entry.name, dir_fd=fd)  # swapped for a symlink meanwhile
                    continue
                return (fd, entry.name, sub), budget
        return None, budget


def _heir(key: str, ids: frozenset[str], new: Keys) -> str | None:
    """The new key that takes over ``key``'s dir. Only a blind dir passes on, and only to
    a key holding all its ids: a released container's dir (its HAMi-core region: limits,
    usage) must never reach the next container the kubelet gives those ids to."""
    if not ids or not passes_on(key):
        return None
    return next((k for k, v in new.items() if ids <= v), None)


def _trash_name(key: str) -> str:
    return f"{TRASH_PREFIX}{time.time_ns():x}-{next(_serial)}-{key}"


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _check_key(key: str) -> None:
    # One plain path component: the key never walks out of the root.
    if not key or key in (".", "..") or "/" in key or "\0" in key or key.startswith("."):
        raise ValueError(f"not a host dir key: {key[:100]!r}")
