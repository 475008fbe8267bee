from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench.replay import trace
from bench.replay.bound import estimate, pack


@given(st.lists(st.integers(1, 999), max_size=200))
def test_pack_keeps_every_item_and_never_overfills(shares: list[int]) -> None:
    bins = pack(shares)
    assert all(0 <= free < 1000 and 0 < top <= 1000 - free for top, free in bins)
    assert sum(1000 - free for _, free in bins) == sum(shares)
    # Best fit opens a device only when no open one can take the item, so at most one
    # device ends up at most half full.
    assert sum(1 for _, free in bins if free >= 500) <= 1


def test_pairs_that_sum_to_one_device_share_it() -> None:
    assert sorted(pack([810, 190, 650, 350, 500, 500])) == [(500, 0), (650, 0), (810, 0)]


def test_estimate_of_a_tight_and_an_overfull_mix() -> None:
    def pod(milli: int, n: int = 1) -> trace.TracePod:
        return trace.TracePod("p", 0, 0, n, milli, "")

    tight = estimate([pod(500), pod(500), pod(1000, 2)], devices=3)
    assert tight["waste"] == 0 and tight["fill"] == 100 and tight["drop"] == 100
    # Four 810s on three devices: one is left out; each placed one strands 190.
    over = estimate([pod(810)] * 4, devices=3)
    assert over["devices_needed"] == 4
    assert round(over["drop"], 2) == round(100 * 3 * 810 / 3000, 2)
    assert round(over["waste_big"], 2) == round(100 * 4 * 190 / 3000, 2)
