"""Story 10: the cdi-cri and cdi-annotations strategies on a CDI-capable runtime.

The pool is switched (helm upgrade with a pool values file, as in story 7) to one CDI
strategy at a time, with passDeviceSpecs off: a container's device nodes can then only come
from the agent's CDI spec (/var/run/cdi on the node, written at start, removed on a clean
exit). A pod asking a slice runs and sees exactly its device node and the spec's env for
its device, nothing of the others; restoring the pool's values removes the spec file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_share.devices.dummy import dummy_uuid
from gpu_share.sharing.cdi import ENV_CDI_DEVICE_PREFIX, spec_file_name
from testkit.e2e import DEVICES, MEM, Kube, assignment, container, pod, pool_values
from testkit.harness import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

KIND = "vendor.com/npu"
SPEC = Path("/var/run/cdi") / spec_file_name(KIND)
NODE_PREFIX = "dummy-npu"


def _pool_values(tmp: Path, strategy: str) -> str:
    """Only the local pool's runtime (see story 7: `--set nodePools[0]...` would replace
    the whole pool entry)."""
    runtime = {"deviceListStrategy": [strategy], "cdiKind": KIND, "passDeviceSpecs": False}
    return pool_values(tmp, {"runtime": runtime}, f"pool-{strategy}.yaml")


def _upgrade(kube: Kube, *extra: str, rolls: bool = True) -> None:
    """``rolls``: the pool's config changes, so its agent pod is replaced (helm's --wait
    already waits for the DaemonSet's rollout; this also sees the new pod serving)."""
    old = kube.ready_agent()
    kube.install(*extra, action="upgrade")
    if not rolls:
        kube.wait_agent_serving()
        return
    wait_until(
        "the agent pod rolled",
        lambda: (
            (p := kube.ready_agent())
            and (old is None or p["metadata"]["uid"] != old["metadata"]["uid"])
        ),
        180,
    )
    kube.wait_agent_serving()


def _seen(kube: Kube, ns: str, name: str) -> tuple[dict[str, str], set[str], list[str]]:
    kube.kubectl(
        "-n", ns, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s", timeout=150
    )
    out = kube.kubectl("-n", ns, "exec", name, "-c", "main", "--", "env").stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    dev = set(kube.kubectl("-n", ns, "exec", name, "-c", "main", "--", "ls", "/dev").stdout.split())
    doc = wait_until(
        f"the assignment of {name}", lambda: assignment(kube.get("pod", name, "-n", ns)), 60
    )
    uuids = [d["id"] for d in doc["main"]["devices"]]
    return env, dev, uuids


def _check_story(kube: Kube, ns: str, strategy: str) -> None:
    index = {dummy_uuid("NPU", kube.node, i): i for i in range(DEVICES)}
    wait_until(
        f"the agent's CDI spec {SPEC} (CdiSpecWriter.write() at agent start)",
        SPEC.exists,
        60,
    )
    spec: dict[str, Any] = json.loads(SPEC.read_text())
    assert spec["kind"] == KIND
    assert sorted(d["name"] for d in spec["devices"]) == sorted(index)
    assert SPEC.stat().st_mode & 0o777 == 0o644

    name = f"slice-{strategy}"
    kube.apply([pod(name, ns, [container("main", 4, 30)])])
    env, dev, uuids = _seen(kube, ns, name)
    assert len(uuids) == 1, uuids
    (mine,) = uuids
    i = index[mine]
    # The CDI env of its device only.
    cdi_env = {k: v for k, v in env.items() if k.startswith(ENV_CDI_DEVICE_PREFIX)}
    assert cdi_env == {f"{ENV_CDI_DEVICE_PREFIX}{i}": mine}, env
    # Exactly its device node (and the shared control node), none of the others'.
    nodes = {d for d in dev if d.startswith(NODE_PREFIX)}
    assert nodes == {f"{NODE_PREFIX}{i}", f"{NODE_PREFIX}ctl"}, sorted(dev)
    # The informational env of the response is unchanged by the strategy.
    assert env.get("GPU_SHARE_DEVICE_IDS") == mine
    assert env.get("GPU_SHARE_MEMORY_LIMIT_MIB") == "4096"
    assert env.get("GPU_SHARE_CORE_PERCENT") == "30"
    kube.kubectl("-n", ns, "delete", "pod", name, "--wait=true", timeout=120)


def test_story10_cdi_strategies_inject_exactly_the_slice_device(
    agent: Kube, namespace: str, tmp_path: Path
) -> None:
    """cdi-cri, then cdi-annotations: the container sees its device through CDI only;
    restoring the pool's values removes the agent's spec file."""
    assert agent.node_resources()["allocatable"][MEM] > 0
    try:
        for strategy in ("cdi-cri", "cdi-annotations"):
            _upgrade(agent, "-f", _pool_values(tmp_path, strategy))
            cfg = agent.agent_exec("cat", "/etc/gpu-share/config.yaml").stdout
            assert strategy in cfg, cfg
            _check_story(agent, namespace, strategy)
    finally:
        # No roll to wait for if the first upgrade never took effect.
        _upgrade(agent, rolls=False)
    # The CDI pool's agent exited cleanly and took its spec with it; the restored pool
    # (envvar) writes none.
    wait_until(f"{SPEC} removed", lambda: not SPEC.exists(), 60)
