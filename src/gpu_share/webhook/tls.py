"""The serving certificate, reloaded when its files change (cert-manager rotates them).

The server's ``SSLContext`` is fixed once it listens, so the context handed to it has
an SNI callback: on each handshake (OpenSSL calls it with or without SNI; the API
server sends none for an IP) it checks the files at most every ``check_interval_s``
and moves the connection to a context with the current pair. A pair that does not
load (half-written, key and certificate not matching) keeps the last good one.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable

from gpu_share.observability.http import server_tls_context

log = logging.getLogger(__name__)

__all__ = ["ReloadingTLS", "server_context"]


def server_context(cert_file: str, key_file: str, client_ca: str | None = None
                   ) -> ssl.SSLContext:
    """TLS 1.2+ server context with one certificate chain. With ``client_ca``, a client
    certificate is asked for and, when one is sent, must be signed by that CA; one may be
    absent (the kubelet's probes send none): ``make_server(require_client_cert=True)``
    refuses reviews on such connections."""
    return server_tls_context(cert_file, key_file, client_ca, client_cert=ssl.CERT_OPTIONAL)


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class ReloadingTLS:
    """``context`` serves the current certificate of ``cert_file``/``key_file``.
    Raises OSError/ssl.SSLError when the first pair does not load."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        client_ca: str | None = None,
        check_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._files = (cert_file, key_file)
        self._client_ca = client_ca
        self._interval = check_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._stamps = self._read_stamps()
        self._checked = clock()
        self._failed_stamps: tuple[object, ...] | None = None
        self.reloads = 0
        self.context = server_context(cert_file, key_file, client_ca)
        self.context.sni_callback = self._on_hello
        self._current = self.context

    def _read_stamps(self) -> tuple[object, ...]:
        return tuple(_stamp(p) for p in self._files)

    def current(self) -> ssl.SSLContext:
        """The context of the current pair, after a check if one is due."""
        with self._lock:
            now = self._clock()
            if now - self._checked >= self._interval:
                self._checked = now
                self._maybe_reload()
            return self._current

    def _maybe_reload(self) -> None:
        stamps = self._read_stamps()
        if stamps == self._stamps or None in stamps:
            return
        try:
            ctx = server_context(*self._files, self._client_ca)
        except (OSError, ssl.SSLError) as e:
            if stamps != self._failed_stamps:  # once per change, not every second
                log.warning("TLS files changed but do not load (%s); keeping the last "
                            "good certificate", e)
                self._failed_stamps = stamps
            return
        self._current, self._stamps = ctx, stamps
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self._files[0])

    def _on_hello(self, sock: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                  ctx: ssl.SSLContext) -> None:
        try:
            current = self.current()
            if sock.context is not current:
                sock.context = current
        except Exception:  # never fail a handshake over a reload: keep the context
            log.exception("TLS reload check failed")
