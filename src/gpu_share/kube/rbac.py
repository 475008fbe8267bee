"""The one list of API permissions the node agent uses.

The chart's ClusterRole is tested against this list (tests/chart): change both together.
Each rule: (apiGroup, resource, verbs).
"""

from __future__ import annotations

AGENT_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # Pod specs (container requests) of pods on this node; reconciliation lists them.
    ("", "pods", ("get", "list", "watch")),
    # The assignment annotation on pods of this node.
    ("", "pods", ("patch",)),
    # The inventory annotation on this node.
    ("", "nodes", ("get", "patch")),
    # Events on pods (allocation failures) and on the node (degraded mode, health).
    ("", "events", ("create", "patch")),
)


def merged_rules() -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, merged over AGENT_RULES."""
    out: dict[tuple[str, str], set[str]] = {}
    for group, resource, verbs in AGENT_RULES:
        out.setdefault((group, resource), set()).update(verbs)
    return out
