"""Connection I/O of the bounded HTTP server (observability/http_server.py).

* ``read_head``: the strict reading of a whole request head (RFC 9112) that decides how
  many body bytes follow it, or why the request is refused before any body byte is read;
* ``Reader``: a connection's receive buffer. The I/O thread fills it without blocking
  (``pull``) until ``ready()``: the whole request, head and body. A worker then parses it
  from the buffer alone (``readline``/``read``, the stdlib handler's ``rfile``): a worker
  never waits on a client;
* ``Writer``: the worker's answers, each within the write timeout;
* ``answer``/``send_once``: the few answers the I/O thread writes itself (``100
  Continue``, ``408``, ``503``), in one non-blocking send.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
from dataclasses import dataclass
from http import HTTPStatus

MAX_HEADER_BYTES = 128 * 1024  # request line (at most 64 KiB) + headers, per request
# What a connection may buffer before its head is read (one byte over the limit: the
# worker then answers 431), and what a body fitting in it costs the shared budget: none.
HEAD_ALLOWANCE = MAX_HEADER_BYTES + 1
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
_RECV = 65536

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 field names
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # not in a field value (HTAB is)
_DIGITS = re.compile(rb"[0-9]{1,18}")
_OWS = b" \t"

Refusal = tuple[int, str]  # (status, reason) of a request answered before its body

TE_REFUSED: Refusal = (
    HTTPStatus.LENGTH_REQUIRED,
    "Transfer-Encoding is not accepted; send the body with Content-Length",
)


@dataclass
class Frame:
    """What a whole request head says about the request's body.

    ``end`` is where the request ends in the buffer: after its head, and after its body
    unless the request is refused (a refused request's body is never read: the connection
    closes after the refusal, so those bytes are never parsed as a next request)."""

    head_end: int
    length: int | None = None  # Content-Length; None: the head gave none
    refusal: Refusal | None = None
    expect_continue: bool = False
    continued: bool = False  # "100 Continue" sent for this request

    @property
    def end(self) -> int:
        if self.refusal is not None or self.length is None:
            return self.head_end
        return self.head_end + self.length


def _field_error(line: bytes) -> str | None:
    """Why a header field line (its line ending removed) is malformed, None if it is not."""
    if line[:1] in (b" ", b"\t"):
        return "obsolete line folding is not accepted"
    name, colon, value = line.partition(b":")
    if not colon:
        return "header line without a colon"
    if not _TOKEN.fullmatch(name):  # also whitespace before the colon (RFC 9112 5.1)
        return "invalid header field name"
    if _CTL.search(value):
        return "invalid character in a header field value"
    return None


def _fields(lines: list[bytes]) -> dict[bytes, list[bytes]] | Refusal:
    """The header fields (lower-case names, values without surrounding whitespace) of the
    lines after the request line, up to the blank line; or the refusal of a bad one."""
    fields: dict[bytes, list[bytes]] = {}
    for raw in lines:
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if not line:
            break
        error = _field_error(line)
        if error is not None:
            return HTTPStatus.BAD_REQUEST, error
        name, _, value = line.partition(b":")
        fields.setdefault(name.lower(), []).append(value.strip(_OWS))
    return fields


def _content_length(values: list[bytes], max_body: int) -> int | Refusal | None:
    if not values:
        return None
    if len(values) > 1:
        return HTTPStatus.BAD_REQUEST, "more than one Content-Length"
    if not _DIGITS.fullmatch(values[0]):
        return HTTPStatus.BAD_REQUEST, "invalid Content-Length"
    length = int(values[0])
    if length > max_body:
        return (HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"body of {length} bytes is over the limit of {max_body} bytes")
    return length


def read_head(head: bytes, max_body: int) -> Frame:
    """The frame of a whole request head (``head`` ends with its blank line): field names
    are tokens with no whitespace before the colon, no obsolete line folding, no control
    characters in values, no ``Transfer-Encoding``, at most one ``Content-Length`` of
    ASCII digits, at most ``max_body``. The request line is the stdlib parser's to check."""
    end = len(head)
    if end > MAX_HEADER_BYTES:
        return Frame(end, refusal=(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                   f"request headers over {MAX_HEADER_BYTES} bytes"))
    request_line, *lines = head.split(b"\n")
    fields = _fields(lines)
    if isinstance(fields, tuple):
        return Frame(end, refusal=fields)
    if b"transfer-encoding" in fields:
        return Frame(end, refusal=TE_REFUSED)
    length = _content_length(fields.get(b"content-length", []), max_body)
    if isinstance(length, tuple):
        return Frame(end, refusal=length)
    expect = [v.lower() for v in fields.get(b"expect", [])]
    continue_ = expect[:1] == [b"100-continue"] and request_line.rstrip(b"\r").endswith(
        b" HTTP/1.1")
    return Frame(end, length, expect_continue=continue_)


