"""Checks the extender's request bodies before any logic sees them, with the one reader
of untrusted JSON (``sharing.untrusted``) and the documents below.

Every route answers 400 with a short reason when its body is not what kube-scheduler
sends: not UTF-8, not JSON (``NaN``/``Infinity`` included), or a field of the wrong type
at any level core.py reads. After ``filter_args``/``bind_args`` the core reads typed
``extender.api`` values; the pod and node objects stay the parsed mappings (a node is
answered back whole), checked where the core reads them. Node objects, the only part
of a request an answer echoes, may nest at most ``MAX_DEPTH`` levels, so every answer
stays encodable. Reasons never echo more than ``REASON_LIMIT`` characters of the input.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from gpu_share.errors import InputError
from gpu_share.extender.api import ExtenderArgs, ExtenderBindingArgs
from gpu_share.observability import jsonbody
from gpu_share.observability.http import REASON_LIMIT, short_repr
from gpu_share.sharing.quantity import QuantityError, parse_quantity
from gpu_share.sharing.untrusted import MAX_ITEMS, Document, Name, read_value

MAX_DEPTH = 64  # nesting of an echoed node object; a Node is about 8 deep


class BadRequest(InputError):
    """The request body is malformed; ``str(e)`` is the short reason answered with 400."""


def _bad(message: str) -> BadRequest:
    return BadRequest(message[: REASON_LIMIT * 2])


def parse_json(body: bytes) -> Any:
    """Strict JSON from a request body (observability.jsonbody), or ``BadRequest``."""
    try:
        return jsonbody.parse_json(body, None)
    except jsonbody.BadJson as e:
        raise BadRequest(str(e)) from None


def _quantity(value: int | float | str) -> int | float | str:
    """A Kubernetes quantity as JSON carries one: the one grammar, bounded."""
    if isinstance(value, str):
        try:
            parse_quantity(value)
        except QuantityError:
            raise ValueError(f"not a quantity: {short_repr(value, 40)}") from None
    elif not math.isfinite(value) or abs(value) >= 2**63:
        raise ValueError("quantity out of range")
    return value


_Quantities = dict[str, Annotated[int | float | str, AfterValidator(_quantity)]]


class _Resources(Document):
    requests: _Quantities | None = None
    limits: _Quantities | None = None


class _Container(Document):
    name: Name | None = None
    restart_policy: str | None = Field(default=None, alias="restartPolicy")
    resources: _Resources | None = None


_Containers = Annotated[list[_Container], Field(max_length=MAX_ITEMS)]


class _PodSpec(Document):
    init_containers: _Containers | None = Field(default=None, alias="initContainers")
    containers: _Containers | None = None
    overhead: _Quantities | None = None


class _PodMeta(Document):
    name: Name | None = None
    namespace: Name | None = None
    uid: Name | None = None


class _Pod(Document):
    metadata: _PodMeta | None = None
    spec: _PodSpec | None = None


class _NodeMeta(Document):
    name: Name


class _Node(Document):
    metadata: _NodeMeta


class _Nodes(Document):
    items: Annotated[list[_Node], Field(max_length=MAX_ITEMS)] | None = None


class _FilterBody(Document):
    pod: _Pod = Field(alias="Pod")
    node_names: Annotated[list[Name], Field(max_length=MAX_ITEMS)] | None = Field(
        default=None, alias="NodeNames")
    nodes: _Nodes | None = Field(default=None, alias="Nodes")


class _BindBody(Document):
    pod_name: Name = Field(alias="PodName")
    pod_namespace: Name = Field(alias="PodNamespace")
    pod_uid: Name = Field(alias="PodUID")
    node: Name = Field(alias="Node")


def filter_args(value: Any) -> ExtenderArgs:
    """ExtenderArgs ``{Pod, Nodes: {items: [{metadata: {name}}]} | NodeNames: [str]}``
    for /filter and /prioritize."""
    body = read_value(_FilterBody, _object(value), "", _bad)
    items: list[Any] = []
    if body.nodes is not None and body.nodes.items:
        items = value["Nodes"]["items"]
        for i, node in enumerate(items):
            if _deeper_than(node, MAX_DEPTH):
                raise _bad(f"Nodes.items[{i}]: nested deeper than {MAX_DEPTH} levels")
    out: ExtenderArgs = {"Pod": value["Pod"], "Nodes": {"items": items}}
    if body.node_names is not None:  # an empty list still means "answer NodeNames"
        out["NodeNames"] = body.node_names
    return out


def bind_args(value: Any) -> ExtenderBindingArgs:
    """ExtenderBindingArgs ``{PodName, PodNamespace, PodUID, Node}`` (all strings)."""
    body = read_value(_BindBody, _object(value), "", _bad)
    return {"PodName": body.pod_name, "PodNamespace": body.pod_namespace,
            "PodUID": body.pod_uid, "Node": body.node}


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        kind = "null" if value is None else type(value).__name__
        raise _bad(f"body: must be an object, got {kind}")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests deeper than ``limit``; iterative."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict | list):
            if depth > limit:
                return True
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False
