"""Unix-socket housekeeping shared by the gRPC front-ends (device plugin, DRA plugin):
path limits, stale files, a live socket that is someone else's, file identity.

No grpc here: the front-ends bind; this module only checks and clears paths.
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
# Reasons of ``SocketServeError``.
SOCKET_PATH_TOO_LONG = "SocketPathTooLong"
SOCKET_IN_USE = "SocketInUse"
SOCKET_BIND_FAILED = "SocketBindFailed"

# (device, inode, ctime): a re-created file differs in at least one (inodes are reused).
SocketId = tuple[int, int, int]


class SocketServeError(GpuShareError):
    """A unix socket cannot be served (path too long, in use, bind refused)."""

    reason = SOCKET_BIND_FAILED


def socket_identity(
    path: str | os.PathLike[str], *, follow_symlinks: bool = True
) -> SocketId | None:
    """Identity of the file at ``path``, or None when there is none."""
    try:
        st = os.stat(path, follow_symlinks=follow_symlinks)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def unix_target(path: Path, setting: str) -> str:
    """The ``unix://`` target for ``path``; ``SocketServeError`` when the OS cannot bind
    it (gRPC would only say "Failed to bind"). ``setting``: what to shorten."""
    full = os.fsencode(path.resolve())
    if len(full) > UNIX_PATH_MAX:
        raise SocketServeError(
            f"socket path {os.fsdecode(full)} is {len(full)} bytes, the limit is"
            f" {UNIX_PATH_MAX} (AF_UNIX); use a shorter {setting}",
            reason=SOCKET_PATH_TOO_LONG,
        )
    return f"unix://{os.fsdecode(full)}"


def claim_socket_path(path: Path, probe_timeout_s: float = 1.0) -> None:
    """Make ``path`` free to bind: remove a stale socket (or file) left there, but refuse
    (``SocketServeError``) when a live server answers on it -- it is someone else's."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise SocketServeError(f"socket path {path} is a directory", reason=SOCKET_IN_USE)
    if stat.S_ISSOCK(st.st_mode) and answers(path, probe_timeout_s):
        raise SocketServeError(
            f"socket {path} is served by another live process (another agent on this"
            " node?); not taking it over",
            reason=SOCKET_IN_USE,
        )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # stale: a crash, a killed agent, kubelet leftovers


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
            raise SocketServeError(f"cannot probe socket {path}: {exc}") from exc
        return True
