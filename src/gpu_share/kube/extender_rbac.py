"""API permissions of the scheduler extender (a list separate from AGENT_RULES).

Each rule: (apiGroup, resource, verbs). The chart's extender ClusterRole mirrors it.
"""

from __future__ import annotations

EXTENDER_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # Inventory annotations of nodes.
    ("", "nodes", ("get", "list", "watch")),
    # Requests, assignment and decision annotations of pods; bind reads a missed pod.
    ("", "pods", ("get", "list", "watch")),
    # The decision annotation, written before binding.
    ("", "pods", ("patch",)),
    # The binding itself: POST /api/v1/namespaces/{ns}/bindings is authorized as
    # resource "bindings", not "pods/binding" (L3-tested).
    ("", "bindings", ("create",)),
    # A DRA pod's claims, read at bind for the devices the scheduler allocated.
    ("resource.k8s.io", "resourceclaims", ("get",)),
)
