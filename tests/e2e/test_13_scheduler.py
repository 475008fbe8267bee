"""Story 13: the chart's second scheduler (``scheduler.enabled``: kube-scheduler + the
gpu-share extender as a sidecar on 127.0.0.1) on the real local cluster.

The kube-scheduler image is ``localhost/kube-scheduler:local``, built from the cluster's
own cached kube-scheduler binary (hack/build-scheduler-image.sh) and imported into its
containerd. The local cluster has no kube-proxy and its API server listens on 127.0.0.1
only, so the scheduler pod runs in the host network and is pointed at 127.0.0.1:6443 (as
the agent is in values-examples/local-cluster.yaml), with the chart's own values:
``scheduler.hostNetwork``, ``scheduler.extraEnv`` (the two env vars), another
``scheduler.securePort`` (the cluster's own scheduler holds 10259 on the host) and
``scheduler.strategy: Recreate`` (a surge pod on the one node could not bind the old
pod's host ports).

13a a pod with ``schedulerName: gpu-share-scheduler`` asking a slice is bound by the
    extender with a signed decision, and the agent follows it: the assignment says
    ``source: extender`` and names the decision's device, which is what the kubelet
    handed out and what the container was told; the scheduler reached the extender over
    mutual TLS on the node's loopback, where any other process of the node gets nothing
    from ``/bind`` (plain HTTP, or TLS without the client certificate);
13b a pod asking more memory units than one device has (but fewer than the node has
    free) stays Pending, ``PodScheduled=False/Unschedulable``, with the extender's
    reason in its FailedScheduling event; it is never sent to the kubelet;
13c ``helm upgrade`` to another decision key (``scheduler.decisionKey.existingSecret``)
    rolls the scheduler and the agent; a pod running before keeps its uid, its restart
    count and its device ids; a new pod lands with a decision signed by the new key (and
    not by the old one), which the agent follows;
13d GPU-model requirements in the pod's ``gpu-share.<domain>/models``
    annotation: a pod accepting the node's model (the dummy backend's ``Dummy NPU``, in
    label form ``Dummy-NPU``, among others) runs on the extender's device; a pod accepting
    only models the node lacks stays Pending with the extender's model reason.

Whatever happens, the module restores the chart's values with ``scheduler.enabled=false``.
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from gpu_share.sharing.decision import DecisionError, decision_key, verify_binding
from gpu_share.sharing.placement.pod_models import models_key
from testkit.e2e import (
    AGENT_NS,
    ASSIGNMENT,
    MEM,
    RELEASE,
    UNITS_PER_DEVICE,
    Kube,
    container,
    device_of,
    pod,
)
from testkit.harness import REPO, run_script, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SCHEDULER = "gpu-share-scheduler"  # scheduler.name
DEPLOYMENT = f"{RELEASE}-scheduler"  # the chart's full name is the release name
GENERATED_KEY = f"{RELEASE}-decision-key"
ROTATED_KEY = f"{RELEASE}-e2e-decision-key-2"
DECISION = decision_key("vendor.com")  # gpu-share.vendor.com/decision
MODELS = models_key("vendor.com")  # gpu-share.vendor.com/models
NODE_MODEL = "Dummy-NPU"  # the chart's dummy model ("Dummy NPU") in label form
IMAGE_SCRIPT = REPO / "hack" / "build-scheduler-image.sh"
# Not 10259: the local cluster's own kube-scheduler listens there on the host.
EXTENDER_PORT = 8888  # scheduler.extender.port (the chart default)
SECURE_PORT = 10359


def _say(msg: str) -> None:
    print(f"[story 13] {msg}", flush=True)


@dataclass
class Scheduled:
    kube: Kube
    args: tuple[str, ...]  # the helm values of the scheduler setup


def _scheduler_pods(kube: Kube) -> list[dict[str, Any]]:
    sel = "app.kubernetes.io/component=scheduler"
    pods = kube.get("pods", "-n", AGENT_NS, "-l", sel)["items"]
    return [p for p in pods if p["metadata"].get("deletionTimestamp") is None]


def _ready(p: Mapping[str, Any]) -> bool:
    conds = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}
    return conds.get("Ready") == "True"


def _scheduler_logs(kube: Kube) -> str:
    return kube.component_logs("scheduler", "--all-containers", "--tail=40")


def _upgrade(kube: Kube, *extra: str) -> None:
    """helm upgrade; then a new ready agent pod serving every device (the agent's config
    or its key's Secret changed, so its pod is replaced)."""
    old = kube.ready_agent()
    old_uid = old["metadata"]["uid"] if old else None
    kube.install(*extra, action="upgrade")
    wait_until(
        "a new ready agent pod",
        lambda: p if (p := kube.ready_agent()) and p["metadata"]["uid"] != old_uid else None,
        180,
    )
    kube.wait_agent_serving()


def _secret_key(kube: Kube, name: str) -> bytes:
    data = kube.get("secret", name, "-n", AGENT_NS)["data"]["key"]
    return base64.b64decode(data).strip()


def _scheduler_key(kube: Kube) -> bytes:
    """The key the running scheduler signs with (the Secret its pod template mounts)."""
    spec = kube.get("deployment", DEPLOYMENT, "-n", AGENT_NS)["spec"]["template"]["spec"]
    (name,) = [v["secret"]["secretName"] for v in spec["volumes"] if v["name"] == "decision-key"]
    return _secret_key(kube, name)


@pytest.fixture(scope="module")
def scheduled(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduled]:
    build = run_script(script=IMAGE_SCRIPT, timeout=900, stream=True)
    assert build.returncode == 0, "hack/build-scheduler-image.sh failed: see above"
    tmp = tmp_path_factory.mktemp("scheduler")
    values = tmp / "scheduler.yaml"
    values.write_text(
        json.dumps(
            {
                "scheduler": {
                    "enabled": True,
                    "name": SCHEDULER,
                    "image": {
                        "registry": "localhost",
                        "repository": "kube-scheduler",
                        "tag": "local",
                    },
                    "extender": {"mode": "sidecar"},
                    # The local cluster: no kube-proxy, API server on 127.0.0.1 only.
                    "hostNetwork": True,
                    "securePort": SECURE_PORT,
                    "strategy": {"type": "Recreate"},
                    "extraEnv": [
                        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
                    ],
                }
            }
        )
    )
    args = ("-f", str(values))
    if not kube.installed():
        kube.install()
    kube.wait_agent_serving()
    try:
        _upgrade(kube, *args)  # --wait: the scheduler Deployment too
        pods = wait_until(
            "a ready scheduler pod", lambda: [p for p in _scheduler_pods(kube) if _ready(p)], 120
        )
        _say(f"scheduler installed: {[p['metadata']['name'] for p in pods]}")
        yield Scheduled(kube, args)
    except BaseException:
        _say(f"scheduler logs:\n{_scheduler_logs(kube)}")
        raise
    finally:
        _upgrade(kube)  # the pool's own values: scheduler.enabled=false
        wait_until("scheduler pods gone", lambda: not _scheduler_pods(kube), 120)
        # The generated key is kept on uninstall (resource-policy keep): start clean.
        for name in (GENERATED_KEY, ROTATED_KEY):
            kube.kubectl(
                "-n", AGENT_NS, "delete", "secret", name, "--ignore-not-found", check=False
            )


def _gpu_pod(
    name: str, ns: str, memory: int, cores: int = 0, models: str | None = None
) -> dict[str, Any]:
    annotations = {MODELS: models} if models is not None else None
    doc = pod(name, ns, [container("main", memory, cores)], annotations=annotations)
    doc["spec"]["schedulerName"] = SCHEDULER
    return doc


def _running(kube: Kube, ns: str, name: str, timeout: int = 120) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        p = kube.get("pod", name, "-n", ns)
        phase = p["status"].get("phase")
        assert phase not in ("Failed", "Succeeded"), (phase, kube.events(ns, name))
        return p if phase == "Running" and _ready(p) else None

    try:
        return wait_until(f"pod {name} running", check, timeout)
    except BaseException:
        _say(f"events of {name}: {kube.events(ns, name)}\n{_scheduler_logs(kube)}")
        raise


def _landed(kube: Kube, ns: str, name: str, key: bytes) -> tuple[dict[str, Any], str]:
    """The running pod and its device, after checking that the extender's decision (signed
    with ``key``) names that device, the agent followed it, and the kubelet and the
    container agree."""
    p = _running(kube, ns, name)
    meta = p["metadata"]
    assert p["spec"]["nodeName"] == kube.node
    d = verify_binding(meta["annotations"][DECISION], key, meta["uid"], kube.node)
    chosen = d.devices_of("main")
    assert chosen is not None and len(chosen) == 1, d
    doc = wait_until(
        f"the assignment of {name}",
        lambda: kube.get("pod", name, "-n", ns)["metadata"].get("annotations", {}).get(ASSIGNMENT),
        60,
    )
    main = json.loads(doc)["containers"]["main"]
    assert main["source"] == "extender", main  # the agent verified and followed it
    assert [dev["id"] for dev in main["devices"]] == list(chosen), (main, chosen)
    held = kube.namespace_devices(ns)[(ns, name, "main")]
    assert {device_of(i) for ids in held.values() for i in ids} == set(chosen), held
    seen = wait_until(f"the SEEN line of {name}", lambda: kube.seen(ns, name, "main"), 60)
    assert seen["ids"] == chosen[0], seen
    return p, chosen[0]


def _node_process_bind(namespace: str) -> list[str]:
    """What a process of the node (this test runs on it) gets from the sidecar's /bind on
    the node's 127.0.0.1: each attempt's failure, or "answered" when one got through."""
    body = json.dumps({"PodName": "victim", "PodNamespace": namespace, "PodUID": "u",
                       "Node": "x"}).encode()
    got = []
    no_cert = ssl.create_default_context()
    no_cert.check_hostname, no_cert.verify_mode = False, ssl.CERT_NONE
    for scheme, ctx in (("http", None), ("https", no_cert)):
        req = urllib.request.Request(f"{scheme}://127.0.0.1:{EXTENDER_PORT}/bind", body)
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
                got.append(f"{scheme}: answered {resp.status}")
        except urllib.error.HTTPError as exc:
            got.append(f"{scheme}: answered {exc.code}")
        except (urllib.error.URLError, OSError) as exc:
            got.append(f"{scheme}: refused ({exc})")
    return got


def test_story13a_scheduled_pod_runs_on_the_extenders_device(
    scheduled: Scheduled, namespace: str
) -> None:
    kube = scheduled.kube
    key = _secret_key(kube, GENERATED_KEY)
    kube.apply([_gpu_pod("slice", namespace, 4, 30)])
    _, dev = _landed(kube, namespace, "slice", key)
    seen = kube.seen(namespace, "slice", "main")
    assert seen["mem"] == "4096" and seen["cores"] == "30", seen
    events = kube.events(namespace, "slice")
    assert any(e.startswith("Scheduled:") for e in events), events
    _say(f"slice on {dev} (signed decision followed); events {events}")
    attempts = _node_process_bind(namespace)
    assert all(": refused" in a for a in attempts), attempts
    _say(f"/bind from another process of the node: {attempts}")


def _unschedulable(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    p = kube.get("pod", name, "-n", ns)
    conds = p["status"].get("conditions", [])
    hit = any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds)
    return p if hit else None


def test_story13b_pod_no_single_device_fits_stays_pending(
    scheduled: Scheduled, namespace: str
) -> None:
    kube = scheduled.kube
    free = kube.node_resources()["allocatable"][MEM]
    want = UNITS_PER_DEVICE + 1
    assert want < free, (want, free)  # the node-wide sum would fit
    kube.apply([_gpu_pod("too-big", namespace, want)])
    wait_until("too-big Unschedulable", lambda: _unschedulable(kube, namespace, "too-big"), 90)

    def reason() -> list[str] | None:
        msgs = [e for e in kube.events(namespace, "too-big") if e.startswith("FailedScheduling")]
        return msgs if any("no single device fits" in m for m in msgs) else None

    msgs = wait_until("the extender's reason in FailedScheduling", reason, 60)
    assert any(f"{want} memory units" in m for m in msgs), msgs
    time.sleep(5)  # and it stays that way
    p = kube.get("pod", "too-big", "-n", namespace)
    assert p["status"].get("phase") == "Pending" and not p["spec"].get("nodeName"), p["status"]
    assert DECISION not in p["metadata"].get("annotations", {})
    _say(f"too-big Pending: {msgs[-1]}")


def test_story13c_key_rotation_keeps_running_pods(scheduled: Scheduled, namespace: str) -> None:
    kube = scheduled.kube
    old_key = _secret_key(kube, GENERATED_KEY)
    kube.apply([_gpu_pod("before", namespace, 4, 30)])
    before, dev = _landed(kube, namespace, "before", old_key)
    held = kube.namespace_devices(namespace)
    sched_before = {p["metadata"]["uid"] for p in _scheduler_pods(kube)}

    new_key = secrets.token_urlsafe(36).encode()
    kube.kubectl("-n", AGENT_NS, "delete", "secret", ROTATED_KEY, "--ignore-not-found")
    kube.kubectl(
        "-n",
        AGENT_NS,
        "create",
        "secret",
        "generic",
        ROTATED_KEY,
        f"--from-literal=key={new_key.decode()}",
    )
    _upgrade(kube, *scheduled.args, "--set", f"scheduler.decisionKey.existingSecret={ROTATED_KEY}")
    wait_until(
        "the scheduler pod rolled",
        lambda: (
            (ps := [p for p in _scheduler_pods(kube) if _ready(p)])
            and not {p["metadata"]["uid"] for p in ps} & sched_before
            and len(_scheduler_pods(kube)) == len(ps)
        ),
        180,
    )
    _say("decision key rotated: scheduler and agent rolled")

    after = kube.get("pod", "before", "-n", namespace)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["phase"] == "Running", after["status"]
    assert [c["restartCount"] for c in after["status"]["containerStatuses"]] == [0]
    assert kube.namespace_devices(namespace) == held

    kube.apply([_gpu_pod("after", namespace, 4, 30)])
    p, dev2 = _landed(kube, namespace, "after", new_key)
    text = p["metadata"]["annotations"][DECISION]
    with pytest.raises(DecisionError):
        verify_binding(text, old_key, p["metadata"]["uid"], kube.node)
    _say(f"after rotation: before on {dev} untouched, after on {dev2} with the new key")


def test_story13d_model_requirements_place_or_keep_pending(
    scheduled: Scheduled, namespace: str
) -> None:
    kube = scheduled.kube
    key = _scheduler_key(kube)
    allowed = f"NVIDIA-A100-SXM4-80GB|{NODE_MODEL}"
    kube.apply([_gpu_pod("on-model", namespace, 2, 10, models=allowed)])
    _, dev = _landed(kube, namespace, "on-model", key)

    other = "NVIDIA-H100-80GB-HBM3,Tesla-T4"
    kube.apply([_gpu_pod("off-model", namespace, 2, 10, models=other)])
    wait_until("off-model Unschedulable", lambda: _unschedulable(kube, namespace, "off-model"), 90)

    def reason() -> list[str] | None:
        msgs = [e for e in kube.events(namespace, "off-model") if e.startswith("FailedScheduling")]
        return msgs if any(f"device model '{NODE_MODEL}' is not one" in m for m in msgs) else None

    msgs = wait_until("the extender's model reason in FailedScheduling", reason, 60)
    time.sleep(5)  # and it stays that way, though the node has room for it
    p = kube.get("pod", "off-model", "-n", namespace)
    assert p["status"].get("phase") == "Pending" and not p["spec"].get("nodeName"), p["status"]
    assert DECISION not in p["metadata"].get("annotations", {})
    _say(f"on-model on {dev}; off-model Pending: {msgs[-1]}")
