"""L1: signed annotations (decision, assignment) against hostile input: any text a tenant
writes is a typed error, never an exception out of verification."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_share.sharing.annotations import (
    AnnotationError,
    ContainerAssignment,
    PodAssignment,
    verify_assignment,
)
from gpu_share.sharing.decision import (
    ContainerDecision,
    Decision,
    DecisionError,
    sig_matches,
    sign,
    verify,
    verify_binding,
)
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRequest,
    ContainerView,
    DeviceShare,
    PodView,
)

KEY = b"signing-test-key-0123456789abcdef"
POD = PodView(
    "u1", "ns", "p", "n1", (ContainerView("c", ContainerKind.APP, ContainerRequest(4, 30)),)
)
DEC = Decision("u1", "n1", {"c": ContainerDecision(("GPU-0",), ContainerRequest(4, 30))}, 100)
ASG = PodAssignment({"c": ContainerAssignment((DeviceShare("GPU-0", 4, 30),), "node-agent")})


def test_deep_nesting_is_malformed_not_recursion_error() -> None:
    deep = "[" * 200_000
    with pytest.raises(DecisionError) as e:
        verify(deep, KEY, POD, 100.0)
    assert e.value.reason == "MalformedDecision" and len(str(e.value)) < 200
    with pytest.raises(DecisionError):
        verify_binding(deep, KEY, "u1", "n1")
    with pytest.raises(AnnotationError):
        verify_assignment(deep, KEY, "u1", "n1")
    nested_sig = json.dumps({"version": "v1", "payload": {}, "sig": "x"})[:-1]
    with pytest.raises(DecisionError):
        verify_binding(nested_sig + "," + '"x":' + "[" * 200_000, KEY, "u1", "n1")


@pytest.mark.parametrize("sig", ["é" * 64, "\ud800", "", "0" * 64, 5, None, ["a"]])
def test_any_signature_value_is_a_typed_rejection(sig: object) -> None:
    d = json.loads(sign(DEC, KEY))
    d["sig"] = sig
    with pytest.raises(DecisionError):
        verify_binding(json.dumps(d), KEY, "u1", "n1")
    a = json.loads(ASG.encode(KEY, pod_uid="u1", node="n1"))
    a["sig"] = sig
    with pytest.raises(AnnotationError) as e:
        verify_assignment(json.dumps(a), KEY, "u1", "n1")
    assert e.value.reason in ("BadSignature", "InvalidAnnotation")
    assert sig_matches("ab", sig) is False


def test_verify_binding_checks_uid_and_node_not_age() -> None:
    text = sign(DEC, KEY)
    assert verify_binding(text, KEY, "u1", "n1") == DEC  # issuedAt 100: old is fine here
    for uid, node, reason in [("u2", "n1", "UidMismatch"), ("", "n1", "UidMismatch"),
                              ("u1", "n2", "NodeMismatch")]:
        with pytest.raises(DecisionError) as e:
            verify_binding(text, KEY, uid, node)
        assert e.value.reason == reason
    with pytest.raises(DecisionError) as e:
        verify_binding(text, b"", "u1", "n1")
    assert e.value.reason == "BadSignature"


def test_signing_an_assignment_needs_uid_and_node() -> None:
    with pytest.raises(ValueError):
        ASG.encode(KEY, pod_uid="", node="n1")
    with pytest.raises(ValueError):
        ASG.encode(KEY, pod_uid="u1", node="")


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_escapes_as_another_exception(text: str) -> None:
    with pytest.raises(DecisionError):
        verify_binding(text, KEY, "u1", "n1")
    with pytest.raises(AnnotationError):
        verify_assignment(text, KEY, "u1", "n1")
