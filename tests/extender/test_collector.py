"""The extender keeps CPython's full collections out of the request path once its view
has synced (gpu_share.cli.extender_main.quiet_collector)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gpu_share.cli.extender_main import quiet_collector


@pytest.fixture
def collector() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_view_listing_is_frozen_and_collections_come_seldom(collector: None) -> None:
    listing = [{"node": f"n{i}", "devices": [[i, 100]]} for i in range(5000)]
    gc.unfreeze()
    quiet_collector()
    # The long-lived objects made before (the view's first listing) are out of every
    # later collection, and a collection waits for 50,000 allocations, not 700.
    assert gc.get_freeze_count() >= len(listing)
    assert gc.get_threshold()[0] == 50_000
    assert gc.is_tracked(listing)
