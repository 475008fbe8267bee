"""The agent sees the hami-core cache root at the host path it hands to containers, so it
can create each container's dir (keyed by pod UID) and remove it when the pod goes."""

from __future__ import annotations

from tests.chart.conftest import by_kind, helm_path, render


def test_agent_mounts_the_hami_cache_root_only_in_hami_core_mode() -> None:
    for mode, mounted in (("hami-core", True), ("mps", False), ("none", False)):
        objs = render(
            helm_path(4),
            sets=[
                f"agentConfig.runtime.enforcement={mode}",
                "agentConfig.runtime.hamiCore.cacheDir=/var/lib/gpu-share/vgpu",
            ],
        )
        agents = [d for d in by_kind(objs, "DaemonSet") if "-mps" not in d["metadata"]["name"]]
        assert agents
        for ds in agents:
            pod = ds["spec"]["template"]["spec"]
            ctr = next(c for c in pod["containers"] if c["name"] == "agent")
            mounts = {m["mountPath"]: m for m in ctr.get("volumeMounts", [])}
            vols = {v["name"]: v for v in pod.get("volumes", [])}
            got = mounts.get("/var/lib/gpu-share/vgpu")
            assert (got is not None) is mounted, (mode, sorted(mounts))
            if got is not None:
                assert not got.get("readOnly", False)
                assert vols[got["name"]]["hostPath"]["path"] == "/var/lib/gpu-share/vgpu"
