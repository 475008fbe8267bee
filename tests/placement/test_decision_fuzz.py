"""Decision verification never raises anything but DecisionError.

The decision annotation is tenant-writable until the admission policy is in place, and the
agent verifies it inside Allocate: a TypeError there was an INTERNAL for that pod.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_share.sharing.decision import (
    ContainerDecision,
    Decision,
    DecisionError,
    _canonical,
    _mac,
    decode_unverified,
    sign,
    verify,
)
from gpu_share.sharing.model import ContainerKind, ContainerRequest, ContainerView, PodView

KEY = b"k" * 32
NOW = 1_700_000_000
POD = PodView(
    "u1", "ns", "p", "n1", (ContainerView("main", ContainerKind.APP, ContainerRequest(4, 30)),)
)
FUZZ = settings(max_examples=200, deadline=None)


def good_payload() -> dict[str, Any]:
    d = Decision("u1", "n1", {"main": ContainerDecision(("GPU-a",), ContainerRequest(4, 30))}, NOW)
    return json.loads(sign(d, KEY))["payload"]  # type: ignore[no-any-return]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _assert_bad_signature(sig: str) -> None:
    text = json.dumps({"version": "v1", "payload": good_payload(), "sig": sig})
    with pytest.raises(DecisionError) as e:
        verify(text, KEY, POD, NOW)
    assert e.value.reason == "BadSignature"


def test_non_ascii_signature_is_a_bad_signature() -> None:
    # Before: hmac.compare_digest raised TypeError on a non-ASCII str.
    _assert_bad_signature("é" * 64)


@FUZZ
@given(sig=st.text(max_size=80))
def test_any_text_signature_is_a_bad_signature(sig: str) -> None:
    _assert_bad_signature(sig)


@FUZZ
@given(text=st.text(max_size=200))
def test_any_text_is_rejected_typed(text: str) -> None:
    with pytest.raises(DecisionError):
        verify(text, KEY, POD, NOW)
    with pytest.raises(DecisionError):
        decode_unverified(text)


@FUZZ
@given(payload=json_values, sig=json_values)
def test_any_json_shape_is_rejected_typed(payload: Any, sig: Any) -> None:
    text = json.dumps({"version": "v1", "payload": payload, "sig": sig})
    with pytest.raises(DecisionError):
        verify(text, KEY, POD, NOW)


@FUZZ
@given(field=st.sampled_from(["podUID", "node", "issuedAt", "containers"]), value=json_values)
def test_signed_malformed_payload_is_rejected_typed(field: str, value: Any) -> None:
    # Even a correctly signed payload (a key holder's bug) must not raise TypeError,
    # OverflowError (issuedAt 10**400) or KeyError.
    payload = good_payload()
    payload[field] = value
    text = json.dumps({"version": "v1", "payload": payload, "sig": _mac(_canonical(payload), KEY)})
    with contextlib.suppress(DecisionError):
        verify(text, KEY, POD, NOW)


def test_huge_issued_at_is_malformed_not_overflow() -> None:
    payload = good_payload()
    payload["issuedAt"] = 10**400
    text = json.dumps({"version": "v1", "payload": payload, "sig": _mac(_canonical(payload), KEY)})
    with pytest.raises(DecisionError) as e:
        verify(text, KEY, POD, NOW)
    assert e.value.reason == "MalformedDecision"


def test_deeply_nested_decision_is_malformed() -> None:
    with pytest.raises(DecisionError) as e:
        verify('{"version": "v1", "payload": ' + "[" * 100_000, KEY, POD, NOW)
    assert e.value.reason == "MalformedDecision"
