"""A tiny RFC 6902 applier (add, remove, replace: what the webhook writes) for the tests
and benches: strict, so a patch the API
server would refuse (a missing parent, removing what is not there) raises here too."""

from __future__ import annotations

import copy
from typing import Any


class PatchError(Exception):
    pass


def _tokens(pointer: str) -> list[str]:
    if not pointer.startswith("/"):
        raise PatchError(f"pointer {pointer!r} does not start with /")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _index(parent: list[Any], token: str, *, append_ok: bool) -> int:
    if token == "-" and append_ok:
        return len(parent)
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise PatchError(f"bad array index {token!r}")
    i = int(token)
    if i > len(parent) or (i == len(parent) and not append_ok):
        raise PatchError(f"index {i} out of range")
    return i


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for t in tokens[:-1]:
        if isinstance(node, dict):
            if t not in node:
                raise PatchError(f"no member {t!r}")
            node = node[t]
        elif isinstance(node, list):
            node = node[_index(node, t, append_ok=False)]
        else:
            raise PatchError(f"cannot descend into {type(node).__name__}")
    return node


def apply_patch(doc: Any, ops: Any) -> Any:
    """``doc`` with ``ops`` applied (a copy); raises PatchError."""
    out = copy.deepcopy(doc)
    for op in ops:
        tokens = _tokens(op["path"])
        parent = _parent(out, tokens)
        last = tokens[-1]
        if op["op"] == "add":
            if isinstance(parent, dict):
                parent[last] = copy.deepcopy(op["value"])
            elif isinstance(parent, list):
                parent.insert(_index(parent, last, append_ok=True), copy.deepcopy(op["value"]))
            else:
                raise PatchError("add into a scalar")
        elif op["op"] == "remove":
            if isinstance(parent, dict):
                if last not in parent:
                    raise PatchError(f"remove of missing member {last!r}")
                del parent[last]
            elif isinstance(parent, list):
                del parent[_index(parent, last, append_ok=False)]
            else:
                raise PatchError("remove from a scalar")
        elif op["op"] == "replace":  # RFC 6902: the member must exist
            if not isinstance(parent, dict) or last not in parent:
                raise PatchError(f"replace of missing member {last!r}")
            parent[last] = copy.deepcopy(op["value"])
        else:
            raise PatchError(f"unsupported op {op['op']!r}")
    return out
