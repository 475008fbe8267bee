"""Unit ids: only the exact ASCII form the agent advertises is accepted."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_share.errors import AllocationError, LedgerError
from gpu_share.sharing.ids import (
    MAX_ID_LEN,
    MAX_INDEX_DIGITS,
    MAX_UUID_LEN,
    UnitId,
    parse_unit_id,
    unit_id,
)
from gpu_share.sharing.model import ResourceKind
from gpu_share.sharing.node.engine import CallContext
from gpu_share.sharing.node.ledger import MALFORMED, Ledger
from tests.sharing.helpers import engine

MEM, CORE = ResourceKind.MEMORY, ResourceKind.CORE
# An error message quotes at most this much of the id it refuses.
MESSAGE_BOUND = 200

HOSTILE = [
    "GPU-0::mem::\u0663",  # ARABIC-INDIC DIGIT THREE
    "GPU-0::mem::\uff13",  # FULLWIDTH DIGIT THREE
    "GPU-0::mem::\u00b2",  # SUPERSCRIPT TWO (str.isdigit() is True, int() fails)
    "GPU-0::mem::1\u0663",
    "GPU-0::core::\u0967",  # DEVANAGARI DIGIT ONE
    "GPU-0::mem::" + "1" * 5000,  # int() refuses over 4300 digits
    "GPU-0::mem::" + "9" * (MAX_INDEX_DIGITS + 1),
    "GPU-0::mem::" + "x" * 1_000_000,  # 1 MB
    "G" * 1_000_000 + "::mem::0",
    "GPU-0::mem::3\n",  # a regex "$" would accept this
    "GPU-0::mem::3 ",
    " GPU-0::mem::3",
    "GPU-0::mem::+3",
    "GPU-0::mem::03",
    "GPU-0::MEM::3",
    "GPU-\u0660::mem::3",  # non-ASCII digit in the uuid
    "GPU-\u00e9::mem::3",
    "GPU-0\x00::mem::3",
    "GPU 0::mem::3",
    "GPU-0:mem::3",
    "GPU-0::mem::::3",
    "a" * (MAX_UUID_LEN + 1) + "::mem::3",
]


@pytest.mark.parametrize("bad", HOSTILE, ids=range(len(HOSTILE)))
def test_non_canonical_ids_are_refused_with_a_bounded_message(bad: str) -> None:
    with pytest.raises(AllocationError) as e:
        parse_unit_id(bad)
    assert e.value.reason == "UnknownDevice"
    assert len(str(e.value)) < MESSAGE_BOUND


_UUIDS = st.text(alphabet=string.ascii_letters + string.digits + "._/-", min_size=1,
                 max_size=MAX_UUID_LEN)
_INDEXES = st.integers(min_value=0, max_value=10**MAX_INDEX_DIGITS - 1)


@given(_UUIDS, st.sampled_from(list(ResourceKind)), _INDEXES)
@settings(max_examples=200, deadline=None)
def test_canonical_ids_round_trip(uuid: str, kind: ResourceKind, i: int) -> None:
    u = UnitId(uuid, kind, i)
    s = str(u)
    assert len(s) <= MAX_ID_LEN
    assert parse_unit_id(s) == u
    assert unit_id(uuid, kind, i) == s


@given(st.text(max_size=300))
@settings(max_examples=200, deadline=None)
def test_anything_accepted_is_its_own_canonical_form(s: str) -> None:
    try:
        u = parse_unit_id(s)
    except AllocationError as e:
        assert len(str(e)) < MESSAGE_BOUND
        return
    assert str(u) == s


_DIGITS = st.characters(categories=("Nd", "No")).filter(lambda c: c not in "0123456789")


@given(_UUIDS, st.sampled_from(["mem", "core"]), _INDEXES, st.integers(0, 9), _DIGITS)
@settings(max_examples=200, deadline=None)
def test_any_non_ascii_digit_in_the_index_is_refused(
    uuid: str, tag: str, i: int, pos: int, digit: str
) -> None:
    raw = str(i)
    pos = min(pos, len(raw))
    s = f"{uuid}::{tag}::{raw[:pos]}{digit}{raw[pos:]}"
    with pytest.raises(AllocationError):
        parse_unit_id(s)


@pytest.mark.parametrize("bad", ["GPU-0::mem::\u0663", "GPU-0::mem::\uff13", "GPU-0::mem::\u00b2"])
def test_engine_refuses_non_canonical_ids_as_invalid_argument(bad: str) -> None:
    """Old code: the first two were unit 3 (held three times), the third ValueError."""
    e = engine()
    ctx = CallContext(pr=None, pods=None, now=0.0)
    for call in (
        lambda: e.preferred(MEM, [bad, "GPU-0::mem::0"], [], 1, ctx),
        lambda: e.preferred(MEM, ["GPU-0::mem::3", "GPU-0::mem::0"], [bad], 1, ctx),
        lambda: e.allocate(MEM, [bad], ctx),
    ):
        with pytest.raises(AllocationError) as err:
            call()
        assert err.value.reason == "UnknownDevice"
    assert e.ledger.entries == []


def test_engine_caps_the_number_of_ids_per_call() -> None:
    e = engine()  # 3 devices x 8 memory units
    ctx = CallContext(pr=None, pods=None, now=0.0)
    many = [f"GPU-0::mem::{i}" for i in range(25)]
    with pytest.raises(AllocationError, match="names 25 memory ids; this node advertises 24"):
        e.preferred(MEM, many, [], 1, ctx)
    with pytest.raises(AllocationError, match="names 25 memory ids"):
        e.preferred(MEM, many[:2], many, 1, ctx)
    with pytest.raises(AllocationError, match="names 25 memory ids") as err:
        e.allocate(MEM, many, ctx)
    assert err.value.reason == "InvalidRequest"


def _ledger_with(mem_ids: list[str]) -> str:
    return json.dumps(
        {
            "version": "v1",
            "seq": 0,
            "entries": [
                {
                    "namespace": "ns", "podName": f"p{i}", "containerName": "c",
                    "podUid": f"u{i}", "containerKind": "app", "order": 0,
                    "request": {"memoryUnits": 1, "cores": 0},
                    "shares": [{"device": "GPU-0", "memoryUnits": 1, "cores": 0,
                                "exclusive": False}],
                    "memoryIds": [m], "coreIds": [], "source": "node-agent",
                    "createdAt": 1.0, "updatedAt": 1.0,
                }
                for i, m in enumerate(mem_ids)
            ],
        }
    )


def test_ledger_loader_applies_the_same_canonical_check() -> None:
    """The issue's repro: three entries holding unit 3 under three spellings."""
    text = _ledger_with(["GPU-0::mem::3", "GPU-0::mem::\u0663", "GPU-0::mem::\uff13"])
    with pytest.raises(LedgerError) as err:
        Ledger.from_json(text)
    assert err.value.reason == MALFORMED
    assert Ledger.from_json(_ledger_with(["GPU-0::mem::3"])).entries
