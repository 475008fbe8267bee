"""The product's Kubernetes API client: JSON over the standard library.

The generated ``kubernetes`` client costs ~29 MiB of RSS to import on Python 3.11 (its
models and API classes; ``kubernetes.config`` alone pulls them in), about half of the
node agent's footprint. Every component (node agent, scheduler extender, webhook, CLI) makes a
few kinds of call (get, paged list, watch, patch, create), so all use this client:
``http.client`` + ``ssl`` + ``json``; ``kubernetes`` is imported nowhere in gpu_share.

- Configuration and credentials: ``kube.rest_config`` (``load_rest_config``).
- Every request has a connect and a read timeout; answers are bounded in size
  (``max_body_bytes``), watch events too (``listwatch.MAX_EVENT_BYTES``).
- Only a connect that failed is retried (``connect_retries``); a request that reached
  the server never is (a reused keep-alive connection the server had closed excepted).
- HTTP errors raise ``ApiError`` (a ``KubeAccessError`` with the status), transport
  and decoding failures ``KubeAccessError``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Unpack
from urllib.parse import quote, urlencode, urlsplit

from gpu_share.errors import KubeAccessError
from gpu_share.kube.rest_config import (
    BearerToken,
    ConfigSources,
    RestConfig,
    load_rest_config,
    ssl_context,
)
from gpu_share.observability.hostnames import ascii_host

__all__ = [
    "ApiError",
    "KubeTimeouts",
    "RestClient",
    "RestConfig",
    "RestWatch",
    "load_rest_config",
    "make_rest_client",
    "quote_name",
]

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
# A node's pod list page (500 pods) is a few MiB at most; this only stops a runaway.
MAX_BODY_BYTES = 64 * 2**20
MAX_ERROR_BODY_BYTES = 64 * 2**10
MAX_IDLE_CONNECTIONS = 4
WATCH_CHUNK_BYTES = 64 * 2**10
# A reused keep-alive connection the server closed fails on first use: retried once.
_STALE_ERRORS = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


@dataclass(frozen=True)
class KubeTimeouts:
    """Seconds; ``read`` bounds the wait for each response (not for a whole watch)."""

    connect: float = 5.0
    read: float = 15.0

    def pair(self) -> tuple[float, float]:
        return (self.connect, self.read)


class ApiError(KubeAccessError):
    """The API server answered with an HTTP error ``status`` (``message`` from its
    Status object). ``reason`` KubeForbidden for 401/403, else KubeUnreachable."""

    def __init__(self, op: str, status: int, detail: str) -> None:
        reason = "KubeForbidden" if status in (401, 403) else "KubeUnreachable"
        super().__init__(f"{op}: API server answered {status}: {detail}", reason=reason)
        self.status = status
        self.detail = detail


def quote_name(name: str) -> str:
    """One path segment (a namespace or object name)."""
    return quote(name, safe="")


def make_rest_client(
    kubeconfig: str | None = None,
    *,
    timeouts: KubeTimeouts | None = None,
    **where: Unpack[ConfigSources],
) -> RestClient:
    """A ``RestClient`` configured as ``load_rest_config`` says. Raises KubeAccessError."""
    return RestClient(load_rest_config(kubeconfig, **where), timeouts=timeouts)


# ---------------------------------------------------------------- the client


@dataclass
class _Answer:
    status: int
    body: bytes


@dataclass
class RestClient:
    """JSON requests to one API server. Thread-safe; keeps up to ``max_idle`` idle
    connections (a caller with N threads writing at once wants N: a new TLS connection
    costs more than the request)."""

    config: RestConfig
    timeouts: KubeTimeouts | None = None
    user_agent: str = "gpu-share-plugin"
    max_body_bytes: int = MAX_BODY_BYTES
    connect_retries: int = 0  # more tries of a connect that failed (never of a request)
    max_idle: int = MAX_IDLE_CONNECTIONS
    _idle: list[http.client.HTTPConnection] = field(default_factory=list, init=False,
                                                    repr=False)

    def __post_init__(self) -> None:
        if self.timeouts is None:
            self.timeouts = KubeTimeouts()
        url = urlsplit(self.config.server)
        self._https = url.scheme == "https"
        self._host = url.hostname or ""
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")
        self._ssl = ssl_context(self.config) if self._https else None
        self._token = BearerToken(self.config)
        self._lock = threading.Lock()

    @property
    def host(self) -> str:
        return self.config.server

    @property
    def t(self) -> KubeTimeouts:
        assert self.timeouts is not None
        return self.timeouts

    # -- verbs (op names the call in errors: "get pod ns/name")

    def get(self, op: str, path: str, query: Mapping[str, Any] | None = None) -> Any:
        return self.request(op, "GET", path, query=query)

    def patch(self, op: str, path: str, body: Any,
              content_type: str = STRATEGIC_MERGE_PATCH) -> Any:
        return self.request(op, "PATCH", path, body=body, content_type=content_type)

    def create(self, op: str, path: str, body: Any) -> Any:
        return self.request(op, "POST", path, body=body)

    def request(
        self, op: str, method: str, path: str, *, query: Mapping[str, Any] | None = None,
        body: Any = None, content_type: str = JSON,
    ) -> Any:
        """One call; its JSON answer (``{}`` when empty). Raises ApiError for an HTTP
        error, KubeAccessError for transport errors and bad or oversized answers."""
        data = json.dumps(body).encode() if body is not None else None
        answer = self._send(op, method, self._url(path, query), data, content_type)
        if answer.status >= 400:
            raise ApiError(op, answer.status, _status_message(answer.body))
        try:
            return json.loads(answer.body) if answer.body else {}
        except ValueError as e:
            raise KubeAccessError(f"{op}: undecodable answer from API server: {e}") from e

    def watch(self, op: str, path: str, query: Mapping[str, Any], timeout_s: float) -> RestWatch:
        """Open a streaming watch; ``timeout_s`` bounds the silence between two reads
        (the server ends the watch after its own ``timeoutSeconds``). Raises ApiError
        (e.g. 410) or KubeAccessError."""
        conn = self._connect(op, reuse=False)
        try:
            conn.request("GET", self._url(path, query), headers=self._headers(None, JSON))
            assert conn.sock is not None
            conn.sock.settimeout(timeout_s)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise KubeAccessError(f"{op}: API server unreachable: {_describe(e)}") from e
        if resp.status >= 400:
            try:
                raw = resp.read(MAX_ERROR_BODY_BYTES)
            except (OSError, http.client.HTTPException):
                raw = b""
            conn.close()
            raise ApiError(op, resp.status, _status_message(raw))
        return RestWatch(conn, resp, op)

    # -- plumbing

    def _url(self, path: str, query: Mapping[str, Any] | None) -> str:
        url = self._prefix + path
        if query:
            pairs = {k: _query_value(v) for k, v in query.items() if v is not None}
            url += "?" + urlencode(pairs)
        return url

    def _headers(self, data: bytes | None, content_type: str) -> dict[str, str]:
        headers = {"Accept": JSON, "User-Agent": self.user_agent}
        if data is not None:
            headers["Content-Type"] = content_type
        auth = self._token.header()
        if auth:
            headers["Authorization"] = auth
        return headers

    def _connect(self, op: str, *, reuse: bool) -> http.client.HTTPConnection:
        if reuse:
            with self._lock:
                while self._idle:
                    idle = self._idle.pop()
                    if not _dropped(idle):
                        return idle
                    idle.close()
        # Only a connect that failed is retried: nothing reached the server yet.
        for attempt in range(self.connect_retries + 1):
            try:
                return self._open(op)
            except KubeAccessError as e:
                # A refused TLS handshake would be refused again.
                if attempt == self.connect_retries or isinstance(e.__cause__, ssl.SSLError):
                    raise
        raise AssertionError("not reached")

    def _open(self, op: str) -> http.client.HTTPConnection:
        t = self.t
        conn: http.client.HTTPConnection
        if self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=t.connect,
                                               context=self._ssl)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=t.connect)
        try:
            # getaddrinfo takes a bytes host too (typeshed says str).
            sock = socket.create_connection((ascii_host(self._host), self._port),  # type: ignore[arg-type]
                                            t.connect)
            conn.sock = sock
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as http.client
            if self._https:
                assert self._ssl is not None
                name = self.config.tls_server_name or self._host
                conn.sock = self._ssl.wrap_socket(sock, server_hostname=ascii_host(name))
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise KubeAccessError(f"{op}: API server unreachable: {_describe(e)}") from e
        assert conn.sock is not None
        conn.sock.settimeout(t.read)
        return conn

    def _send(self, op: str, method: str, url: str, data: bytes | None,
              content_type: str) -> _Answer:
        for attempt in (0, 1):
            conn = self._connect(op, reuse=attempt == 0)
            reused = attempt == 0 and getattr(conn, "_gs_used", False)
            try:
                conn.request(method, url, body=data, headers=self._headers(data, content_type))
                resp = conn.getresponse()
                answer = self._read(op, resp)
            except _STALE_ERRORS as e:
                conn.close()
                if reused:
                    continue
                raise KubeAccessError(f"{op}: API server unreachable: {_describe(e)}") from e
            except KubeAccessError:
                conn.close()
                raise
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise KubeAccessError(f"{op}: API server unreachable: {_describe(e)}") from e
            self._release(conn, resp)
            return answer
        raise AssertionError("not reached")

    def _read(self, op: str, resp: http.client.HTTPResponse) -> _Answer:
        limit = self.max_body_bytes if resp.status < 400 else MAX_ERROR_BODY_BYTES
        length = resp.getheader("Content-Length")
        if resp.status < 400 and length and length.isdigit() and int(length) > limit:
            raise KubeAccessError(f"{op}: answer of {length} bytes is over the {limit}"
                                  " byte bound")
        body = resp.read(limit + 1)
        if len(body) > limit:
            if resp.status >= 400:
                return _Answer(resp.status, body[:limit])
            raise KubeAccessError(f"{op}: answer is over the {limit} byte bound")
        return _Answer(resp.status, body)

    def _release(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        if resp.will_close or not resp.isclosed():
            conn.close()
            return
        conn._gs_used = True  # type: ignore[attr-defined]
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """An idle keep-alive connection the server closed (readable: EOF or junk)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _query_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _status_message(body: bytes) -> str:
    """The ``message`` of a Status answer, else the start of the body."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        msg = json.loads(body).get("message")
        if msg:
            return str(msg)[:500]
    return body[:200].decode("utf-8", "replace")


def _describe(e: BaseException) -> str:
    return str(e) or type(e).__name__


class RestWatch:
    """A streaming watch answer as decoded events (``listwatch.WatchStream``)."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse,
                 op: str) -> None:
        self._conn = conn
        self._resp = resp
        self._op = op

    def stream(self, amt: Any = None, decode_content: Any = None) -> Iterator[bytes]:
        """Raw chunks as they arrive (for ``listwatch._lines``)."""
        while True:
            chunk = self._resp.read1(WATCH_CHUNK_BYTES)
            if not chunk:
                return
            yield chunk

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        from gpu_share.kube.listwatch import WatchEventError, _lines

        try:
            for line in _lines(self):
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise WatchEventError(f"{self._op}: a watch line is not an object")
                yield event
        except (OSError, http.client.HTTPException) as e:
            raise KubeAccessError(f"{self._op}: {_describe(e)}") from e

    def interrupt(self) -> None:
        """Unblock a read in another thread (the socket is shut down, not closed)."""
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def close(self) -> None:
        # Never back to the idle pool: a watch connection ends with the watch.
        self.interrupt()
        self._conn.close()
