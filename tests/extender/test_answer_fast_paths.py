"""The prioritize answer's fast paths answer as the plain code did: ``ranked`` (sorted
names, then by score) as the sort of (score, name) pairs, and ``encode_priorities`` byte
for byte as ``json.dumps``."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

import pytest

from gpu_share.extender.core import MAX_PRIORITY, ranked
from gpu_share.extender.http import encode_priorities


def ranked_pairs(names: list[str], fits: Mapping[str, tuple[float, ...]]) -> list[Any]:
    """``ranked`` as it was written first: a sort of (score, name) pairs."""
    order = sorted((sc, n) for n, sc in fits.items())
    scores = {n: 0 for n in names}
    for rank, (_, n) in enumerate(order):
        scores[n] = (
            MAX_PRIORITY
            if rank == 0
            else (MAX_PRIORITY - 1) - ((MAX_PRIORITY - 1) * (rank - 1) // max(1, len(order) - 1))
        )
    return [{"Host": n, "Score": scores[n]} for n in names]


def _name(rng: random.Random, i: int) -> str:
    odd = rng.choice(("", "é", '"', "\\", "\n", "\u2028", "\U0001f600", "ü-ß"))
    return f"n{rng.randint(0, 30)}{odd}-{i}"


@pytest.mark.parametrize("seed", range(40))
def test_ranked_orders_as_score_name_pairs(seed: int) -> None:
    rng = random.Random(seed)
    names = [_name(rng, i) for i in range(rng.randint(0, 60))]
    rng.shuffle(names)
    values = [(rng.choice((0.0, 0.5, 1.0)), rng.choice((-1.0, 2.0))) for _ in range(4)]
    # few distinct scores: many ties, broken by name
    fits = {n: rng.choice(values) for n in names if rng.random() < 0.7}
    assert ranked(names, fits) == ranked_pairs(names, fits)


@pytest.mark.parametrize("seed", range(40))
def test_priorities_encode_as_json_dumps(seed: int) -> None:
    rng = random.Random(seed)
    names = [_name(rng, i) for i in range(rng.randint(0, 80))]
    fits = {n: (rng.random(),) for n in names if rng.random() < 0.6}
    answer = ranked(names, fits)
    assert encode_priorities(answer) == json.dumps(answer).encode()


@pytest.mark.parametrize("score", [True, 1.5, -(2**70), 2**70, 0])
def test_priorities_with_other_scores_encode_as_json_dumps(score: Any) -> None:
    answer: Any = [{"Host": "a", "Score": 3}, {"Host": "b\u00e9", "Score": score}]
    assert encode_priorities(answer) == json.dumps(answer).encode()
