"""L2 over the real unix-socket gRPC servers of a whole agent: non-canonical unit ids
are INVALID_ARGUMENT with a bounded message; offers no Allocate follows
expire while PodResources is down."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest

from gpu_share.sharing.ids import parse_unit_id
from gpu_share.sharing.node.engine import DEFAULT_OFFER_TTL_S
from tests.agent.served_agent import CORE, MEM, Served, served_agent

TTL = DEFAULT_OFFER_TTL_S


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_agent() as s:
        yield s


def _variants(valid: str) -> dict[str, str]:
    head = valid.rsplit("::", 1)[0]
    return {
        "arabic-indic-3": f"{head}::\u0663",
        "fullwidth-3": f"{head}::\uff13",
        "superscript-2": f"{head}::\u00b2",  # INTERNAL in the old code
        "5000-digits": f"{head}::" + "1" * 5000,  # INTERNAL in the old code
        "leading-zero": f"{head}::03",
        "trailing-newline": f"{head}::3\n",
    }


def _status(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


@pytest.mark.parametrize("variant", list(_variants("X::mem::3")))
def test_non_canonical_ids_are_invalid_argument(served: Served, variant: str) -> None:
    mem = served.clients[MEM]
    ids = served.ids[MEM]
    bad = _variants(ids[3])[variant]
    for call in (
        lambda: mem.allocate([bad]),
        lambda: mem.preferred_allocation([bad, *ids[:2]], [], 1),
        lambda: mem.preferred_allocation(ids[:2], [bad], 1),
    ):
        err = _status(call)
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert len(err.details() or "") < 300
    # Old code: Arabic-Indic and full-width 3 were allocated as unit 3, again and again.
    assert served.agent.engine is not None and served.agent.engine.ledger.entries == []


def test_one_megabyte_id_gets_a_small_invalid_argument(served: Served) -> None:
    huge = served.ids[MEM][0].rsplit("::", 1)[0] + "::" + "7" * 1_000_000
    for call in (
        lambda: served.clients[MEM].allocate([huge]),
        lambda: served.clients[MEM].preferred_allocation([huge], [], 1),
        lambda: served.clients[CORE].allocate(["x" * 1_000_000]),
    ):
        err = _status(call)
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert len(err.details() or "") < 300, len(err.details() or "")
        assert "chars" in (err.details() or "")


def test_more_ids_than_advertised_units_are_refused(served: Served) -> None:
    ids = served.ids[MEM]
    dev = parse_unit_id(ids[0]).device
    many = [f"{dev}::mem::{i}" for i in range(len(ids) + 1)]
    err = _status(lambda: served.clients[MEM].allocate(many))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"this node advertises {len(ids)}" in (err.details() or "")


# ---------------------------------------------------------------- offers
@pytest.fixture
def blind() -> Iterator[Served]:
    with served_agent(podresources=False) as s:  # PodResources unreachable
        yield s


def _reserved(s: Served) -> int:
    assert s.agent.engine is not None
    return sum(u.memory_used for u in s.agent.engine.usage().values())


def test_offers_without_allocate_expire_while_podresources_is_down(blind: Served) -> None:
    mem, ids = blind.clients[MEM], blind.ids[MEM]  # 2 devices x 8 units
    for n in (4, 3, 3):
        assert len(mem.preferred_allocation(ids, [], n)) == n
    assert _reserved(blind) == 10  # the issue: reserved for good
    # No device has 8 free units while the offers stand.
    assert _status(lambda: mem.preferred_allocation(ids, [], 8)).code() is (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    blind.clock.t += TTL
    blind.agent.reconcile()  # the periodic pass, PodResources still down
    assert _reserved(blind) == 0
    assert len(mem.preferred_allocation(ids, [], 8)) == 8


def test_offer_followed_by_its_allocate_within_ttl_still_works(blind: Served) -> None:
    mem, ids = blind.clients[MEM], blind.ids[MEM]
    offered = mem.preferred_allocation(ids, [], 4)
    blind.clock.t += TTL - 1
    resp = mem.allocate(offered)
    assert resp.envs
    blind.clock.t += 10 * TTL
    blind.agent.reconcile()
    assert _reserved(blind) == 4  # held units never expire
    assert blind.agent.engine is not None
    (entry,) = blind.agent.engine.ledger.entries
    assert sorted(entry.memory_ids) == sorted(offered)
