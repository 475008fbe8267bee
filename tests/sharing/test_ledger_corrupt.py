"""The ledger loader: anything but what ``to_json`` wrote raises ``LedgerError`` and
nothing else; what cannot be true on this node is reported."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_share.errors import LedgerError
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import (
    ContainerKind,
    ContainerRef,
    ContainerRequest,
    DeviceShare,
    ResourceKind,
)
from gpu_share.sharing.node.ledger import (
    DUPLICATE_UNIT,
    MALFORMED,
    UNKNOWN_DEVICE,
    EntrySource,
    Ledger,
    LedgerEntry,
)
from tests.sharing.helpers import UNIT_MIB, devices

MEM = ResourceKind.MEMORY


def _entry(
    pod: str = "p",
    container: str = "c",
    ids: tuple[str, ...] = ("GPU-0::mem::0",),
    device: str = "GPU-0",
    kind: ContainerKind = ContainerKind.APP,
    order: int = 0,
) -> LedgerEntry:
    return LedgerEntry(
        ref=ContainerRef("ns", pod, container, f"uid-{pod}"),
        request=ContainerRequest(len(ids) or 1, 0),
        shares=(DeviceShare(device, len(ids) or 1, 0),),
        source=EntrySource.NODE_AGENT,
        created_at=1.0,
        updated_at=1.0,
        container_kind=kind,
        order=order,
        memory_ids=ids,
    )


def _good() -> dict[str, Any]:
    led = Ledger()
    led.put(_entry("a", ids=("GPU-0::mem::0", "GPU-0::mem::1")))
    led.put(_entry("b", ids=("GPU-1::mem::0",), device="GPU-1"))
    led.absent_since[("ns", "a")] = 3.0
    raw: dict[str, Any] = json.loads(led.to_json())
    return raw


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    target: Any = doc
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return doc


BAD_TEXTS = {
    "seq-inf": '{"version": "v1", "seq": 1e999}',
    "seq-nan": '{"version": "v1", "seq": NaN}',
    "seq-5000-digits": '{"version": "v1", "seq": ' + "9" * 5000 + "}",
    "deep-array": "[" * 100_000 + "]" * 100_000,
    "deep-object": '{"a":' * 100_000 + "1" + "}" * 100_000,
    "entries-number": '{"version": "v1", "entries": 5}',
    "entries-string": '{"version": "v1", "entries": "abc"}',
    "entry-list": '{"version": "v1", "entries": [[1, 2]]}',
    "absent-number": '{"version": "v1", "absentSince": [5]}',
    "absent-null": '{"version": "v1", "absentSince": null}',
    "truncated": json.dumps(_good())[:-7],
    "empty": "",
    "nul-bytes": "\x00\x00\x00",
}


@pytest.mark.parametrize("text", BAD_TEXTS.values(), ids=BAD_TEXTS.keys())
def test_unreadable_text_raises_ledger_error_only(text: str) -> None:
    """Old code: seq-inf raised OverflowError, deep-* RecursionError, the others
    TypeError/AttributeError wrapped or not."""
    with pytest.raises(LedgerError) as err:
        Ledger.from_json(text)
    assert err.value.reason == MALFORMED
    assert len(str(err.value)) < 400


BAD_FIELDS: dict[str, tuple[tuple[Any, ...], Any]] = {
    "seq-true": (("seq",), True),
    "seq-float": (("seq",), 2.5),
    "seq-negative": (("seq",), -1),
    "ns-number": (("entries", 0, "namespace"), 7),
    "ns-huge": (("entries", 0, "namespace"), "n" * 100_000),
    "request-cores-inf": (("entries", 0, "request", "cores"), 1e308 * 10),
    "request-cores-str": (("entries", 0, "request", "cores"), "5"),
    "request-cores-huge": (("entries", 0, "request", "cores"), 10**30),
    "shares-dict": (("entries", 0, "shares"), {"device": "GPU-0"}),
    "share-exclusive-str": (("entries", 0, "shares", 0, "exclusive"), "false"),
    "share-device-bad": (("entries", 0, "shares", 0, "device"), "GPU-0::mem::0"),
    "source-unknown": (("entries", 0, "source"), "martian"),
    "kind-number": (("entries", 0, "containerKind"), 1),
    "created-nan-string": (("entries", 0, "createdAt"), "nan"),
    "created-huge": (("entries", 0, "createdAt"), 1e300),
    "order-below": (("entries", 0, "order"), -2),
    "ids-number": (("entries", 0, "memoryIds"), 5),
    "ids-of-numbers": (("entries", 0, "memoryIds"), [1, 2]),
    "ids-wrong-kind": (("entries", 0, "memoryIds"), ["GPU-0::core::0"]),
    "ids-arabic-digit": (("entries", 0, "memoryIds"), ["GPU-0::mem::\u0663"]),
    "ids-5000-digits": (("entries", 0, "memoryIds"), ["GPU-0::mem::" + "1" * 5000]),
    "offered-bad": (("entries", 0, "offeredMemoryIds"), ["x"]),
    "absent-since-inf": (("absentSince", 0, "since"), float("inf")),
    "absent-since-missing": (("absentSince", 0), {"namespace": "ns", "podName": "a"}),
}


@pytest.mark.parametrize("field", BAD_FIELDS.values(), ids=BAD_FIELDS.keys())
def test_wrong_types_anywhere_raise_ledger_error(field: tuple[tuple[Any, ...], Any]) -> None:
    path, value = field
    text = json.dumps(_set(_good(), path, value))
    with pytest.raises(LedgerError) as err:
        Ledger.from_json(text)
    assert err.value.reason == MALFORMED
    assert len(str(err.value)) < 400


def test_one_entry_listing_a_unit_twice_or_a_container_twice() -> None:
    doc = _set(_good(), ("entries", 0, "memoryIds"), ["GPU-0::mem::0", "GPU-0::mem::0"])
    with pytest.raises(LedgerError) as err:
        Ledger.from_json(json.dumps(doc))
    assert err.value.reason == DUPLICATE_UNIT
    doc = _good()
    doc["entries"].append(dict(doc["entries"][0]))
    with pytest.raises(LedgerError, match="listed twice"):
        Ledger.from_json(json.dumps(doc))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=20,
)
_PATHS = st.sampled_from(
    [
        ("seq",), ("entries",), ("entries", 0), ("entries", 0, "request"),
        ("entries", 0, "shares"), ("entries", 0, "shares", 0), ("entries", 0, "memoryIds"),
        ("entries", 0, "shares", 0, "memoryUnits"), ("entries", 0, "podUid"),
        ("entries", 1, "coreIds"), ("entries", 0, "updatedAt"), ("absentSince",),
        ("absentSince", 0), ("absentSince", 0, "podName"), ("entries", 0, "order"),
    ]
)


@given(_PATHS, _JSON)
@settings(max_examples=200, deadline=None)
def test_any_value_anywhere_loads_or_raises_ledger_error(path: tuple[Any, ...], v: Any) -> None:
    text = json.dumps(_set(_good(), path, v))
    try:
        Ledger.from_json(text)
    except LedgerError as e:
        assert len(str(e)) < 400


@given(st.binary(max_size=200))
@settings(max_examples=200, deadline=None)
def test_random_text_raises_ledger_error(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    with pytest.raises(LedgerError):
        Ledger.from_json(text)


def test_round_trip_still_loads() -> None:
    text = json.dumps(_good())
    assert Ledger.from_json(text).to_json() == Ledger.from_json(Ledger.from_json(text).to_json(
    )).to_json()


# ---------------------------------------------------------------- anomalies
def _inv() -> Inventory:
    return Inventory.from_devices(devices(2, units=8), UNIT_MIB)


def test_consistent_ledger_and_init_reuse_have_no_anomaly() -> None:
    led = Ledger()
    led.put(_entry("a", "init", ids=("GPU-0::mem::0",), kind=ContainerKind.INIT, order=0))
    led.put(_entry("a", "main", ids=("GPU-0::mem::0", "GPU-0::mem::1"), order=1))
    led.put(_entry("b", ids=("GPU-1::mem::0",), device="GPU-1"))
    assert led.anomalies(_inv()) == []


def test_unit_held_by_two_pods_is_reported() -> None:
    led = Ledger()
    led.put(_entry("a", ids=("GPU-0::mem::3",)))
    led.put(_entry("b", ids=("GPU-0::mem::3",)))
    found = led.anomalies(_inv())
    assert [a.reason for a in found] == [DUPLICATE_UNIT]
    assert "GPU-0::mem::3" in found[0].message
    # Kept, and the unit counts once: nothing can be over-committed.
    assert led.usage(_inv())["GPU-0"].memory_used == 1


def test_unit_held_by_two_app_containers_of_one_pod_is_reported() -> None:
    led = Ledger()
    led.put(_entry("a", "one", ids=("GPU-0::mem::3",)))
    led.put(_entry("a", "two", ids=("GPU-0::mem::3",), order=1))
    assert [a.reason for a in led.anomalies(_inv())] == [DUPLICATE_UNIT]


def test_entries_on_unknown_devices_or_units_are_reported() -> None:
    led = Ledger()
    led.put(_entry("a", ids=("GPU-7::mem::0",), device="GPU-7"))
    led.put(_entry("b", ids=("GPU-0::mem::99",)))
    led.put(_entry("c", ids=(), device="GPU-9"))  # decided, no Allocate yet
    found = led.anomalies(_inv())
    assert [a.reason for a in found] == [UNKNOWN_DEVICE] * 4
    text = " ".join(a.message for a in found)
    assert "GPU-7" in text and "GPU-0::mem::99" in text and "GPU-9" in text
    usage = led.usage(_inv())
    assert usage["GPU-0"].memory_used == 1 and usage["GPU-1"].memory_used == 0