class Reader:
    """A connection's receive buffer (see the module doc).

    It holds at most ``limit`` bytes: ``HEAD_ALLOWANCE`` until the server grants the
    current request's body more (``grant``), back to it once the request is served."""

    def __init__(self, sock: socket.socket, max_body: int) -> None:
        self.sock = sock
        self.limit = HEAD_ALLOWANCE
        self.current: Frame | None = None  # the request a worker serves
        self._max_body = max_body
        self._buf = bytearray()
        self._scanned = 0  # no end of head before this offset
        self._frame: Frame | None = None  # of the request at the start of the buffer
        self._line_budget = MAX_HEADER_BYTES

    def __len__(self) -> int:
        return len(self._buf)

    def pull(self) -> bool:
        """Read what the socket has, up to ``limit`` bytes buffered, without blocking;
        False at end of stream."""
        self.sock.setblocking(False)
        while len(self._buf) < self.limit:
            try:
                data = self.sock.recv(min(_RECV, self.limit - len(self._buf)))
            except WOULD_BLOCK:
                return True
            if not data:
                return False
            self._buf += data
        return True

    def frame(self) -> Frame | None:
        """The frame of the request at the start of the buffer, once its head is in."""
        if self._frame is None:
            end = self._head_end()
            if end is not None:
                self._frame = read_head(bytes(self._buf[:end]), self._max_body)
        return self._frame

    def _head_end(self) -> int | None:
        buf = self._buf
        ends = [i for i in (buf.find(b"\n\r\n", self._scanned), buf.find(b"\n\n", self._scanned))
                if i >= 0]
        if not ends:
            self._scanned = max(0, len(buf) - 2)
            return None
        first = min(ends)
        return first + (3 if buf[first + 1] == 0x0D else 2)

    def missing(self) -> int:
        """Body bytes of the current request still to come (0: none, or refused)."""
        frame = self.frame()
        return 0 if frame is None else max(0, frame.end - len(self._buf))

    def grant(self) -> None:
        """Let the buffer hold the current request's whole body."""
        frame = self.frame()
        if frame is not None:
            self.limit = max(HEAD_ALLOWANCE, frame.end)

    def ready(self) -> bool:
        """Whether a worker can take the next request: its head and body are in (or its
        head is refused, or over the limit: the worker answers that)."""
        frame = self.frame()
        if frame is None:
            return len(self._buf) > MAX_HEADER_BYTES
        return len(self._buf) >= frame.end

    def begin(self) -> Frame | None:
        """A worker starts on the request at the start of the buffer (``ready()``)."""
        self.current = self.frame()
        self._frame = None  # the next request's, once this one is read
        self._line_budget = MAX_HEADER_BYTES
        return self.current

    def done(self) -> None:
        """The worker is done with the current request: back to the head allowance."""
        self.current = None
        self.limit = HEAD_ALLOWANCE

    # -- the worker's side: from the buffer only ------------------------------------------

    def _take(self, n: int) -> bytes:
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self._scanned = 0
        return out

    def readline(self, limit: int = -1) -> bytes:
        cap = limit if limit >= 0 else MAX_HEADER_BYTES + 1
        i = self._buf.find(b"\n", 0, cap)
        line = self._take(i + 1 if i >= 0 else min(cap, len(self._buf)))
        self._line_budget -= len(line)
        if self._line_budget < 0:
            raise HeadersTooLarge(f"request headers over {MAX_HEADER_BYTES} bytes")
        return line

    def read(self, n: int) -> bytes:
        return self._take(min(n, len(self._buf)))


class HeadersTooLarge(http.client.LineTooLong):
    """Request line and headers over ``MAX_HEADER_BYTES`` in total (the stdlib handler
    answers a ``LineTooLong`` with 431)."""


class Writer:
    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self.sock = sock
        self._timeout_s = timeout_s

    def write(self, data: bytes) -> int:
        self.sock.settimeout(self._timeout_s)  # sendall: total time for the whole answer
        self.sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass


def answer(code: int, body: bytes, content_type: str) -> bytes:
    """A whole answer that closes the connection (written by the I/O thread)."""
    head = (f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\nServer: gpu-share\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n")
    return head.encode("latin-1") + body


def send_once(sock: socket.socket, data: bytes) -> bool:
    """One non-blocking send of ``data``; True when all of it went (otherwise the caller
    closes the connection: what is left of ``data`` is never sent)."""
    try:
        sock.setblocking(False)
        return sock.send(data) == len(data)
    except (OSError, ValueError):
        return False
