from __future__ import annotations

import json

import pytest

from gpu_share.sharing.decision import (
    ContainerDecision,
    Decision,
    DecisionError,
    decode_unverified,
    sign,
    verify,
)
from gpu_share.sharing.model import ContainerKind, ContainerRequest, ContainerView, PodView

KEY = b"k" * 32
NOW = 1_700_000_000


def pod(uid: str = "u1", mem: int = 4, cores: int = 30) -> PodView:
    return PodView(
        uid,
        "ns",
        "p",
        "n1",
        (
            ContainerView("main", ContainerKind.APP, ContainerRequest(mem, cores)),
            ContainerView("side", ContainerKind.APP, ContainerRequest()),
        ),
    )


def decision(at: int = NOW) -> Decision:
    return Decision(
        "u1", "n1", {"main": ContainerDecision(("GPU-a",), ContainerRequest(4, 30))}, at
    )


def test_round_trip() -> None:
    d = verify(sign(decision(), KEY), KEY, pod(), NOW + 5, node="n1")
    assert d == decision() and d.devices_of("main") == ("GPU-a",)
    assert decode_unverified(sign(decision(), KEY)) == decision()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: p.__setitem__("node", "n2"),
        lambda p: p["containers"]["main"].__setitem__("devices", ["GPU-b"]),
        lambda p: p["containers"]["main"]["request"].__setitem__("cores", 31),
        lambda p: p.__setitem__("issuedAt", NOW + 1),
    ],
)
def test_tampering_is_rejected(mutate: object) -> None:
    raw = json.loads(sign(decision(), KEY))
    mutate(raw["payload"])  # type: ignore[operator]
    with pytest.raises(DecisionError) as e:
        verify(json.dumps(raw), KEY, pod(), NOW)
    assert e.value.reason == "BadSignature"


def test_wrong_key_is_rejected() -> None:
    with pytest.raises(DecisionError, match="signature"):
        verify(sign(decision(), KEY), b"other", pod(), NOW)


@pytest.mark.parametrize(
    ("p", "reason"),
    [
        (pod(uid="u2"), "UidMismatch"),
        (pod(mem=5), "RequestMismatch"),
        (pod(cores=0, mem=0), "RequestMismatch"),
    ],
)
def test_pod_mismatch_is_rejected(p: PodView, reason: str) -> None:
    with pytest.raises(DecisionError) as e:
        verify(sign(decision(), KEY), KEY, p, NOW)
    assert e.value.reason == reason


def test_node_mismatch_and_expiry() -> None:
    text = sign(decision(), KEY)
    with pytest.raises(DecisionError) as e:
        verify(text, KEY, pod(), NOW, node="n9")
    assert e.value.reason == "NodeMismatch"
    for now in (NOW + 10_000, NOW - 3600):
        with pytest.raises(DecisionError) as e:
            verify(text, KEY, pod(), now)
        assert e.value.reason == "DecisionExpired"


@pytest.mark.parametrize(
    "text", ["", "[]", '{"version":"v0"}', '{"version":"v1","payload":{},"sig":1}']
)
def test_malformed(text: str) -> None:
    with pytest.raises(DecisionError) as e:
        verify(text, KEY, pod(), NOW)
    assert e.value.reason == "MalformedDecision"
