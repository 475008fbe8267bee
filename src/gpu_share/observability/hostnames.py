"""Host names as ``socket`` and ``ssl`` take them without loading the IDNA codec."""

from __future__ import annotations


def ascii_host(name: str) -> str | bytes:
    """An ASCII name goes as bytes: ``getaddrinfo`` and ``ssl`` encode a str with the
    IDNA codec, whose import (stringprep, unicodedata) costs a long-running process
    about 0.4 MiB for names that never need it. A non-ASCII name stays a str."""
    return name.encode("ascii") if name.isascii() else name
