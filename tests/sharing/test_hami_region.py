"""L1: the HAMi-core region the agent seeds (sharing/node/hami_region.py) reads back as the
limits it was given; the env reader takes only what the agent's response writes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_share.sharing.node import hami_region as h


@given(st.lists(st.integers(0, 1 << 22), max_size=h.MAX_DEVICES),
       st.one_of(st.none(), st.integers(-5, 150)))
def test_a_region_reads_back_its_limits(mem: list[int], sm: int | None) -> None:
    data = h.region_bytes(mem, sm)
    assert len(data) == h.FILE_SIZE
    got = h.read_limits(data)
    assert got is not None
    assert got.memory_bytes == tuple(m << 20 for m in mem) + (0,) * (h.MAX_DEVICES - len(mem))
    want_sm = sm if sm is not None and 0 < sm < 100 else h.NO_SM_LIMIT
    assert got.sm_percent == (want_sm,) * h.MAX_DEVICES


def test_what_is_not_a_region_reads_as_none() -> None:
    good = h.region_bytes([1024], 30)
    assert h.read_limits(good[:100]) is None
    assert h.read_limits(b"\0" * h.FILE_SIZE) is None
    other_version = bytearray(good)
    other_version[4] = 9  # major_version
    assert h.read_limits(bytes(other_version)) is None
    with pytest.raises(ValueError):
        h.region_bytes([1] * (h.MAX_DEVICES + 1), None)


def test_the_env_reader_takes_only_the_responses_own_form() -> None:
    envs = {
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_MEMORY_LIMIT_2": "1024m",
        "CUDA_DEVICE_MEMORY_LIMIT": "8192m",  # not per device: not the agent's
        "CUDA_DEVICE_SM_LIMIT": "30",
    }
    assert h.limits_from_env(envs) == ([4096, 0, 1024], 30)
    assert h.limits_from_env({}) == ([], None)
    # Another form would be read as "no limit": refused instead.
    for bad in ({"CUDA_DEVICE_MEMORY_LIMIT_1": "4g"}, {"CUDA_DEVICE_MEMORY_LIMIT_0": "0m"},
                {"CUDA_DEVICE_SM_LIMIT": "x"}, {"CUDA_DEVICE_SM_LIMIT": "-1"}):
        with pytest.raises(ValueError):
            h.limits_from_env(bad)


def test_the_enforcement_annotation_explains_only_a_node_that_cannot_enforce() -> None:
    from gpu_share.sharing.annotations import enforcement_problem

    assert enforcement_problem(None) == "" and enforcement_problem("{not json") == ""
    assert enforcement_problem('{"mode":"mps","ready":true,"problems":[]}') == ""
    assert enforcement_problem('["ready", false]') == ""
    assert enforcement_problem('{"mode":"mps","ready":false,"problems":["no daemon"]}') == (
        "enforcement 'mps' unavailable: no daemon")
    assert enforcement_problem('{"mode":"mps","ready":false,"problems":7}') == (
        "enforcement 'mps' unavailable: no reason given")
    long = '{"mode":"m","ready":false,"problems":["' + "x" * 1000 + '"]}'
    assert len(enforcement_problem(long)) < 400


@given(st.lists(st.integers(0, 1 << 22), max_size=h.MAX_DEVICES),
       st.one_of(st.none(), st.integers(0, 100)))
def test_the_sparse_parts_are_the_region(mem: list[int], sm: int | None) -> None:
    """The seed is written as its non-zero parts over zeros: exactly the region."""
    buf = bytearray(h.FILE_SIZE)
    for offset, data in h.region_parts(mem, sm):
        buf[offset:offset + len(data)] = data
    assert bytes(buf) == h.region_bytes(mem, sm)
