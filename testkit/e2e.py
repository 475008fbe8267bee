"""Helpers of the end-to-end stories (fixtures are in tests/e2e/conftest.py); bench/soak.py
uses them too.

Everything goes through the real tools a user has: ``kubectl`` and ``helm`` against the
local cluster (hack/local-up-cluster.sh), the image built by hack/build-image.sh, and
the kubelet's own PodResources API as the ground truth of which device ids each
container holds.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_share.sharing.cdi import ENV_CDI_DEVICE_PREFIX
from testkit.harness import REPO, Kubectl, wait_until

CHART = REPO / "charts" / "gpu-share"
VALUES = (
    REPO / "values-examples" / "dummy-npu.yaml",
    REPO / "values-examples" / "local-cluster.yaml",
)

RELEASE = "gpu-share"
AGENT_NS = "gpu-share"
SERVICE_ACCOUNT = "gpu-share"  # the chart's full name for release "gpu-share"
MEM = "vendor.com/vcuda-memory"
CORE = "vendor.com/vcuda-core"
ASSIGNMENT = "gpu-share.vendor.com/assignment"
INVENTORY = "gpu-share.vendor.com/inventory"
BUSYBOX = "localhost/busybox:local"
NODE_PREFIX = "dummy-npu"  # the dummy backend's device nodes: dummy-npu<index>, dummy-npuctl
# values-examples/local-cluster.yaml: 4 dummy devices of 16 GiB, 1 GiB units.
DEVICES = 4
UNITS_PER_DEVICE = 16
# The line every test container prints first: what the runtime handed it.
SEEN_PREFIX = "SEEN "
SEEN_CMD = (
    'echo "SEEN visible=$DUMMY_VISIBLE_DEVICES ids=$GPU_SHARE_DEVICE_IDS'
    " mem=$GPU_SHARE_MEMORY_LIMIT_MIB cores=$GPU_SHARE_CORE_PERCENT"
    ' nodes=$(cd /dev && ls -d dummy-npu[0-9]* 2>/dev/null | tr "\\n" "," | sed "s/,$//")"'
)


@dataclass
class Kube(Kubectl):
    """kubectl + helm against the local cluster, as the admin, and the chart's agent."""

    def wait_ready(self, namespace: str, timeout_s: int = 120) -> None:
        """Every pod of ``namespace`` Ready."""
        self.kubectl(
            "-n",
            namespace,
            "wait",
            "--for=condition=Ready",
            "pod",
            "--all",
            f"--timeout={timeout_s}s",
            timeout=timeout_s + 30,
        )

    def namespace_devices(
        self, namespace: str
    ) -> dict[tuple[str, str, str], dict[str, tuple[str, ...]]]:
        """The kubelet's PodResources devices of the containers of ``namespace``."""
        return {
            k: v
            for k, v in kubelet_devices(self.env["POD_RESOURCES_SOCKET"]).items()
            if k[0] == namespace
        }

    # ------------------------------------------------------------------ the node

    def node_resources(self) -> dict[str, dict[str, int]]:
        """{"capacity": {MEM: n, CORE: n}, "allocatable": {...}}; 0 where absent."""
        status = self.get("node", self.node)["status"]
        return {
            k: {r: int(status.get(k, {}).get(r, "0")) for r in (MEM, CORE)}
            for k in ("capacity", "allocatable")
        }

    def inventory(self) -> dict[str, Any]:
        raw = self.get("node", self.node)["metadata"].get("annotations", {}).get(INVENTORY)
        return json.loads(raw) if raw else {}

    # ------------------------------------------------------------------ the agent

    def agent_pods(self) -> list[dict[str, Any]]:
        pods = self.get("pods", "-n", AGENT_NS, "-l", "app.kubernetes.io/component=agent")["items"]
        return [p for p in pods if p["metadata"].get("deletionTimestamp") is None]

    def ready_agent(self) -> dict[str, Any] | None:
        for p in self.agent_pods():
            conds = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}
            if conds.get("Ready") == "True":
                return p
        return None

    def agent_exec(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        pod = self.ready_agent()
        assert pod is not None, "no ready agent pod"
        return self.kubectl(
            "-n", AGENT_NS, "exec", pod["metadata"]["name"], "-c", "agent", "--", *cmd, check=check
        )

    def replace_agent_pod(self, old: Mapping[str, Any], timeout: float) -> None:
        """Delete the agent pod ``old`` and wait for another one Ready (the DaemonSet's)."""
        self.kubectl(
            "-n", AGENT_NS, "delete", "pod", old["metadata"]["name"], "--wait=true", timeout=120
        )
        wait_until(
            "a new ready agent pod",
            lambda: (p := self.ready_agent()) and p["metadata"]["uid"] != old["metadata"]["uid"],
            timeout,
        )

    def ensure_agent_namespace(self) -> None:
        """The chart's namespace, there and allowed privileged pods (the agent's)."""
        if self.kubectl("get", "namespace", AGENT_NS, check=False).returncode != 0:
            self.kubectl("create", "namespace", AGENT_NS)
        self.kubectl(
            "label",
            "namespace",
            AGENT_NS,
            "--overwrite",
            "pod-security.kubernetes.io/enforce=privileged",
        )

    def component_logs(self, component: str, *flags: str) -> str:
        """The last lines of the chart's ``component`` pods (stdout and stderr of kubectl)."""
        out = self.kubectl(
            "-n", AGENT_NS, "logs", "-l", f"app.kubernetes.io/component={component}", *flags,
            check=False,
        )
        return out.stdout + out.stderr

    def installed(self) -> bool:
        return self.helm("status", RELEASE, "-n", AGENT_NS, check=False).returncode == 0

    def install(self, *extra: str, action: str = "install", timeout: int = 300) -> None:
        args = [action, RELEASE, str(CHART), "-n", AGENT_NS]
        for v in VALUES:
            args += ["-f", str(v)]
        args += [*extra, "--wait", "--timeout", f"{timeout}s"]
        self.helm(*args, timeout=timeout + 30)

    def wait_agent_serving(self, timeout: float = 180) -> None:
        """A ready agent pod and the node advertising every device."""
        wait_until("a ready agent pod", self.ready_agent, timeout)
        want = {MEM: DEVICES * UNITS_PER_DEVICE, CORE: DEVICES * 100}
        wait_until(
            f"node allocatable {want}",
            lambda: self.node_resources()["allocatable"] == want,
            timeout,
        )

    def uninstall(self, timeout: float = 180) -> None:
        if self.installed():
            self.helm(
                "uninstall",
                RELEASE,
                "-n",
                AGENT_NS,
                "--wait",
                "--timeout",
                f"{int(timeout)}s",
                timeout=timeout + 30,
            )
        wait_until(
            "agent pods gone",
            lambda: (
                not self.get("pods", "-n", AGENT_NS, "-l", "app.kubernetes.io/component=agent")[
                    "items"
                ]
            ),
            timeout,
        )

    # ------------------------------------------------------------------ namespaces / pods

    def create_namespace(self, name: str) -> str:
        self.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true", timeout=180)
        self.kubectl("create", "namespace", name)
        wait_until(
            f"default ServiceAccount in {name}",
            lambda: self.kubectl("-n", name, "get", "sa", "default", check=False).returncode == 0,
            60,
        )
        return name

    def delete_namespace(self, name: str, wait: bool = True) -> None:
        self.kubectl(
            "delete",
            "namespace",
            name,
            "--ignore-not-found",
            f"--wait={str(wait).lower()}",
            "--timeout=240s",
            check=False,
            timeout=260,
        )

    def pods(self, ns: str) -> list[dict[str, Any]]:
        return list(self.get("pods", "-n", ns)["items"])

    def events(self, ns: str, name: str) -> list[str]:
        items = self.get("events", "-n", ns, "--field-selector", f"involvedObject.name={name}")[
            "items"
        ]
        return [f"{e.get('reason')}: {e.get('message')}" for e in items]

    def seen(self, ns: str, pod: str, container: str) -> dict[str, str]:
        """What the container printed on its SEEN line (key=value pairs)."""
        out = self.kubectl("-n", ns, "logs", pod, "-c", container, check=False).stdout
        for line in out.splitlines():
            if line.startswith(SEEN_PREFIX):
                return dict(
                    kv.split("=", 1) for kv in line[len(SEEN_PREFIX) :].split() if "=" in kv
                )
        return {}

    def assert_sees_one_device(
        self, ns: str, pod_name: str, device: tuple[int, str], memory_mib: int, cores: int
    ) -> None:
        """Container ``main`` of the pod sees its slice of ``device`` (index, uuid) only: the
        device visible and named in the ids, the slice's limits, a CDI env naming that device
        and nothing of the others, and that device's node (and the control node) in /dev."""
        index, uuid = device
        out = self.kubectl("-n", ns, "exec", pod_name, "-c", "main", "--", "env").stdout
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        assert env.get("DUMMY_VISIBLE_DEVICES") == uuid, env
        assert env.get("GPU_SHARE_DEVICE_IDS") == uuid, env
        assert env.get("GPU_SHARE_MEMORY_LIMIT_MIB") == str(memory_mib), env
        assert env.get("GPU_SHARE_CORE_PERCENT") == str(cores), env
        cdi_env = {k: v for k, v in env.items() if k.startswith(ENV_CDI_DEVICE_PREFIX)}
        assert cdi_env == {f"{ENV_CDI_DEVICE_PREFIX}{index}": uuid}, env
        dev = self.kubectl("-n", ns, "exec", pod_name, "-c", "main", "--", "ls", "/dev").stdout
        nodes = {d for d in dev.split() if d.startswith(NODE_PREFIX)}
        assert nodes == {f"{NODE_PREFIX}{index}", f"{NODE_PREFIX}ctl"}, dev

    def wait_pods_settled(self, ns: str, timeout: float) -> list[dict[str, Any]]:
        """Until no pod is Pending (Running, Succeeded or Failed each); returns them."""

        def settled() -> list[dict[str, Any]] | None:
            pods = self.pods(ns)
            if all(p["status"].get("phase") in ("Running", "Succeeded", "Failed") for p in pods):
                return pods
            return None

        got = wait_until(f"pods of {ns} settled", settled, timeout, interval=2, fail=False)
        if got is None:  # name what is still Pending, and why, for the failure report
            pending = {
                p["metadata"]["name"]: {
                    "conditions": [
                        f"{c['type']}={c['status']} {c.get('reason', '')} {c.get('message', '')}"
                        for c in p["status"].get("conditions", [])
                    ],
                    "events": self.events(ns, p["metadata"]["name"])[-3:],
                }
                for p in self.pods(ns)
                if p["status"].get("phase") not in ("Running", "Succeeded", "Failed")
            }
            raise AssertionError(f"pods of {ns} not settled after {timeout:.0f}s: {pending}")
        return got


def run_shapes(
    kube: Kube, namespace: str, shapes: Sequence[tuple[int, int]]
) -> dict[tuple[str, str, str], dict[str, tuple[str, ...]]]:
    """Pods ``old-<i>``, one container of each (memory, cores) shape, Ready and the audit
    clean; the kubelet's device ids of their containers."""
    kube.apply(
        pod(f"old-{i}", namespace, [container("main", m, c)]) for i, (m, c) in enumerate(shapes)
    )
    kube.wait_ready(namespace)
    assert_consistent(kube)
    return kube.namespace_devices(namespace)


def pod_uids(kube: Kube, namespace: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in kube.pods(namespace)}


def assert_pods_kept(
    kube: Kube,
    namespace: str,
    before: Mapping[tuple[str, str, str], Mapping[str, tuple[str, ...]]],
    uids: Mapping[str, str],
    across: str,
) -> None:
    """After a restart ``across`` (the kubelet lists a running pod in PodResources once
    it has synced it again): the same device ids as ``before``, and every pod kept its
    uid, runs and has never restarted."""
    after = wait_until(
        "the new kubelet lists the running pods",
        lambda: (a := kube.namespace_devices(namespace)) and len(a) == len(before) and a,
        90,
    )
    assert after == before, f"running pods' device ids changed across {across}"
    for p in kube.pods(namespace):
        assert p["metadata"]["uid"] == uids[p["metadata"]["name"]]
        assert p["status"]["phase"] == "Running"
        assert all(cs["restartCount"] == 0 for cs in p["status"]["containerStatuses"])


def local_pool(agent_config: Mapping[str, object]) -> dict[str, object]:
    """values-examples/local-cluster.yaml's pool with ``agent_config`` (a values file
    lists the whole pool: `--set nodePools[0]...` would replace the whole list, pool name
    and selector included)."""
    return {
        "name": "local",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "agentConfig": dict(agent_config),
    }


def values_file(path: Path, doc: Mapping[str, object]) -> str:
    """``doc`` written as a values file (JSON is YAML) at ``path``; the path."""
    path.write_text(json.dumps(doc))
    return str(path)


def pool_values(tmp: Path, agent_config: Mapping[str, object], name: str = "pool.yaml") -> str:
    """A values file ``tmp/name`` overriding the local pool's agentConfig only."""
    return values_file(tmp / name, {"nodePools": [local_pool(agent_config)]})


def dra_values(kube: Kube, path: Path, driver: str, **more: object) -> str:
    """A values file at ``path``: the local pool only, in DRA mode, and ``more`` top-level
    values; the kubelet's plugin dirs are below its --root-dir (the kubelet dials the
    socket path the registration names, so the agent mounts them at the host paths)."""
    root = Path(kube.env["KUBELET_ROOT_DIR"])
    doc = {
        "hostPaths": {
            "kubeletPluginsDir": str(root / "plugins"),
            "kubeletPluginsRegistryDir": str(root / "plugins_registry"),
        },
        "nodePools": [local_pool({"dra": {"enabled": True, "driverName": driver}})],
    }
    return values_file(path, doc | more)


def container(
    name: str, memory: int = 0, cores: int = 0, *, command: str | None = None, sleep: bool = True
) -> dict[str, Any]:
    limits: dict[str, str] = {}
    if memory:
        limits[MEM] = str(memory)
    if cores:
        limits[CORE] = str(cores)
    script = command or (SEEN_CMD + ("; exec sleep 3600" if sleep else ""))
    c: dict[str, Any] = {
        "name": name,
        "image": BUSYBOX,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
    }
    if limits:
        c["resources"] = {"limits": limits}
    return c


def pod(
    name: str,
    ns: str,
    containers: Sequence[Mapping[str, Any]],
    init_containers: Sequence[Mapping[str, Any]] = (),
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "containers": list(containers),
    }
    if init_containers:
        spec["initContainers"] = list(init_containers)
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def device_of(device_id: str) -> str:
    """The device uuid of a kubelet device id (``<uuid>::mem::<i>``, ``<uuid>::core::<i>``)."""
    return device_id.split("::", 1)[0]


def assignment(pod_obj: Mapping[str, Any]) -> dict[str, Any]:
    raw = pod_obj["metadata"].get("annotations", {}).get(ASSIGNMENT)
    return json.loads(raw)["containers"] if raw else {}


def kubelet_devices(socket: str) -> dict[tuple[str, str, str], dict[str, tuple[str, ...]]]:
    """(namespace, pod, container) -> {resource: device ids}, from the kubelet's own
    PodResources API (the ground truth of what it handed out)."""
    from gpu_share.plugin.podresources import PodResourcesClient

    client = PodResourcesClient(socket, timeout_s=10, resource_names=(MEM, CORE))
    try:
        view = client.list()
    finally:
        client.close()
    out: dict[tuple[str, str, str], dict[str, tuple[str, ...]]] = {}
    for p in view.pods:
        for c in p.containers:
            if c.devices:
                # Sorted: the kubelet answers in no particular order.
                out[(p.namespace, p.name, c.name)] = {
                    r: tuple(sorted(ids)) for r, ids in c.devices.items()
                }
    return out


@dataclass
class Audit:
    """What the kubelet handed out vs what the agent published, node-wide."""

    mismatches: list[str]
    # (namespace, pod, container) -> device uuids it holds (kubelet view)
    placement: dict[tuple[str, str, str], set[str]]
    mem_used: dict[str, int]
    cores_used: dict[str, int]
    # devices some container holds exclusively (per the assignment annotations)
    exclusive: set[str] = field(default_factory=set)


def audit(kube: Kube) -> Audit:
    """Checks every container holding our resources, from the kubelet's PodResources:

    * its memory and core ids are on ONE device (several only for cores > 100, whole);
    * the pod's assignment annotation names the same device(s) and amounts;
    * no id is held by containers of two different pods (init-container reuse within a
      pod is the kubelet's own accounting);
    * no device is over-committed (memory units, cores; an exclusive device is alone);
    * the node inventory annotation's `used` equals what the kubelet handed out.
    """
    held = kubelet_devices(kube.env["POD_RESOURCES_SOCKET"])
    pods: dict[tuple[str, str], dict[str, Any]] = {}
    for p in kube.get("pods", "-A")["items"]:
        pods[(p["metadata"]["namespace"], p["metadata"]["name"])] = p
    bad: list[str] = []
    placement: dict[tuple[str, str, str], set[str]] = {}
    owner: dict[str, tuple[str, str]] = {}
    mem_ids: dict[str, set[str]] = {}
    core_ids: dict[str, set[str]] = {}
    exclusive: dict[str, set[tuple[str, str]]] = {}
    holders: dict[str, set[tuple[str, str]]] = {}
    for (ns, name, cname), res in sorted(held.items()):
        where = f"{ns}/{name}/{cname}"
        mids, cids = res.get(MEM, ()), res.get(CORE, ())
        devs = {device_of(i) for i in (*mids, *cids)}
        placement[(ns, name, cname)] = devs
        if len(devs) > 1 and len(cids) <= 100:
            bad.append(f"{where}: split over {sorted(devs)} (kubelet ids)")
        for i in (*mids, *cids):
            prev = owner.setdefault(i, (ns, name))
            if prev != (ns, name):
                bad.append(f"{where}: id {i} also held by {prev[0]}/{prev[1]}")
        for d in devs:
            holders.setdefault(d, set()).add((ns, name))
        for i in mids:
            mem_ids.setdefault(device_of(i), set()).add(i)
        for i in cids:
            core_ids.setdefault(device_of(i), set()).add(i)
        p = pods.get((ns, name))
        if p is None:
            continue  # gone from the API already: the kubelet still cleans up
        ann = assignment(p).get(cname)
        if ann is None:
            bad.append(f"{where}: holds {sorted(devs)} but has no assignment annotation")
            continue
        adevs = {d["id"] for d in ann["devices"]}
        if adevs != devs:
            bad.append(f"{where}: annotation says {sorted(adevs)}, kubelet gave {sorted(devs)}")
        amem = sum(int(d["memoryUnits"]) for d in ann["devices"])
        if not any(d.get("exclusive") for d in ann["devices"]) and amem != len(mids):
            bad.append(f"{where}: annotation {amem} memory units, kubelet gave {len(mids)}")
        acores = sum(int(d["cores"]) for d in ann["devices"])
        if acores != len(cids):
            bad.append(f"{where}: annotation {acores} cores, kubelet gave {len(cids)}")
        for d in ann["devices"]:
            if d.get("exclusive"):
                exclusive.setdefault(d["id"], set()).add((ns, name))
    for d, owners in exclusive.items():
        if holders.get(d, set()) - owners:
            bad.append(
                f"device {d} exclusive to {sorted(owners)} but shared with "
                f"{sorted(holders[d] - owners)}"
            )
    mem_used = {d: len(ids) for d, ids in mem_ids.items()}
    cores_used = {d: len(ids) for d, ids in core_ids.items()}
    # Finished classic init containers are not in PodResources, but the kubelet keeps their
    # ids allocated (for reuse by later containers) until the pod ends: count them from the
    # annotation the way the kubelet sizes a pod, max(largest init, sum of the others).
    for (ns, name), p in pods.items():
        if p["status"].get("phase") not in ("Pending", "Running"):
            continue
        ann = assignment(p)
        inits = [
            c["name"]
            for c in p["spec"].get("initContainers", [])
            if c.get("restartPolicy") != "Always"
        ]
        for cname in inits:
            for d in ann.get(cname, {}).get("devices", []):
                uid = d["id"]
                mine_mem = len(
                    {
                        i
                        for (n2, p2, c2), res in held.items()
                        if (n2, p2) == (ns, name)
                        for i in res.get(MEM, ())
                        if device_of(i) == uid
                    }
                )
                mine_cores = len(
                    {
                        i
                        for (n2, p2, c2), res in held.items()
                        if (n2, p2) == (ns, name)
                        for i in res.get(CORE, ())
                        if device_of(i) == uid
                    }
                )
                mem_used[uid] = mem_used.get(uid, 0) + max(0, int(d["memoryUnits"]) - mine_mem)
                cores_used[uid] = cores_used.get(uid, 0) + max(0, int(d["cores"]) - mine_cores)
    for d, n in mem_used.items():
        if n > UNITS_PER_DEVICE:
            bad.append(f"device {d}: {n} memory units handed out > {UNITS_PER_DEVICE}")
    for d, n in cores_used.items():
        if n > 100:
            bad.append(f"device {d}: {n} cores handed out > 100")
    return Audit(bad, placement, mem_used, cores_used, set(exclusive))


def inventory_matches(kube: Kube, a: Audit) -> list[str]:
    """Differences between the node inventory annotation and the kubelet's view
    (exclusive devices count as fully used in the inventory)."""
    inv = kube.inventory()
    out: list[str] = []
    for d in inv.get("devices", []):
        uid = d["id"]
        mem, cores = a.mem_used.get(uid, 0), a.cores_used.get(uid, 0)
        if uid in a.exclusive:  # exclusive devices count as fully used
            mem = d["memoryUnits"]["total"]
        if d["memoryUnits"]["used"] != mem or d["cores"]["used"] != cores:
            out.append(
                f"inventory {uid}: used memory {d['memoryUnits']['used']} cores "
                f"{d['cores']['used']}, kubelet: memory {mem} cores {cores}"
            )
    return out


def assert_consistent(kube: Kube, timeout: float = 60) -> Audit:
    """audit() has no mismatch and the inventory catches up with the kubelet (the agent
    publishes asynchronously)."""
    last: list[str] = []

    def ok() -> Audit | None:
        nonlocal last
        a = audit(kube)
        last = a.mismatches + inventory_matches(kube, a)
        return a if not last else None

    try:
        return wait_until("a consistent node", ok, timeout, interval=2)
    except AssertionError:
        raise AssertionError("mismatches:\n  " + "\n  ".join(last)) from None


# ---------------------------------------------------------------------- failure stories
# What the failure stories (test_9_*) and bench/soak.py need beyond the audit: the
# cluster script's stop/start halves, the agent's host process, and two views of what is
# committed that work while the API server is down (the agent's ledger file on the host,
# and each container's SEEN line in the kubelet's log files).

DEVICE_MIB = UNITS_PER_DEVICE * 1024  # values-examples/local-cluster.yaml: 16 GiB devices


def agent_host_pid(kube: Kube) -> int:
    """Host pid of the ready agent pod's container (the gpu-share-plugin process), from
    the cluster's containerd: the container id in the pod status names its task."""
    p = kube.ready_agent()
    assert p is not None, "no ready agent pod"
    cid = next(
        s["containerID"] for s in p["status"]["containerStatuses"] if s["name"] == "agent"
    ).split("://", 1)[1]
    # The ctr the test command built with containerd (not one that happens to be on PATH).
    ctr = str(Path(kube.env["CONTAINERD_BIN_DIR"]) / "ctr")
    out = kube.run([ctr, "--address", kube.env["CONTAINERD_ADDRESS"], "-n", "k8s.io", "task",
                    "ls"]).stdout
    for line in out.splitlines()[1:]:
        words = line.split()
        if len(words) >= 3 and words[0] == cid and words[2] == "RUNNING":
            return int(words[1])
    raise AssertionError(f"agent container {cid[:12]} has no running task:\n{out}")


def state_dir(kube: Kube) -> Path:
    """The agent's stateDir on the host (values-examples/local-cluster.yaml)."""
    return Path(kube.env["GPU_SHARE_CLUSTER_DIR"]) / "gpu-share-state"


def ledger_usage(kube: Kube, devices: Sequence[str], unit_mib: int = 1024) -> dict[str, Any]:
    """The agent's own accounting, from its persisted ledger on the host (no API server
    needed): device -> DeviceUsage (held ids + reservations of decided entries)."""
    from gpu_share.agent.state import LedgerStore
    from gpu_share.devices.base import Device
    from gpu_share.sharing.inventory import Inventory

    inv = Inventory.from_devices(
        [
            Device(uuid=u, index=i, minor=i, memory_mib=DEVICE_MIB, model="dummy")
            for i, u in enumerate(devices)
        ],
        unit_mib,
    )

    def once() -> dict[str, Any]:
        ledger, _ = LedgerStore(str(state_dir(kube))).read()  # snapshot + journal
        return {} if ledger is None else dict(ledger.usage(inv))

    # The agent may compact (new snapshot, older journals removed) between our reads of
    # the snapshot and the journal: trust two reads in a row that agree.
    last = once()
    for _ in range(10):
        now = once()
        if now == last:
            return now
        last = now
        time.sleep(0.2)
    return last


def seen_on_host(
    kube: Kube, keys: Iterable[tuple[str, str, str]]
) -> dict[tuple[str, str, str], dict[str, str]]:
    """(namespace, pod, container) -> its SEEN line's key=value pairs, read from the
    kubelet's log files on the host (works while the API server is down). Containers that
    have not printed yet are left out."""
    root = Path(kube.env["GPU_SHARE_CLUSTER_DIR"]) / "pod-logs"
    wanted = set(keys)
    out: dict[tuple[str, str, str], dict[str, str]] = {}
    for pod_dir in root.glob("*_*_*") if root.is_dir() else ():
        ns, _, rest = pod_dir.name.partition("_")
        name = rest.rpartition("_")[0]
        for cdir in pod_dir.iterdir():
            key = (ns, name, cdir.name)
            if key not in wanted:
                continue
            logs = sorted(cdir.glob("*.log"), key=lambda f: int(f.stem) if f.stem.isdigit() else -1)
            if not logs:
                continue
            for line in logs[-1].read_text(errors="replace").splitlines():
                # CRI log format: "<time> stdout F <text>"
                text = line.split(" ", 3)[-1]
                if text.startswith(SEEN_PREFIX):
                    out[key] = dict(
                        kv.split("=", 1) for kv in text[len(SEEN_PREFIX) :].split() if "=" in kv
                    )
                    break
    return out


def env_commitment(
    seen: Mapping[tuple[str, str, str], Mapping[str, str]],
) -> tuple[dict[str, int], dict[str, int]]:
    """Per device: MiB and core percent the containers were told they may use."""
    mib: dict[str, int] = {}
    cores: dict[str, int] = {}
    for s in seen.values():
        devs = [d for d in s.get("visible", "").split(",") if d]
        mems = [m for m in s.get("mem", "").split(",") if m]
        for i, d in enumerate(devs):
            if mems:
                mib[d] = mib.get(d, 0) + int(mems[min(i, len(mems) - 1)])
            if s.get("cores"):
                cores[d] = cores.get(d, 0) + int(s["cores"])
    return mib, cores


def overcommit(kube: Kube, devices: Sequence[str], *, units: bool = True) -> list[str]:
    """Over-commitment seen right now, without the API server: units the kubelet handed
    out (PodResources), units the agent's ledger counts, and MiB / core percent the
    running containers were told (their env). ``units=False`` skips the unit counts
    (while two unit sizes are in play only bytes compare)."""
    held = kubelet_devices(kube.env["POD_RESOURCES_SOCKET"])
    bad: list[str] = []
    if units:
        mem: dict[str, int] = {}
        cores: dict[str, int] = {}
        for res in held.values():
            for i in res.get(MEM, ()):
                mem[device_of(i)] = mem.get(device_of(i), 0) + 1
            for i in res.get(CORE, ()):
                cores[device_of(i)] = cores.get(device_of(i), 0) + 1
        bad += [f"kubelet: {d} {n} memory units" for d, n in mem.items() if n > UNITS_PER_DEVICE]
        bad += [f"kubelet: {d} {n} cores" for d, n in cores.items() if n > 100]
        for d, u in ledger_usage(kube, devices).items():
            if u.memory_used > UNITS_PER_DEVICE or u.cores_used > 100:
                bad.append(f"ledger: {d} {u.memory_used} memory units, {u.cores_used} cores")
    mib, pct = env_commitment(seen_on_host(kube, held))
    bad += [f"env: {d} {n} MiB > {DEVICE_MIB}" for d, n in mib.items() if n > DEVICE_MIB]
    bad += [f"env: {d} {n} % cores > 100" for d, n in pct.items() if n > 100]
    return bad


def env_matches_kubelet(kube: Kube, namespace: str, unit_mib: int = 1024) -> list[str]:
    """Each container of ``namespace`` was told exactly what the kubelet handed it: its
    visible device is the device of its ids, MiB = memory ids x unit, cores = core ids."""
    held = kube.namespace_devices(namespace)
    seen = seen_on_host(kube, held)
    bad: list[str] = []
    for key, res in sorted(held.items()):
        s = seen.get(key)
        if s is None:
            bad.append(f"{'/'.join(key)}: no SEEN line")
            continue
        devs = {device_of(i) for ids in res.values() for i in ids}
        visible = {d for d in s.get("visible", "").split(",") if d}
        mem_ids, core_ids = res.get(MEM, ()), res.get(CORE, ())
        want_mem = str(len(mem_ids) * unit_mib) if mem_ids else ""
        want_cores = str(len(core_ids)) if core_ids else ""
        if (visible, s.get("mem", ""), s.get("cores", "")) != (devs, want_mem, want_cores):
            bad.append(
                f"{'/'.join(key)}: env visible={sorted(visible)} mem={s.get('mem')} "
                f"cores={s.get('cores')}, kubelet {sorted(devs)} {len(mem_ids)} memory ids "
                f"{len(core_ids)} core ids"
            )
    return bad
