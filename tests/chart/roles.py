"""The chart's RBAC objects read back, for the tests that compare them with the code's
rules (kube.rbac)."""

from __future__ import annotations

from typing import Any

from tests.chart.conftest import by_kind


def agent_role(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The agents' ClusterRole (the one named ``*-agent``)."""
    (role,) = [r for r in by_kind(objs, "ClusterRole")
               if r["metadata"]["name"].endswith("-agent")]
    return role


def role_rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """The verbs of ``role`` per (apiGroup, resource); its rules name nothing else."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames etc.
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                out.setdefault((group, res), set()).update(rule["verbs"])
    return out
