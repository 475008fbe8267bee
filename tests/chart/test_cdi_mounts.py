"""Pools that name devices through CDI get the runtime's spec dirs: the transient one
read-write (the agent writes its spec there and removes it on exit), the static one
read-only (the agent reads nvidia-ctk's specs so as not to define their devices twice).
Other device-plugin pools mount the transient one only, with the DRA plugin dir: they
remove what a DRA pool of the same driver left there (agent/dra/leftovers.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .conftest import by_kind, helm_path, render


def _agent_mounts(ds: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = ds["spec"]["template"]["spec"]
    ctr = next(c for c in pod["containers"] if c["name"] == "agent")
    mounts = {m["mountPath"]: m for m in ctr.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    return mounts, vols


def _agents(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d
        for d in by_kind(objs, "DaemonSet")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "agent"
    }


def test_cdi_dirs_mounted_only_for_cdi_strategies() -> None:
    for strategies, mounted in (
        (["cdi-cri"], True),
        (["envvar", "cdi-annotations"], True),
        (["envvar"], False),
        (["volume-mounts"], False),
    ):
        objs = render(
            helm_path(4),
            sets=[f"json:agentConfig.runtime.deviceListStrategy={json.dumps(strategies)}"],
        )
        agents = _agents(objs)
        assert agents
        for ds in agents.values():
            mounts, vols = _agent_mounts(ds)
            dyn, static = mounts.get("/var/run/cdi"), mounts.get("/etc/cdi")
            assert dyn is not None, (strategies, sorted(mounts))
            assert not dyn.get("readOnly", False)
            assert "/var/lib/kubelet/plugins/gpu-share.vendor.com" in mounts
            assert (static is not None) is mounted, (strategies, sorted(mounts))
            if mounted:
                assert dyn is not None and static is not None
                assert not dyn.get("readOnly", False)
                assert static["readOnly"] is True
                assert vols[dyn["name"]]["hostPath"] == {
                    "path": "/var/run/cdi",
                    "type": "DirectoryOrCreate",
                }
                assert vols[static["name"]]["hostPath"]["path"] == "/etc/cdi"


def test_cdi_host_dirs_follow_values_and_pool_overrides(tmp_path: Path) -> None:
    """Host paths come from hostPaths; the container paths stay the runtime's defaults
    (where the agent looks). A pool override of the strategy decides for that pool only."""
    values = tmp_path / "pools.yaml"
    values.write_text(
        json.dumps(
            {
                "hostPaths": {"cdiSpecDir": "/run/cdi-x", "cdiStaticSpecDir": "/opt/cdi"},
                "nodePools": [
                    {
                        "name": "cdi",
                        "nodeSelector": {"pool": "cdi"},
                        "agentConfig": {"runtime": {"deviceListStrategy": ["cdi-cri"]}},
                    },
                    {"name": "plain", "nodeSelector": {"pool": "plain"}},
                ],
            }
        )
    )
    agents = _agents(render(helm_path(3), values=[values]))
    (cdi,) = [d for n, d in agents.items() if n.endswith("-cdi")]
    (plain,) = [d for n, d in agents.items() if n.endswith("-plain")]
    mounts, vols = _agent_mounts(cdi)
    assert vols[mounts["/var/run/cdi"]["name"]]["hostPath"]["path"] == "/run/cdi-x"
    assert vols[mounts["/etc/cdi"]["name"]]["hostPath"]["path"] == "/opt/cdi"
    mounts, vols = _agent_mounts(plain)
    assert "/etc/cdi" not in mounts
    assert vols[mounts["/var/run/cdi"]["name"]]["hostPath"]["path"] == "/run/cdi-x"
