"""bench.enforcement runs (so it never rots): every case measured, every memory limit
hit. No timing is asserted: the figures depend on the machine."""

from __future__ import annotations

from bench import enforcement


def test_the_bench_measures_every_case() -> None:
    res = enforcement.measure(seconds=0.3, kernel_us=1000)
    assert res["sm"][0]["case"] == "no HAMi-core"
    assert len(res["sm"]) == 5 and all(r["launches_per_s"] > 0 for r in res["sm"])
    for m in res["memory"]:
        assert (m["allocated_mib"], m["refused"]) == (m["limit_mib"], "CUDA_ERROR_OUT_OF_MEMORY")
