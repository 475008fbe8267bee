"""bench/dra_allocator (the DRA allocator's search for our slice and claim shapes, on
k8s.io/dynamic-resource-allocation v0.35.4 and v0.36.5) still builds against both module
graphs and measures what docs/dra-allocator.md says: built and run here so that a module
bump that breaks it, or an upstream change to the search, fails the test command."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit.harness.env import REPO, loud_skip

BUILD = REPO / "bench" / "dra_allocator" / "build.sh"


@pytest.fixture(scope="module")
def binaries() -> Path:
    if shutil.which("go") is None:
        loud_skip("bench/dra_allocator", "no Go toolchain")
    cache = Path(os.environ.get("GPU_SHARE_CACHE", Path.home() / ".cache" / "gpu-share"))
    out = cache / "bench" / "dra-allocator"
    proc = subprocess.run(["bash", str(BUILD), str(out)], capture_output=True, text=True,
                          timeout=1500)
    assert proc.returncode == 0, f"{BUILD} failed:\n{proc.stderr[-4000:]}"
    return out


def _rows(binary: Path) -> dict[str, tuple[str, int]]:
    """scenario -> (allocated, allocateOne calls per Allocate), one call each."""
    proc = subprocess.run([str(binary), "-repeats", "1", "-budget", "1s", "-cluster-nodes", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {}
    for line in proc.stdout.splitlines():
        _order, scenario, _lib, allocated, _median, calls, _timed = line.split("\t")
        rows[scenario.split()[0]] = (allocated, int(calls))
    return rows


def test_v135_searches_permutations_and_v136_combinations(binaries: Path) -> None:
    old = _rows(binaries / "dra-allocator-v135")
    new = _rows(binaries / "dra-allocator-v136")
    assert old.keys() == new.keys() >= {"1", "2a", "2b", "3a", "3b", "4"}
    for scenario in old:  # the same answers; only the search differs
        assert old[scenario][0] == new[scenario][0], scenario
    assert old["1"][0] == "yes" and old["3a"][0] == "yes"
    assert old["2a"][0] == "no" and old["4"][0] == "no"
    # 8 whole GPUs asked, 7 fit: every ordered sequence of the 7 (sum of 7!/(7-k)!) on
    # v0.35.4, every subset (2^7) on v0.36.5.
    assert old["2a"][1] == 13700
    assert new["2a"][1] == 128
    assert new["2b"][1] < old["2b"][1]
