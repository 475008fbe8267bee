"""Notice kubelet restarts and deleted sockets by polling ``stat``.

A restarting kubelet deletes every socket in the device-plugin dir and creates a new
``kubelet.sock``. Inode numbers can be reused right away, so a socket is identified by
(device, inode, ctime): a re-created file differs in at least one of them.
"""

from __future__ import annotations

import os

SocketId = tuple[int, int, int]


def socket_identity(path: str | os.PathLike[str]) -> SocketId | None:
    """Identity of the file at ``path``, or None when there is none."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)
