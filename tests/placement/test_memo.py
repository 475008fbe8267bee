"""The placement's memo tables (sharing/placement/memo.py) stay within their bound and
answer what an unbounded table would."""

from __future__ import annotations

import random

from gpu_share.sharing.placement.memo import BoundedMemo


def test_a_full_table_empties_before_it_stores() -> None:
    memo: BoundedMemo[int, str] = BoundedMemo()
    for i in range(10):
        assert memo.put(i, str(i), 4) == str(i)
        assert len(memo) <= 4
    assert memo == {8: "8", 9: "9"}  # emptied at 4 and at 8
    assert memo.get(9) == "9" and memo.get(1) is None


def test_values_are_what_an_unbounded_table_would_give() -> None:
    rng = random.Random(7)
    small: BoundedMemo[int, int] = BoundedMemo()
    big: dict[int, int] = {}
    for _ in range(2_000):
        k = rng.randrange(100)
        got = small.get(k)
        if got is None:
            got = small.put(k, k * k, 16)
        assert got == big.setdefault(k, k * k)
        assert len(small) <= 16
