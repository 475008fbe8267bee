"""L4: the node's containerd resolves CDI devices that gpu-share's Allocate names.

The gpu-share agent runs as a host process (dummy backend) with deviceListStrategy
cdi-cri or cdi-annotations and passDeviceSpecs off, so a container's device nodes can only
come from CDI. The spec file is written by hand into the node's /var/run/cdi (what the
runtime does with it does not depend on the agent writing it), then by the agent's own
``CdiSpecWriter`` (its output is what the runtime accepts). Debian's containerd 1.6
(``GPU_SHARE_CONTAINERD=system``) runs the same pod without any of it: no CDI there.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_share.agent.cdi import CdiSpecWriter
from gpu_share.config.model import AgentConfig
from gpu_share.devices.dummy import DummyBackend, dummy_uuid
from gpu_share.sharing.cdi import ENV_CDI_DEVICE_PREFIX
from testkit.harness import CLUSTER_SCRIPT, wait_until
from testkit.host_agent import HostAgent
from tests.cluster.cluster_support import Cluster

pytestmark = pytest.mark.cluster

MEM = "vendor.com/vcuda-memory"
CORE = "vendor.com/vcuda-core"
ASSIGNMENT = "gpu-share.vendor.com/assignment"
DEVICES = 3
UNITS = 8
KIND = "gpu-share.test/npu"
CDI_DIR = Path("/var/run/cdi")
HAND_SPEC = CDI_DIR / "gpu-share-test_hand.json"
PROBE_ENV = "CDI_PROBE_"
PROBE_NODE = "cdi-probe"


def _uuids(node: str) -> list[str]:
    return [dummy_uuid("NPU", node, i) for i in range(DEVICES)]


def _hand_spec(node: str) -> dict:
    devices = [
        {
            "name": u,
            "containerEdits": {
                "env": [f"{PROBE_ENV}{i}={u}"],
                "deviceNodes": [{"path": f"/dev/{PROBE_NODE}{i}", "hostPath": "/dev/null"}],
            },
        }
        for i, u in enumerate(_uuids(node))
    ]
    return {
        "cdiVersion": "0.5.0",
        "kind": KIND,
        "devices": devices,
        "containerEdits": {"env": [f"{PROBE_ENV}SPEC=hand"]},
    }


def _agent_config(strategy: str) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "backend": "dummy",
            "runtime": {"deviceListStrategy": [strategy], "cdiKind": KIND},
            "dummy": {"deviceCount": DEVICES, "memoryMiB": UNITS * 1024},
        }
    )


class Agent(HostAgent):
    def __init__(self, cluster: Cluster, workdir: Path, strategy: str) -> None:
        super().__init__(
            cluster.env,
            workdir,
            devices=DEVICES,
            units=UNITS,
            metrics_port=19473,
            extra_env={
                "GPU_SHARE_RUNTIME__DEVICE_LIST_STRATEGY": json.dumps([strategy]),
                "GPU_SHARE_RUNTIME__CDI_KIND": KIND,
                "GPU_SHARE_RUNTIME__PASS_DEVICE_SPECS": "false",
            },
        )
        self.cluster = cluster

    def start(self, timeout_s: float = 90) -> None:
        super().start(timeout_s)

        def shown() -> bool:
            alloc = self.cluster.get("node", self.cluster.node)["status"].get("allocatable", {})
            assert self.proc is not None and self.proc.poll() is None, self.log()
            return bool(alloc.get(MEM) == str(DEVICES * UNITS))

        wait_until("our resources in allocatable", shown, timeout_s, 0.5)


def _pod(ns: str, name: str, memory: int, cores: int) -> dict:
    limits = {MEM: str(memory)} if memory else {}
    if cores:
        limits[CORE] = str(cores)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": "localhost/busybox:local",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "exec sleep 600"],
                    "resources": {"limits": limits},
                }
            ],
        },
    }


def _seen(cluster: Cluster, ns: str, name: str) -> tuple[dict[str, str], set[str], list[str]]:
    """(the container's env, its /dev entries, the assignment's device uuids)."""
    cluster.kubectl(
        "-n", ns, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s", timeout=150
    )
    env_out = cluster.kubectl("-n", ns, "exec", name, "--", "env").stdout
    env = dict(line.split("=", 1) for line in env_out.splitlines() if "=" in line)
    dev = set(cluster.kubectl("-n", ns, "exec", name, "--", "ls", "/dev").stdout.split())
    pod = cluster.get("pod", name, "-n", ns)
    doc = json.loads(pod["metadata"]["annotations"][ASSIGNMENT])
    uuids = [d["id"] for d in doc["containers"]["main"]["devices"]]
    return env, dev, uuids


def _check_exactly(
    env: dict[str, str],
    dev: set[str],
    uuids: list[str],
    node: str,
    env_prefix: str,
    dev_prefix: str,
) -> None:
    """The container has the CDI env and node of its own device(s), none of the others."""
    index = {u: i for i, u in enumerate(_uuids(node))}
    want_env = {f"{env_prefix}{index[u]}": u for u in uuids}
    got_env = {k: v for k, v in env.items() if k.startswith(env_prefix) and k[-1].isdigit()}
    assert got_env == want_env, (env, uuids)
    want_dev = {f"{dev_prefix}{index[u]}" for u in uuids}
    got_dev = {d for d in dev if d.startswith(dev_prefix) and d[len(dev_prefix) :].isdigit()}
    assert got_dev == want_dev, (sorted(dev), uuids)
    assert env.get("GPU_SHARE_DEVICE_IDS") == ",".join(sorted(uuids, key=index.__getitem__))


@pytest.fixture
def hand_spec(cluster: Cluster) -> Iterator[Path]:
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    HAND_SPEC.write_text(json.dumps(_hand_spec(cluster.node)))
    try:
        yield HAND_SPEC
    finally:
        HAND_SPEC.unlink(missing_ok=True)


def _running_containerd(cluster: Cluster) -> str:
    ctr = Path(cluster.env["CONTAINERD_BIN_DIR"]) / "ctr"
    out = subprocess.run(
        [str(ctr), "--address", cluster.env["CONTAINERD_ADDRESS"], "version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    server = out.split("Server:", 1)[1]
    return next(ln.split()[1] for ln in server.splitlines() if ln.strip().startswith("Version:"))


def _switch_containerd(flavour: str) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "restart-containerd"],
        env={**os.environ, "GPU_SHARE_CONTAINERD": flavour},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return time.monotonic() - t0


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
def test_containerd_injects_a_hand_written_spec(
    cluster: Cluster, ns: str, hand_spec: Path, tmp_path: Path, strategy: str
) -> None:
    assert not _running_containerd(cluster).startswith("1.6"), "the cluster runs containerd 1.6"
    agent = Agent(cluster, tmp_path, strategy)
    agent.start()
    try:
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [_pod(ns, "one", 2, 0), _pod(ns, "two", 0, 200)],
            }
        )
        for name, count in (("one", 1), ("two", 2)):
            env, dev, uuids = _seen(cluster, ns, name)
            assert len(uuids) == count
            _check_exactly(env, dev, uuids, cluster.node, PROBE_ENV, PROBE_NODE)
            assert env.get(f"{PROBE_ENV}SPEC") == "hand"  # spec-wide edits, once
            # passDeviceSpecs is off: no device node reached it but through CDI.
            assert not {d for d in dev if d.startswith("dummy-npu")}, sorted(dev)
    finally:
        agent.stop()


def test_containerd_injects_the_agents_spec(cluster: Cluster, ns: str, tmp_path: Path) -> None:
    """The agent writes its spec at start (what ``CdiSpecWriter`` renders), the runtime
    injects it, and a clean exit removes it."""
    cfg = _agent_config("cdi-cri")
    backend = DummyBackend(cfg.dummy, cluster.node)
    path = CdiSpecWriter(cfg, backend.devices(), backend.naming()).path
    path.unlink(missing_ok=True)
    agent = Agent(cluster, tmp_path, "cdi-cri")
    agent.start()
    try:
        assert path.parent == CDI_DIR and path.exists(), "the agent wrote no CDI spec"
        assert oct(path.stat().st_mode & 0o777) == oct(0o644)
        cluster.apply(_pod(ns, "one", 2, 0))
        env, dev, uuids = _seen(cluster, ns, "one")
        _check_exactly(env, dev, uuids, cluster.node, ENV_CDI_DEVICE_PREFIX, "dummy-npu")
        assert "dummy-npuctl" in dev  # the spec-wide shared node
    finally:
        agent.stop()
    assert not path.exists(), "the agent's clean exit left its CDI spec"


def test_containerd_16_ignores_cdi(
    cluster: Cluster, ns: str, hand_spec: Path, tmp_path: Path
) -> None:
    """Debian's containerd 1.6 runs the same pod, but without the CDI device or env."""
    if not Path("/usr/bin/containerd").exists():
        pytest.skip("Debian's containerd is not installed")
    took = _switch_containerd("system")
    try:
        assert _running_containerd(cluster).startswith("1.6")
        agent = Agent(cluster, tmp_path, "cdi-cri")
        agent.start()
        try:
            cluster.apply(_pod(ns, "one", 2, 0))
            env, dev, uuids = _seen(cluster, ns, "one")
            assert len(uuids) == 1
            assert not any(k.startswith(PROBE_ENV) for k in env), env
            assert not {d for d in dev if d.startswith(PROBE_NODE)}, sorted(dev)
        finally:
            agent.stop()
            cluster.kubectl(
                "delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False, timeout=150
            )
    finally:
        took += _switch_containerd("built")
    assert not _running_containerd(cluster).startswith("1.6")
    print(f"containerd switched twice in {took:.0f}s")
