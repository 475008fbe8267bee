"""The ledger records the memory unit size its ids are cut in (docs/allocation.md, "Unit
size changes"): the agent keeps that size while slices of it run."""

from __future__ import annotations

import json

import pytest

from gpu_share.errors import LedgerError
from gpu_share.sharing.node.ledger import Ledger


def test_unit_size_round_trips() -> None:
    led = Ledger()
    led.unit_mib = 2048
    assert Ledger.from_json(led.to_json()).unit_mib == 2048


def test_ledger_of_an_older_agent_has_an_unknown_unit_size() -> None:
    text = json.dumps({"version": "v1", "seq": 0, "entries": [], "absentSince": []})
    assert Ledger.from_json(text).unit_mib == 0


@pytest.mark.parametrize("bad", [True, "1024", 1024.0, -1, 1024 * 1024 + 1, None, [1024]])
def test_unit_size_of_another_type_or_out_of_range_is_refused(bad: object) -> None:
    text = json.dumps({"version": "v1", "seq": 0, "entries": [], "memoryUnitMiB": bad})
    with pytest.raises(LedgerError):
        Ledger.from_json(text)
