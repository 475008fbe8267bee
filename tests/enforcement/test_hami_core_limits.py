"""L2 + the real enforcement software: the agent's Allocate responses applied to workload
processes as a runtime would (mounts in a private mount namespace, the env), HAMi-core's
libvgpu.so (built from the pinned source) preloaded through the mounted
/etc/ld.so.preload, in front of the stand-in driver. Every limit is watched being hit."""

from __future__ import annotations

from pathlib import Path

from gpu_share.sharing.node import hami_region
from tests.enforcement import runtime
from tests.enforcement.conftest import Built
from tests.enforcement.slices import hami_node

OOM = "CUDA_ERROR_OUT_OF_MEMORY"


def _alloc(chunk_mib: int, *extra: str) -> list[str]:
    return ["--chunk-mib", str(chunk_mib), "--max-chunks", "4096", *extra]


def test_a_4_unit_slice_allocates_its_limit_and_not_one_chunk_more(
    built: Built, tmp_path: Path
) -> None:
    with hami_node(built, tmp_path) as node:
        resp = node.slice("p", 4, 30)
        assert resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
        for chunk in (256, 1024):
            r = runtime.run(resp, node.image, [node.image.workload, *_alloc(chunk)])
            assert r.rc == 0, r.stderr[-2000:]
            assert r.out["refused"] and r.out["refused_error"] == OOM, r.out
            assert r.out["allocated_mib"] == 4096, r.out


def test_256_mib_units_give_a_1_gib_limit(built: Built, tmp_path: Path) -> None:
    with hami_node(built, tmp_path, memory_mib=8192, unit_mib=256) as node:
        resp = node.slice("p", 4)
        assert resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"
        r = runtime.run(resp, node.image, [node.image.workload, *_alloc(64)])
        assert (r.out["allocated_mib"], r.out["refused_error"]) == (1024, OOM), r.out


def test_without_the_preload_the_same_workload_takes_the_whole_device(
    built: Built, tmp_path: Path
) -> None:
    """The control: the slice's env without its mounts (no /etc/ld.so.preload) and the
    stand-in refuses only when the device is full, so the stops here are HAMi-core's."""
    with hami_node(built, tmp_path, memory_mib=8192) as node:
        resp = node.slice("p", 4)
        r = runtime.run(resp, node.image, [node.image.workload, *_alloc(1024)], mounts=False)
        assert (r.out["allocated_mib"], r.out["refused_error"]) == (8192, OOM), r.out


def test_two_slices_on_one_device_each_stop_at_their_own_limit(
    built: Built, tmp_path: Path
) -> None:
    """b holds its 3 units while a, on the same device, allocates: each stops at its own
    limit, whatever the other holds."""
    with hami_node(built, tmp_path, memory_mib=8192) as node:
        a, b = node.slice("a", 5), node.slice("b", 3)
        assert a.envs["GPU_SHARE_DEVICE_IDS"] == b.envs["GPU_SHARE_DEVICE_IDS"]
        pb = runtime.start(b, node.image, [node.image.workload, *_alloc(512, "--hold-seconds",
                                                                         "30")])
        assert runtime.wait_holding(pb) == 3072
        ra = runtime.run(a, node.image, [node.image.workload, *_alloc(512)])
        runtime.stop(pb)
        assert (ra.out["allocated_mib"], ra.out["refused_error"]) == (5120, OOM), ra.out
        assert ra.out["meminfo_free_mib_before"] == 5120, ra.out


