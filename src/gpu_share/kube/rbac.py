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
    # Device cordons on this node (kube/cordon.py: a watch narrowed to the node).
    ("", "nodes", ("list", "watch")),
    # Events on pods (allocation failures) and on the node (degraded mode, health).
    ("", "events", ("create", "patch")),
    # The claims the kubelet asks the DRA driver to prepare, and in device-plugin mode
    # those a DRA pool left prepared on the node (read only; never their status).
    ("resource.k8s.io", "resourceclaims", ("get",)),
)

# Added when a node pool runs in DRA mode. RBAC cannot name the node: the chart's
# own-node admission policy confines slice writes to the agent's node.
DRA_AGENT_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # The node's ResourceSlice (kube/resourceslices.py).
    ("resource.k8s.io", "resourceslices", ("get", "list", "watch", "create", "update", "delete")),
)


def merged_rules(*, dra: bool = False) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, merged over AGENT_RULES (and DRA_AGENT_RULES)."""
    out: dict[tuple[str, str], set[str]] = {}
    for group, resource, verbs in AGENT_RULES + (DRA_AGENT_RULES if dra else ()):
        out.setdefault((group, resource), set()).update(verbs)
    return out
