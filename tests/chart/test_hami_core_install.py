"""hami-core pools install the image's libvgpu.so on the node (init container
install-hami-core) before the agent starts; the agent sees the library and the preload
file read-only; other modes, and hamiCore.install=false, get no installer."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.conftest import by_kind, helm_path, render

LIB = "agentConfig.runtime.hamiCore.libraryPath"
PRELOAD = "agentConfig.runtime.hamiCore.preloadPath"


def _pod(*sets: str) -> dict[str, Any]:
    objs = render(helm_path(4), sets=list(sets))
    (ds,) = [d for d in by_kind(objs, "DaemonSet") if "-mps" not in d["metadata"]["name"]]
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def test_hami_core_pools_install_the_library_first() -> None:
    pod = _pod("agentConfig.runtime.enforcement=hami-core")
    (init,) = pod["initContainers"]
    assert init["name"] == "install-hami-core"
    assert init["command"][:2] == ["gpu-share", "install-hami-core"]
    agent = next(c for c in pod["containers"] if c["name"] == "agent")
    assert init["image"] == agent["image"]
    sc = init["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["readOnlyRootFilesystem"]
    assert sc["allowPrivilegeEscalation"] is False
    assert not _mounts(init)["/usr/local/vgpu"].get("readOnly", False)
    assert _mounts(init)["/etc/gpu-share"]["readOnly"]
    assert _mounts(agent)["/usr/local/vgpu"]["readOnly"]


def test_a_preload_file_elsewhere_gets_its_own_mount() -> None:
    pod = _pod("agentConfig.runtime.enforcement=hami-core", f"{LIB}=/opt/vgpu/libvgpu.so",
               f"{PRELOAD}=/etc/gpu-share-preload/ld.so.preload")
    init = pod["initContainers"][0]
    agent = next(c for c in pod["containers"] if c["name"] == "agent")
    vols = {v["name"]: v for v in pod["volumes"]}
    for ctr, ro in ((init, False), (agent, True)):
        m = _mounts(ctr)
        assert m["/opt/vgpu"].get("readOnly", False) is ro
        assert m["/etc/gpu-share-preload"].get("readOnly", False) is ro
        assert vols[m["/etc/gpu-share-preload"]["name"]]["hostPath"]["path"] == (
            "/etc/gpu-share-preload")


@pytest.mark.parametrize("sets", [
    ["agentConfig.runtime.enforcement=hami-core", "hamiCore.install=false"],
    ["agentConfig.runtime.enforcement=mps"],
    ["agentConfig.runtime.enforcement=none"],
])
def test_no_installer_otherwise(sets: list[str]) -> None:
    assert "initContainers" not in _pod(*sets)
