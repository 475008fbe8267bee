"""What the kwok scale tests need: the local cluster and a built kwok (else a loud skip),
and for the DRA tests the v1.36 kube-scheduler (waited for where the cluster is required,
else a plain skip)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testkit.harness import live_cluster, loud_skip
from testkit.harness.env import REQUIRE_CLUSTER

ROOT = Path(__file__).resolve().parents[2]
# A cold build of kube-scheduler v1.36 took 417 s here; twice that and more for a busy
# machine (hack/test.sh starts it beside the other tests).
SCHEDULER_BUILD_S = 1800


def needs_kwok(request: pytest.FixtureRequest, what: str = "scale test (kwok)") -> None:
    live_cluster(request, what)
    built = subprocess.run(
        ["bash", str(ROOT / "hack" / "build-kwok.sh"), "--print"], capture_output=True,
        text=True, check=False,
    )
    if built.returncode != 0:
        loud_skip("scale test (kwok)", "kwok is not built (hack/build-kwok.sh)")


def needs_kwok_and_scheduler_136(request: pytest.FixtureRequest, what: str) -> None:
    """kwok, and kube-scheduler v1.36 as `hack/cluster/build.sh k8s-136` caches it. The
    test command builds it in the background (hack/test.sh): where the cluster is
    required this waits for that build (or runs it), under the build's own lock, and
    fails if it fails; elsewhere an uncached scheduler is a plain skip."""
    needs_kwok(request, what)
    build = ["bash", str(ROOT / "hack" / "cluster" / "build.sh")]
    sched = subprocess.run([*build, "k8s-136-dir"], capture_output=True, text=True, check=False)
    if (Path(sched.stdout.strip()) / ".stamp").is_file():
        return
    if not REQUIRE_CLUSTER:
        pytest.skip("kube-scheduler v1.36 is not built: run hack/cluster/build.sh k8s-136")
    done = subprocess.run(
        [*build, "k8s-136"], capture_output=True, text=True, check=False, timeout=SCHEDULER_BUILD_S
    )
    assert done.returncode == 0, f"kube-scheduler v1.36 did not build:\n{done.stderr[-3000:]}"


def one_path(out: Path, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``python -m bench.scale ARGS --out OUT`` in this process, for one path at one rate:
    the JSON it wrote and that path's figures."""
    from bench.scale.__main__ import main

    assert main([*args, "--lock-timeout", "120", "--out", str(out)]) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    (figures,) = doc["paths"]
    return doc, figures


def dra_136_path(
    request: pytest.FixtureRequest, out: Path, what: str, *args: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A DRA path of bench.scale on kube-scheduler v1.36 (``--dra-scheduler 1.36``), its
    prerequisites checked first (``needs_kwok_and_scheduler_136``): ``one_path``."""
    needs_kwok_and_scheduler_136(request, what)
    return one_path(out, "--dra-scheduler", "1.36", "--settle", "30", *args)
