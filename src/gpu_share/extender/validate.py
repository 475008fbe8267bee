"""Checks the extender's request bodies before any logic sees them.

Every route answers 400 with a short reason when its body is not what kube-scheduler
sends: not UTF-8, not JSON (``NaN``/``Infinity`` included), nested too deeply, or a field
of the wrong type at any level core.py reads. After ``filter_args``/``bind_args`` the
core reads typed ``extender.api`` values. Reasons never echo more than
``REASON_LIMIT`` characters of the input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NoReturn

from gpu_share.errors import InputError
from gpu_share.extender.api import ExtenderArgs, ExtenderBindingArgs
from gpu_share.observability import jsonbody
from gpu_share.observability.http import REASON_LIMIT, short_repr
from gpu_share.sharing.quantity import QuantityError, parse_quantity

MAX_NAME = 253  # a DNS subdomain: node names, namespaces, pod names, UIDs
MAX_DEPTH = 64  # JSON nesting; a pod object is about 10 deep


class BadRequest(InputError):
    """The request body is malformed; ``str(e)`` is the short reason answered with 400."""


def _bad(where: str, what: str) -> NoReturn:
    raise BadRequest(f"{where}: {what}"[: REASON_LIMIT * 2])


def parse_json(body: bytes) -> Any:
    """Strict JSON from a request body (observability.jsonbody), or ``BadRequest``."""
    try:
        return jsonbody.parse_json(body, MAX_DEPTH)
    except jsonbody.BadJson as e:
        raise BadRequest(str(e)) from None


def _obj(value: Any, where: str, *, optional: bool = True) -> Mapping[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        _bad(where, f"must be an object, got {_kind(value)}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        _bad(where, f"must be a list, got {_kind(value)}")
    return value


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str):
        _bad(where, f"must be a string, got {_kind(value)}")
    if len(value) > MAX_NAME:
        _bad(where, f"longer than {MAX_NAME} characters: {short_repr(value, 40)}")
    return value


def _opt_name(value: Any, where: str) -> None:
    if value is not None:
        _name(value, where)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _quantity(value: Any, where: str) -> None:
    if isinstance(value, bool):
        _bad(where, "must be a quantity, got bool")
    if isinstance(value, int):
        if abs(value) >= 2**63:
            _bad(where, "quantity out of range")
        return
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) >= 2.0**63:
            _bad(where, "quantity out of range")
        return
    if not isinstance(value, str):
        _bad(where, f"must be a quantity string, got {_kind(value)}")
    try:  # the one quantity grammar (bounded length and exponent), read once here
        parse_quantity(value)
    except QuantityError:
        _bad(where, f"not a quantity: {short_repr(value, 40)}")


def _quantities(value: Any, where: str) -> None:
    for k, v in _obj(value, where).items():
        _quantity(v, f"{where}[{short_repr(k, 60)}]")


def _container(value: Any, where: str) -> None:
    c = _obj(value, where, optional=False)
    _opt_name(c.get("name"), f"{where}.name")
    restart = c.get("restartPolicy")
    if restart is not None and not isinstance(restart, str):
        _bad(f"{where}.restartPolicy", f"must be a string, got {_kind(restart)}")
    res = _obj(c.get("resources"), f"{where}.resources")
    _quantities(res.get("requests"), f"{where}.resources.requests")
    _quantities(res.get("limits"), f"{where}.resources.limits")


def _pod(value: Any) -> Mapping[str, Any]:
    pod = _obj(value, "Pod", optional=False)
    meta = _obj(pod.get("metadata"), "Pod.metadata")
    for field in ("name", "namespace", "uid"):
        _opt_name(meta.get(field), f"Pod.metadata.{field}")
    spec = _obj(pod.get("spec"), "Pod.spec")
    for field in ("initContainers", "containers"):
        for i, c in enumerate(_list(spec.get(field), f"Pod.spec.{field}")):
            _container(c, f"Pod.spec.{field}[{i}]")
    _quantities(spec.get("overhead"), "Pod.spec.overhead")
    return pod


def _node(value: Any, where: str) -> Mapping[str, Any]:
    node = _obj(value, where, optional=False)
    meta = _obj(node.get("metadata"), f"{where}.metadata", optional=False)
    _name(meta.get("name"), f"{where}.metadata.name")
    return node


def filter_args(value: Any) -> ExtenderArgs:
    """ExtenderArgs ``{Pod, Nodes: {items: [{metadata: {name}}]} | NodeNames: [str]}``
    for /filter and /prioritize."""
    args = _obj(value, "body", optional=False)
    pod = _pod(args.get("Pod"))
    names = [
        _name(n, f"NodeNames[{i}]") for i, n in enumerate(_list(args.get("NodeNames"), "NodeNames"))
    ]
    nodes = _obj(args.get("Nodes"), "Nodes")
    raw_items = _list(nodes.get("items"), "Nodes.items")
    items = [_node(x, f"Nodes.items[{i}]") for i, x in enumerate(raw_items)]
    out: ExtenderArgs = {"Pod": pod, "Nodes": {"items": items}}
    if args.get("NodeNames") is not None:  # an empty list still means "answer NodeNames"
        out["NodeNames"] = names
    return out


def bind_args(value: Any) -> ExtenderBindingArgs:
    """ExtenderBindingArgs ``{PodName, PodNamespace, PodUID, Node}`` (all strings)."""
    args = _obj(value, "body", optional=False)
    return {
        "PodName": _name(args.get("PodName"), "PodName"),
        "PodNamespace": _name(args.get("PodNamespace"), "PodNamespace"),
        "PodUID": _name(args.get("PodUID"), "PodUID"),
        "Node": _name(args.get("Node"), "Node"),
    }
