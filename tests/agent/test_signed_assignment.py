"""L2: the agent signs its assignment annotations with the extender's key, bound to the
pod's UID and this node, so the extender's view can tell them from a tenant's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpu_share.sharing.annotations import AnnotationError, PodAssignment, verify_assignment
from tests.agent.served_agent import pod_view, rig_with

KEY = b"agent-signing-key-0123456789abcdef"
ASSIGNMENT = "gpu-share.vendor.com/assignment"


def _key_file(d: Path) -> dict[str, str]:
    (d / "key").write_bytes(KEY + b"\n")
    return {"decisionKeyFile": str(d / "key")}


def test_assignment_is_signed_for_the_pod_uid_and_node() -> None:
    with rig_with({"placement": _key_file}) as rig:
        rig.admit(pod_view("a", ("main", 2, 20), uid="uid-a"), random.Random(1))
        assert rig.agent is not None and rig.agent.flush(5)
        text = rig.publisher.pods[("default", "a")][ASSIGNMENT]
        assert text is not None
        doc = verify_assignment(text, KEY, "uid-a", "node-a")
        assert set(doc.containers) == {"main"}
        with pytest.raises(AnnotationError):
            verify_assignment(text, KEY, "uid-other", "node-a")


def test_without_a_key_the_assignment_is_unsigned() -> None:
    with rig_with({}) as rig:
        rig.admit(pod_view("a", ("main", 2, 20), uid="uid-a"), random.Random(1))
        assert rig.agent is not None and rig.agent.flush(5)
        text = rig.publisher.pods[("default", "a")][ASSIGNMENT]
        assert text is not None and "sig" not in text
        assert set(PodAssignment.decode(text).containers) == {"main"}
