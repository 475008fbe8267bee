"""Unix-socket housekeeping of the DRA front-end: path checks, stale files, identity,
owner-only modes.

The device-plugin front-end (``gpu_share.plugin.server`` / ``plugin.watcher``) has the
same needs; it sits in the same layer, so this module does not import it (moving the
shared part to a lower layer is a separate change).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from pathlib import Path

from gpu_share.errors import GpuShareError

# sockaddr_un.sun_path holds 108 bytes on Linux, the last one the terminating NUL.
UNIX_PATH_MAX = 107
SOCKET_MODE = 0o600  # only the kubelet (root) dials us
DIR_MODE = 0o700
# Reasons of ``DraServeError``.
SOCKET_PATH_TOO_LONG = "SocketPathTooLong"
SOCKET_IN_USE = "SocketInUse"
SOCKET_BIND_FAILED = "SocketBindFailed"

# (device, inode, ctime): a re-created file differs in at least one (inodes are reused).
SocketId = tuple[int, int, int]


class DraServeError(GpuShareError):
    """A DRA socket cannot be served (path too long, in use, bind refused)."""

    reason = SOCKET_BIND_FAILED


def socket_identity(path: str | os.PathLike[str]) -> SocketId | None:
    """Identity of the file at ``path`` (not following a symlink), or None if absent."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def unix_target(path: Path) -> str:
    """The ``unix://`` target for ``path``; ``DraServeError`` when the OS cannot bind it
    (gRPC would only say "Failed to bind")."""
    full = os.fsencode(path.resolve())
    if len(full) > UNIX_PATH_MAX:
        raise DraServeError(
            f"socket path {os.fsdecode(full)} is {len(full)} bytes, the limit is"
            f" {UNIX_PATH_MAX} (AF_UNIX); use a shorter dra.pluginDir / dra.registrationDir",
            reason=SOCKET_PATH_TOO_LONG,
        )
    return f"unix://{os.fsdecode(full)}"


def ensure_dir(path: Path, *, own: bool) -> None:
    """Create ``path`` (0700) if missing. ``own``: the dir is ours alone (the driver's
    plugin dir), so tighten an existing one to 0700 too; the kubelet's registry dir is
    left as the kubelet made it."""
    try:
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        if own:
            st = path.lstat()
            if not stat.S_ISDIR(st.st_mode):
                raise DraServeError(f"{path} is not a directory")
            if stat.S_IMODE(st.st_mode) != DIR_MODE:
                os.chmod(path, DIR_MODE)
    except OSError as exc:
        raise DraServeError(f"cannot prepare directory {path}: {exc}") from exc


def claim_socket_path(path: Path, probe_timeout_s: float = 1.0) -> None:
    """Make ``path`` free to bind: remove a stale socket or file left there, but refuse
    (``DraServeError``) when a live server answers on it -- it is someone else's."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise DraServeError(f"socket path {path} is a directory", reason=SOCKET_IN_USE)
    if stat.S_ISSOCK(st.st_mode) and answers(path, probe_timeout_s):
        raise DraServeError(
            f"socket {path} is served by another live process (another agent on this"
            " node?); not taking it over",
            reason=SOCKET_IN_USE,
        )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # stale: a crash, a killed agent


def answers(path: Path, timeout_s: float) -> bool:
    """True when something accepts connections on the unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout_s)
        try:
            probe.connect(os.fspath(path))
        except TimeoutError:
            return True  # a full backlog: someone listens
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                return False
            raise DraServeError(f"cannot probe socket {path}: {exc}") from exc
        return True


def restrict_socket(path: Path) -> None:
    """Owner-only mode on a socket just bound (gRPC binds with the umask's mode)."""
    try:
        os.chmod(path, SOCKET_MODE)
    except OSError as exc:
        raise DraServeError(f"cannot set mode of {path}: {exc}") from exc
