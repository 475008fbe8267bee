"""Unix-socket housekeeping of the DRA front-end: owner-only dirs and modes, on top of
the checks it shares with the device-plugin front-end (``agent.unixsock``).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpu_share.agent.unixsock import (
    SOCKET_BIND_FAILED,
    SOCKET_IN_USE,
    SOCKET_PATH_TOO_LONG,
    SocketId,
    SocketServeError,
    answers,
    claim_socket_path,
    unix_target,
)
from gpu_share.agent.unixsock import socket_identity as _identity

__all__ = [
    "SOCKET_BIND_FAILED",
    "SOCKET_IN_USE",
    "SOCKET_PATH_TOO_LONG",
    "DraServeError",
    "SocketId",
    "answers",
    "claim_socket_path",
    "dra_target",
    "ensure_dir",
    "restrict_socket",
    "socket_identity",
    "unix_target",
]

SOCKET_MODE = 0o600  # only the kubelet (root) dials us
DIR_MODE = 0o700

# What the DRA server raises when a socket cannot be served.
DraServeError = SocketServeError


def socket_identity(path: str | os.PathLike[str]) -> SocketId | None:
    """Identity of the file at ``path`` itself (a symlink is not followed)."""
    return _identity(path, follow_symlinks=False)


def dra_target(path: Path) -> str:
    return unix_target(path, "dra.pluginDir / dra.registrationDir")


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


def restrict_socket(path: Path) -> None:
    """Owner-only mode on a socket just bound (gRPC binds with the umask's mode)."""
    try:
        os.chmod(path, SOCKET_MODE)
    except OSError as exc:
        raise DraServeError(f"cannot set mode of {path}: {exc}") from exc
