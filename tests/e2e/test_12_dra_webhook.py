"""Story 12: the DRA admission webhook from the chart, on the real API server.

The local pool is switched to DRA mode (as in story 11) and ``webhook.enabled`` is set.
The local cluster has no kube-proxy (the API server cannot reach a Service's ClusterIP),
so the webhook runs in the host network and is called by URL on the node's loopback
(``webhook.url``; the chart adds 127.0.0.1 to its generated certificate). Then:

12a a second ``helm upgrade`` keeps the generated certificate and the caBundle (lookup);
12b in a namespace labelled ``gpu-share.vendor.com/dra=enabled`` a plain pod with
    ``vcuda-memory: 4`` + ``vcuda-core: 30`` limits is rewritten to a claim from the
    template ``gpu-share-m4-c30`` (created by the webhook), scheduled with that
    consumedCapacity, prepared by the agent and runs with its slice env (via CDI); a
    server-side dry run is translated without creating a template; a pod asking nothing
    is not touched;
12c the same pod in an unlabelled namespace is not touched (its limits stay, no claim);
12d with no webhook replica answering, such a pod in the labelled namespace is refused
    (failurePolicy Fail) while a pod asking nothing is still admitted (matchConditions).

Whatever happens, the module restores the device-plugin pool with the webhook off.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_share.devices.dummy import dummy_uuid
from gpu_share.sharing.dra.claim_translation import MANAGED_BY, ClaimShape, claim_name
from gpu_share.sharing.quantity import MIB, parse_quantity
from testkit.e2e import AGENT_NS, CORE, MEM, RELEASE, Kube, container, dra_values, pod
from testkit.harness import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DRIVER = "gpu-share.vendor.com"
UNIT_MIB = 1024  # the chart's default memoryUnitMiB
LABEL = ("gpu-share.vendor.com/dra", "enabled")
PORT = 8443
WEBHOOK = f"{RELEASE}-webhook"  # the chart's full name is the release name ("gpu-share")
TLS_SECRET = f"{WEBHOOK}-tls"
MWC = f"{WEBHOOK}-{AGENT_NS}"


def _say(msg: str) -> None:
    print(f"[story 12] {msg}", flush=True)


def _values(kube: Kube, tmp: Path) -> str:
    """The local pool in DRA mode (story 11's values) plus the webhook, reachable from
    the API server on the node's loopback."""
    return dra_values(
        kube,
        tmp / "pool-dra-webhook.yaml",
        DRIVER,
        webhook={
            "enabled": True,
            "replicas": 1,  # host network: one per node
            "port": PORT,
            "hostNetwork": True,
            "url": f"https://127.0.0.1:{PORT}/mutate",
            "extraEnv": [
                {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
            ],
            "logLevel": "debug",
        },
    )


def _webhook_pods(kube: Kube) -> list[dict[str, Any]]:
    sel = "app.kubernetes.io/component=webhook"
    return list(kube.get("pods", "-n", AGENT_NS, "-l", sel)["items"])


@dataclass
class Installed:
    kube: Kube
    values: str


@pytest.fixture(scope="module")
def installed(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    if not kube.installed():
        kube.install()
    kube.wait_agent_serving()
    values = _values(kube, tmp_path_factory.mktemp("webhook"))
    old = kube.ready_agent()
    old_uid = old["metadata"]["uid"] if old else None
    try:
        kube.install("-f", values, action="upgrade")  # --wait: the webhook Deployment too
        wait_until(
            "a new ready agent pod (DRA mode)",
            lambda: p if (p := kube.ready_agent()) and p["metadata"]["uid"] != old_uid else None,
            180,
        )
        wait_until(
            "the node's ResourceSlice",
            lambda: kube.get(
                "resourceslices",
                "--field-selector",
                f"spec.driver={DRIVER},spec.nodeName={kube.node}",
            )["items"],
            90,
        )
        _say(
            f"DRA pool + webhook installed: {[p['metadata']['name'] for p in _webhook_pods(kube)]}"
        )
        yield Installed(kube, values)
    finally:
        old = kube.ready_agent()
        old_uid = old["metadata"]["uid"] if old else None
        kube.install(action="upgrade")  # the pool's own values: device plugin, no webhook
        wait_until(
            "the device-plugin agent back",
            lambda: p if (p := kube.ready_agent()) and p["metadata"]["uid"] != old_uid else None,
            180,
        )
        kube.wait_agent_serving()
        wait_until("the webhook pods gone", lambda: not _webhook_pods(kube), 120)
        assert kube.kubectl("get", "mutatingwebhookconfiguration", MWC, check=False).returncode
        assert kube.kubectl("-n", AGENT_NS, "get", "secret", TLS_SECRET, check=False).returncode


@pytest.fixture
def labelled(installed: Installed, namespace: str) -> str:
    installed.kube.kubectl("label", "namespace", namespace, f"{LABEL[0]}={LABEL[1]}")
    return namespace


def _tls_state(kube: Kube) -> tuple[str, str]:
    secret = kube.get("secret", TLS_SECRET, "-n", AGENT_NS)
    mwc = kube.get("mutatingwebhookconfiguration", MWC)
    return secret["data"]["tls.crt"], mwc["webhooks"][0]["clientConfig"]["caBundle"]


def test_story12a_upgrade_keeps_the_certificate(installed: Installed) -> None:
    kube = installed.kube
    before = _tls_state(kube)
    assert before[1] == kube.get("secret", TLS_SECRET, "-n", AGENT_NS)["data"]["ca.crt"]
    kube.install("-f", installed.values, action="upgrade")
    assert _tls_state(kube) == before, "helm upgrade rotated the webhook certificate"
    (wh,) = _webhook_pods(kube)
    args = wh["spec"]["containers"][0]["args"]
    assert f"--memory-unit-mib={UNIT_MIB}" in args and f"--device-class={DRIVER}" in args


def _ready(kube: Kube, ns: str, name: str) -> None:
    kube.kubectl(
        "-n", ns, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s", timeout=150
    )


def _vcuda(p: dict[str, Any]) -> dict[str, str]:
    limits = p["spec"]["containers"][0].get("resources", {}).get("limits", {})
    return {k: v for k, v in limits.items() if k in (MEM, CORE)}


def test_story12b_labelled_namespace_pod_is_translated_and_runs(
    installed: Installed, labelled: str
) -> None:
    kube, ns = installed.kube, labelled
    shape = ClaimShape(4, 30)
    kube.apply(pod("plain", ns, [container("main", 4, 30)]))
    p = kube.get("pod", "plain", "-n", ns)
    # Translated at admission: the vcuda keys are gone, the container holds its claim.
    assert not _vcuda(p), p["spec"]["containers"][0]
    assert p["spec"]["resourceClaims"] == [
        {"name": claim_name("main"), "resourceClaimTemplateName": shape.template_name}
    ], p["spec"]
    assert p["spec"]["containers"][0]["resources"]["claims"] == [{"name": claim_name("main")}]
    rct = kube.get("resourceclaimtemplate", shape.template_name, "-n", ns)
    assert rct["metadata"]["labels"][MANAGED_BY[0]] == MANAGED_BY[1]

    try:
        _ready(kube, ns, "plain")
    except AssertionError:
        logs = kube.component_logs("webhook", "--tail=50")
        _say(f"events: {kube.events(ns, 'plain')}\nwebhook: {logs}")
        raise
    p = kube.get("pod", "plain", "-n", ns)
    (st,) = p["status"]["resourceClaimStatuses"]
    claim = kube.get("resourceclaim", st["resourceClaimName"], "-n", ns)
    (res,) = claim["status"]["allocation"]["devices"]["results"]
    assert res["driver"] == DRIVER and res["pool"] == kube.node, res
    consumed = res["consumedCapacity"]
    assert parse_quantity(consumed["memory"]) == 4 * UNIT_MIB * MIB, consumed
    assert parse_quantity(consumed["cores"]) == 30, consumed
    index = int(res["device"].removeprefix("gpu-"))
    uuid = dummy_uuid("NPU", kube.node, index)

    kube.assert_sees_one_device(ns, "plain", (index, uuid), 4 * UNIT_MIB, 30)
    _say(f"plain pod translated, on {res['device']}: {consumed}")

    # A server-side dry run is translated too, without creating its template.
    dry = ClaimShape(2, 10)
    out = kube.kubectl(
        "create",
        "--dry-run=server",
        "-o",
        "json",
        "-f",
        "-",
        input=json.dumps(pod("dry", ns, [container("main", 2, 10)])),
    ).stdout
    dp = json.loads(out)
    assert dp["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == dry.template_name
    assert kube.kubectl(
        "-n", ns, "get", "resourceclaimtemplate", dry.template_name, check=False
    ).returncode, "a dry run created a template"

    # A pod asking nothing: not sent to the webhook, not changed.
    kube.apply(pod("nothing", ns, [container("main")]))
    p = kube.get("pod", "nothing", "-n", ns)
    assert "resourceClaims" not in p["spec"], p["spec"]


def test_story12c_unlabelled_namespace_is_untouched(installed: Installed, namespace: str) -> None:
    kube = installed.kube
    kube.apply(pod("plain", namespace, [container("main", 4, 30)]))
    p = kube.get("pod", "plain", "-n", namespace)
    assert _vcuda(p) == {MEM: "4", CORE: "30"}, p["spec"]["containers"][0]
    assert "resourceClaims" not in p["spec"], p["spec"]
    assert not kube.get("resourceclaimtemplates", "-n", namespace)["items"]


def test_story12d_no_webhook_refuses_only_vcuda_pods(installed: Installed, labelled: str) -> None:
    kube, ns = installed.kube, labelled
    kube.kubectl("-n", AGENT_NS, "scale", "deployment", WEBHOOK, "--replicas=0")
    try:
        wait_until("no webhook pod", lambda: not _webhook_pods(kube), 120)
        refused = kube.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(pod("refused", ns, [container("main", 4, 30)])),
            check=False,
        )
        assert refused.returncode != 0, "a vcuda pod was admitted without the webhook"
        assert "claims." + DRIVER in refused.stderr, refused.stderr
        _say(f"refused: {refused.stderr.strip()[:300]}")
        kube.apply(pod("nothing", ns, [container("main")]))
        assert kube.get("pod", "nothing", "-n", ns)["metadata"]["name"] == "nothing"
    finally:
        kube.kubectl("-n", AGENT_NS, "scale", "deployment", WEBHOOK, "--replicas=1")
        kube.kubectl(
            "-n",
            AGENT_NS,
            "rollout",
            "status",
            f"deployment/{WEBHOOK}",
            "--timeout=120s",
            timeout=150,
        )