def test_two_slices_starting_together_never_exceed_their_limits(
    built: Built, tmp_path: Path
) -> None:
    """Both containers start at once. HAMi-core names a process's host pid by the
    process that appears in NVML's list while it creates its first context, under a lock
    of its own container only, so a neighbour starting in the same instant can be taken
    for it and its memory charged as this one's context: a slice may then get less than
    its limit, never more, and the device is never over-committed."""
    with hami_node(built, tmp_path, memory_mib=8192) as node:
        a, b = node.slice("a", 5), node.slice("b", 3)
        hold = ["--hold-seconds", "2"]
        pa = runtime.start(a, node.image, [node.image.workload, *_alloc(512, *hold)])
        pb = runtime.start(b, node.image, [node.image.workload, *_alloc(512, *hold)])
        ra, rb = runtime.finish(pa), runtime.finish(pb)
        both = {"a": ra.out, "b": rb.out}
        assert ra.out["refused_error"] == rb.out["refused_error"] == OOM, both
        assert ra.out["allocated_mib"] <= 5120 and rb.out["allocated_mib"] <= 3072, both
        assert ra.out["meminfo_total_mib"] == 5120 and rb.out["meminfo_total_mib"] == 3072, both


def test_processes_of_one_container_share_its_limit_whatever_their_env(
    built: Built, tmp_path: Path
) -> None:
    """A second process of the container (same cache dir) that sets a larger limit in
    its own env is held to the container's: HAMi-core counts the container's processes
    together, against the limits of its cache file."""
    with hami_node(built, tmp_path) as node:
        resp = node.slice("p", 4)
        first = runtime.start(
            resp, node.image,
            [node.image.workload, *_alloc(1024, "--target-mib", "3072", "--hold-seconds", "30")],
        )
        assert runtime.wait_holding(first) == 3072
        second = runtime.run(
            resp, node.image, [node.image.workload, *_alloc(256)],
            env={"CUDA_DEVICE_MEMORY_LIMIT_0": "16g", "CUDA_DEVICE_MEMORY_LIMIT": "16g"},
        )
        runtime.stop(first)
        assert (second.out["allocated_mib"], second.out["refused_error"]) == (1024, OOM), (
            second.out
        )


def test_a_workload_that_rewrites_its_limit_env_is_still_held_to_its_slice(
    built: Built, tmp_path: Path
) -> None:
    """The first process of the container sets a larger limit (or none) in its own env,
    as an entrypoint could: the agent seeded the container's cache file at Allocate, so
    HAMi-core takes the slice's limits from it (the first writer's)."""
    with hami_node(built, tmp_path) as node:
        for name, env in (("raised", {"CUDA_DEVICE_MEMORY_LIMIT_0": "16g"}),
                          ("unset", {"CUDA_DEVICE_MEMORY_LIMIT_0": ""})):
            resp = node.slice(name, 4)
            r = runtime.run(resp, node.image, [node.image.workload, *_alloc(1024)], env=env)
            assert (r.out["allocated_mib"], r.out["refused_error"]) == (4096, OOM), (name, r.out)


def test_ld_preload_emptied_by_the_workload_does_not_lift_the_limit(
    built: Built, tmp_path: Path
) -> None:
    """The library comes from the mounted /etc/ld.so.preload, not from LD_PRELOAD."""
    with hami_node(built, tmp_path) as node:
        resp = node.slice("p", 4)
        assert "LD_PRELOAD" not in resp.envs
        r = runtime.run(
            resp, node.image,
            ["env", "LD_PRELOAD=", node.image.workload, *_alloc(1024)],
            env={"LD_PRELOAD": ""},
        )
        assert (r.out["allocated_mib"], r.out["refused_error"]) == (4096, OOM), r.out


def test_a_memory_only_slice_has_no_sm_cap(built: Built, tmp_path: Path) -> None:
    with hami_node(built, tmp_path) as node:
        resp = node.slice("m", 2)
        assert "CUDA_DEVICE_SM_LIMIT" not in resp.envs
        r = runtime.run(resp, node.image, [
            node.image.workload, "--chunk-mib", "256", "--target-mib", "256",
            "--launch-seconds", "0.5"])
        assert r.rc == 0 and r.out["launches"] > 0, r.out
        cache = next((tmp_path / "vgpu").glob("uid-m_main/gpu-share.cache"))
        limits = hami_region.read_limits(cache.read_bytes())
        assert limits is not None and set(limits.sm_percent) == {hami_region.NO_SM_LIMIT}
        assert limits.memory_bytes[0] == 2 << 30
