"""The JSON bodies the extender reads and answers (Go field names of
k8s.io/kube-scheduler/extender/v1). ``validate`` builds the argument types from a
request body; ``core`` answers with the result types. Pod and Node objects stay
JSON-shaped mappings: only the fields ``validate`` checks are relied on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict


class NodeList(TypedDict):
    items: list[Mapping[str, Any]]  # v1.Node objects; metadata.name is a checked string


class ExtenderArgs(TypedDict):
    """Body of /filter and /prioritize."""

    Pod: Mapping[str, Any]
    Nodes: NodeList  # empty when the body has none (nodeCacheCapable)
    NodeNames: NotRequired[list[str]]  # present only when the body names nodes


class ExtenderFilterResult(TypedDict):
    Nodes: NotRequired[NodeList]  # answered in the form the args came in
    NodeNames: NotRequired[list[str] | None]
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class HostPriority(TypedDict):
    Host: str
    Score: int


class ExtenderBindingArgs(TypedDict):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(TypedDict):
    Error: str
