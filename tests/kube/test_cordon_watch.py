"""The agent's watch of its own node (kube/cordon.py): only the node's cordon
annotations are handed on, and only when they changed; a failed hand-on is retried."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest

from gpu_share.kube.cordon import NodeCordonWatch
from gpu_share.kube.rest import RestClient

PREFIX = "gpu-share.vendor.com/cordon."


def _node(name: str, **ann: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": ann}}


def _watch(seen: list[Mapping[str, str]]) -> NodeCordonWatch:
    # The API client is only used by the list/watch calls, which these tests do not make.
    return NodeCordonWatch(cast(RestClient, object()), "n1", PREFIX, seen.append)


def test_hands_on_cordons_of_its_node_only_when_they_change() -> None:
    seen: list[Mapping[str, str]] = []
    w = _watch(seen)
    key = PREFIX + "GPU-0"
    w._listed([_node("n1", **{key: "v1", "gpu-share.vendor.com/inventory": "{}"})])
    w._event("MODIFIED", _node("n1", **{key: "v1", "other": "x"}))  # status churn: nothing
    w._event("MODIFIED", _node("n2", **{key: "v9"}))  # another node: ignored
    w._event("MODIFIED", _node("n1", **{key: "v2"}))
    w._event("DELETED", _node("n1", **{key: "v2"}))
    w._listed([])  # node gone: still nothing
    assert seen == [{key: "v1"}, {key: "v2"}, {}]


def test_a_failed_hand_on_is_tried_again() -> None:
    calls: list[Mapping[str, str]] = []

    def flaky(ann: Mapping[str, str]) -> None:
        calls.append(ann)
        if len(calls) == 1:
            raise RuntimeError("boom")

    w = NodeCordonWatch(cast(RestClient, object()), "n1", PREFIX, flaky)
    with pytest.raises(RuntimeError):
        w._listed([_node("n1", **{PREFIX + "GPU-0": "v"})])
    w._listed([_node("n1", **{PREFIX + "GPU-0": "v"})])  # the relist after the failure
    assert len(calls) == 2
