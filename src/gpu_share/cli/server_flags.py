"""The flags that size the bounded HTTP(S) server of a front-end (extender, webhook):
body cap, timeouts and workers, each with an environment variable of the CLI's prefix."""

from __future__ import annotations

import argparse
import os

from gpu_share.errors import UsageError
from gpu_share.observability.http import ServerLimits


def add_server_flags(ap: argparse.ArgumentParser, env_prefix: str, base: ServerLimits) -> None:
    """``--max-body-bytes``, ``--read-timeout-seconds``, ``--idle-timeout-seconds`` and
    ``--workers``, defaulting to ``base`` (``{env_prefix}_MAX_BODY_BYTES``, ...)."""
    env = os.environ.get
    # String defaults: argparse converts them with ``type``, so a bad env value is a
    # usage error (exit 2), not a traceback.
    ap.add_argument(
        "--max-body-bytes",
        type=int,
        default=env(f"{env_prefix}_MAX_BODY_BYTES", str(base.max_body_bytes)),
    )
    ap.add_argument(
        "--read-timeout-seconds",
        type=float,
        default=env(f"{env_prefix}_READ_TIMEOUT_SECONDS", f"{base.read_timeout_s:g}"),
        help="to receive a whole request (and to send each answer)",
    )
    ap.add_argument(
        "--idle-timeout-seconds",
        type=float,
        default=env(f"{env_prefix}_IDLE_TIMEOUT_SECONDS", f"{base.idle_timeout_s:g}"),
        help="a kept-alive connection without a request is closed after this",
    )
    ap.add_argument("--workers", type=int, default=env(f"{env_prefix}_WORKERS", str(base.workers)))


def server_limits(a: argparse.Namespace, base: ServerLimits) -> ServerLimits:
    """The limits those flags ask for (queue and connections grow with the workers past
    ``base``'s), or UsageError."""
    try:
        return ServerLimits(
            workers=a.workers,
            queue=max(base.queue, 4 * a.workers),
            max_connections=max(base.max_connections, 16 * a.workers),
            read_timeout_s=a.read_timeout_seconds,
            idle_timeout_s=a.idle_timeout_seconds,
            max_body_bytes=a.max_body_bytes,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
