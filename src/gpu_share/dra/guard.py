"""Bounds on what the DRA front-end reads and says back.

Every request is checked for size before it is parsed and parsed by us, not by gRPC:
gRPC answers INTERNAL for bytes it cannot decode, and a bad request must read as
INVALID_ARGUMENT. Status and per-claim error texts are bounded and quote at most a
short prefix of what the caller sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError

log = logging.getLogger(__name__)

# What the transport accepts at all (larger: RESOURCE_EXHAUSTED from gRPC itself); the
# kubelet's client takes answers up to this size too.
MAX_MESSAGE_BYTES = 4 << 20
# A request above this is refused unparsed (INVALID_ARGUMENT): far above what the
# kubelet sends (one pod's claims of this driver, each three short names).
MAX_REQUEST_BYTES = 256 << 10
# Status messages and per-claim errors never exceed this many characters.
MAX_STATUS_MESSAGE = 1024
# Characters of caller input a message may quote.
MAX_QUOTE = 64
# Trailing-metadata key carrying the error's reason next to the status message.
REASON_METADATA_KEY = "gpu-share-reason"
INVALID_REQUEST = "InvalidDraRequest"


def bounded(text: str, limit: int = MAX_STATUS_MESSAGE) -> str:
    """``text`` cut to ``limit`` characters (marked with "...")."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def quote(value: str) -> str:
    """A short, printable quote of caller input for a message."""
    if len(value) <= MAX_QUOTE:
        return repr(value)
    return f"{value[:MAX_QUOTE]!r}... ({len(value)} characters)"


@dataclass(frozen=True)
class Malformed:
    """Stands for a request that could not be read; the handler answers ``why``."""

    why: str


class _Parsable(Protocol):
    def ParseFromString(self, serialized: bytes, /) -> int: ...


M = TypeVar("M", bound=_Parsable)


def parser(factory: Callable[[], M], name: str) -> Callable[[bytes], M | Malformed]:
    """A gRPC request deserializer for ``factory``'s message that never raises: bytes
    over ``MAX_REQUEST_BYTES`` or not a valid ``name`` come back as ``Malformed``."""

    def parse(data: bytes) -> M | Malformed:
        if len(data) > MAX_REQUEST_BYTES:
            return Malformed(
                f"{name} is {len(data)} bytes, above the limit of {MAX_REQUEST_BYTES}"
            )
        message = factory()
        try:
            message.ParseFromString(data)
        except (DecodeError, ValueError, RecursionError):
            return Malformed(f"{name} is not a valid protobuf message")
        return message

    return parse


def abort(
    context: grpc.ServicerContext,
    code: grpc.StatusCode,
    message: str,
    reason: str,
) -> NoReturn:
    """End the call with ``code`` and a bounded ``message``; never returns."""
    context.set_trailing_metadata(((REASON_METADATA_KEY, reason),))
    context.abort(code, bounded(message))
    raise AssertionError("context.abort returned")  # it always raises


def invalid(context: grpc.ServicerContext, call: str, why: str) -> NoReturn:
    log.warning("%s: invalid request: %s", call, bounded(why))
    abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{call}: {why}", INVALID_REQUEST)


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def unary(
    behaviour: Callable[[Any, grpc.ServicerContext], Any],
    deserializer: Callable[[bytes], Any],
) -> grpc.RpcMethodHandler[Any, Any]:
    """A unary method handler reading requests with ``deserializer`` (see ``parser``)."""
    return grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=deserializer, response_serializer=_serialize
    )
