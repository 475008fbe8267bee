"""L3: the webhook over HTTPS on 127.0.0.1, called by a real kube-apiserver (conftest.py)
through a MutatingWebhookConfiguration as the chart would install it: failurePolicy
Fail, sideEffects NoneOnDryRun, timeoutSeconds 5, namespaces opting in by label.

The pods stay pending (no scheduler, no nodes): what is proven is what the API server
stores: the pod with its claims and without vcuda keys, the templates it names.
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from kube_fakes import ApiServer

from gpu_share.config.model import AgentConfig
from gpu_share.kube.claim_templates import (
    WEBHOOK_RULES,
    ClaimTemplates,
    OptInNamespaces,
    templates_path,
)
from gpu_share.kube.rest import ApiError, RestClient, make_rest_client
from gpu_share.observability.http import BoundedServer
from gpu_share.sharing.dra.claim_translation import ClaimShape, TranslationSettings, template_body
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.quantity import parse_quantity
from gpu_share.webhook.http import make_server
from gpu_share.webhook.review import Mutator
from gpu_share.webhook.tls import ReloadingTLS
from tests.extender.tls_support import make_pki

pytestmark = pytest.mark.apiserver

MEM, CORE = "vendor.com/vcuda-memory", "vendor.com/vcuda-core"
UNIT = int(AgentConfig.model_fields["memory_unit_mib"].default)  # the default unit
SETTINGS = TranslationSettings(ResourceNames(MEM, CORE), UNIT)
DRIVER = "gpu-share.vendor.com"
LABEL = ("gpu-share.vendor.com/dra", "enabled")
HOOK = "dra.gpu-share.vendor.com"
MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


@dataclass
class Env:
    api: RestClient
    on: str  # labelled namespace
    off: str  # unlabelled namespace
    hook_api: RestClient  # the webhook's own identity
    url: str = ""  # the webhook, for callers other than the API server
    ca: Path | None = None

    def create_pod(self, ns: str, pod: dict[str, Any], dry: bool = False) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{ns}/pods"
        if dry:
            result: dict[str, Any] = self.api.request(
                "dry-run pod", "POST", path, query={"dryRun": "All"}, body=pod)
            return result
        created: dict[str, Any] = self.api.create("create pod", path, pod)
        return created

    def get_pod(self, ns: str, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.api.get("get pod", f"/api/v1/namespaces/{ns}/pods/{name}")
        return got

    def template(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = self.api.get("get template", templates_path(ns, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return got


def _pod(name: str, limits: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    res: dict[str, Any] = {"requests": {"cpu": "100m"}}
    if limits is not None:
        res["limits"] = limits
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": res}],
                 **spec},
    }
    return body


def _until(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


def _webhook_config(name: str, url: str, ca: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": HOOK,
            "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {LABEL[0]: LABEL[1]}},
            "failurePolicy": "Fail",
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
            "reinvocationPolicy": "IfNeeded",
        }],
    }


def _namespace(api: RestClient, name: str, labels: dict[str, str]) -> None:
    api.create("create ns", "/api/v1/namespaces",
               {"metadata": {"name": name, "labels": labels}})
    # No controller manager: the ServiceAccount admission plugin needs "default".
    api.create("create sa", f"/api/v1/namespaces/{name}/serviceaccounts",
               {"metadata": {"name": "default"}})


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _webhook_identity(apiserver: ApiServer, admin: RestClient, d: Path) -> str:
    """A kubeconfig of user gpu-share-webhook, bound to exactly WEBHOOK_RULES."""
    ca = Path(apiserver.ca_file)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "hook.key", "-out", "hook.csr", "-subj", "/CN=gpu-share-webhook",
             cwd=d)
    (d / "hook.ext").write_text("extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", "hook.csr", "-CA", str(ca), "-CAkey",
             str(ca.with_name("ca.key")), "-CAcreateserial", "-out", "hook.crt", "-days", "1",
             "-extfile", "hook.ext", cwd=d)
    name = f"gpu-share-webhook-{uuid.uuid4().hex[:6]}"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    admin.create("create role", f"{rbac}/clusterroles", {
        "metadata": {"name": name},
        "rules": [{"apiGroups": [g], "resources": [r], "verbs": list(v)}
                  for g, r, v in WEBHOOK_RULES],
    })
    admin.create("create binding", f"{rbac}/clusterrolebindings", {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": "gpu-share-webhook"}],
    })
    kubeconfig = d / "webhook.kubeconfig"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: t, cluster: {{server: "{apiserver.url}", certificate-authority: "{ca}"}}}}]
users: [{{name: w, user: {{client-certificate: "{d / 'hook.crt'}",
                          client-key: "{d / 'hook.key'}"}}}}]
contexts: [{{name: w, context: {{cluster: t, user: w}}}}]
current-context: w
""")
    return str(kubeconfig)


def _mutated(env: Env) -> bool:
    pod = env.create_pod(env.on, _pod("probe", {MEM: "1", CORE: "1"}), dry=True)
    return bool(pod["spec"].get("resourceClaims"))


@pytest.fixture(scope="module")
def env(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    pki = make_pki(tmp_path_factory.mktemp("webhook-pki"))
    api = make_rest_client(apiserver.kubeconfig)
    # The webhook calls the API server with exactly the permissions the chart grants.
    identity = _webhook_identity(apiserver, api, tmp_path_factory.mktemp("webhook-user"))
    hook_api = make_rest_client(identity)
    templates = ClaimTemplates(hook_api, cache_ttl_s=0.0)
    namespaces = OptInNamespaces(hook_api, *LABEL, cache_ttl_s=0.0)
    mutator = Mutator(SETTINGS, templates.ensure_all, opted_in=namespaces.opted_in,
                      budget_s=3.0)
    tls = ReloadingTLS(str(pki.server_cert), str(pki.server_key))
    server: BoundedServer = make_server(mutator, "127.0.0.1", 0, ssl_context=tls.context)
    server.start()
    suffix = uuid.uuid4().hex[:6]
    mwc = f"gpu-share-dra-{suffix}"
    e = Env(api, f"dra-on-{suffix}", f"dra-off-{suffix}", hook_api)
    e.url = f"https://127.0.0.1:{server.server_address[1]}/mutate"
    e.ca = pki.ca
    try:
        with contextlib.suppress(ApiError):  # another module may have made it
            api.create("create deviceclass", "/apis/resource.k8s.io/v1/deviceclasses", {
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            })
        _namespace(api, e.on, {LABEL[0]: LABEL[1]})
        _namespace(api, e.off, {})
        url = f"https://127.0.0.1:{server.server_address[1]}/mutate"
        api.create("create mwc", MWC_PATH, _webhook_config(mwc, url, pki.ca.read_bytes()))
        _until(lambda: _mutated(e))  # the API server's informer has the configuration
        yield e
    finally:
        with contextlib.suppress(ApiError):
            api.request("delete mwc", "DELETE", f"{MWC_PATH}/{mwc}")
        server.shutdown()
        server.server_close()


def _mi(value: Any) -> Fraction:
    return parse_quantity(value) / 2**20


def _exactly(template: dict[str, Any]) -> dict[str, Any]:
    reqs = template["spec"]["spec"]["devices"]["requests"]
    assert [r["name"] for r in reqs] == ["slice"]
    exactly: dict[str, Any] = reqs[0]["exactly"]
    return exactly


def test_shared_pod_gets_a_claim_and_loses_its_vcuda_keys(env: Env) -> None:
    env.create_pod(env.on, _pod("shared", {MEM: "4", CORE: "30", "cpu": "1"}))
    pod = env.get_pod(env.on, "shared")
    c = pod["spec"]["containers"][0]
    assert c["resources"]["claims"] == [{"name": "gpu-share-main"}]
    assert c["resources"]["limits"] == {"cpu": "1"}
    assert MEM not in c["resources"]["requests"] and CORE not in c["resources"]["requests"]
    assert pod["spec"]["resourceClaims"] == [
        {"name": "gpu-share-main", "resourceClaimTemplateName": "gpu-share-m4-c30"}
    ]
    t = env.template(env.on, "gpu-share-m4-c30")
    assert t is not None
    assert t["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpu-share"}
    ex = _exactly(t)
    assert ex["deviceClassName"] == DRIVER
    assert (ex["allocationMode"], ex["count"]) == ("ExactCount", 1)
    caps = ex["capacity"]["requests"]
    assert _mi(caps["memory"]) == 4 * UNIT
    assert parse_quantity(caps["cores"]) == 30
    # A second pod of the same shape reuses the template (409 + same spec = fine).
    env.create_pod(env.on, _pod("shared-2", {MEM: "4", CORE: "30"}))
    assert env.get_pod(env.on, "shared-2")["spec"]["resourceClaims"][0][
        "resourceClaimTemplateName"] == "gpu-share-m4-c30"


def test_unlabelled_namespace_is_untouched(env: Env) -> None:
    env.create_pod(env.off, _pod("plain", {MEM: "4", CORE: "30"}))
    pod = env.get_pod(env.off, "plain")
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"] == {MEM: "4", CORE: "30"}
    assert "claims" not in c["resources"]
    assert "resourceClaims" not in pod["spec"]
    assert env.template(env.off, "gpu-share-m4-c30") is None


def test_exclusive_pod_gets_whole_devices(env: Env) -> None:
    env.create_pod(env.on, _pod("whole", {CORE: "200"}))
    pod = env.get_pod(env.on, "whole")
    assert pod["spec"]["resourceClaims"] == [
        {"name": "gpu-share-main", "resourceClaimTemplateName": "gpu-share-m0-c200"}
    ]
    t = env.template(env.on, "gpu-share-m0-c200")
    assert t is not None
    ex = _exactly(t)
    assert (ex["allocationMode"], ex["count"]) == ("ExactCount", 2)
    assert {k: parse_quantity(v) for k, v in ex["capacity"]["requests"].items()} == {
        "cores": 100}


def test_memory_only_and_every_container_kind(env: Env) -> None:
    pod = _pod("kinds", {MEM: "2"})
    pod["spec"]["initContainers"] = [
        {"name": "setup", "image": "busybox", "resources": {"limits": {CORE: "10"}}},
        {"name": "side", "image": "busybox", "restartPolicy": "Always",
         "resources": {"limits": {MEM: "1", CORE: "5"}}},
    ]
    env.create_pod(env.on, pod)
    got = env.get_pod(env.on, "kinds")["spec"]
    assert {(c["name"], c["resourceClaimTemplateName"]) for c in got["resourceClaims"]} == {
        ("gpu-share-setup", "gpu-share-m0-c10"),
        ("gpu-share-side", "gpu-share-m1-c5"),
        ("gpu-share-main", "gpu-share-m2-c0"),
    }
    for c in [*got["initContainers"], *got["containers"]]:
        assert c["resources"]["claims"] == [{"name": f"gpu-share-{c['name']}"}]
        assert not {MEM, CORE} & set(c["resources"].get("limits", {}))
    mem_only = env.template(env.on, "gpu-share-m2-c0")
    assert mem_only is not None
    caps = _exactly(mem_only)["capacity"]["requests"]
    assert _mi(caps["memory"]) == 2 * UNIT and parse_quantity(caps["cores"]) == 0


def test_malformed_pod_is_denied_with_the_reason(env: Env) -> None:
    with pytest.raises(ApiError) as bad_cores:
        env.create_pod(env.on, _pod("bad", {CORE: "150"}))
    assert bad_cores.value.status == 400
    assert HOOK in bad_cores.value.detail
    assert "150 cores is more than one device but not a multiple of 100" in bad_cores.value.detail
    pod = _pod("bad2", {MEM: "4"})
    pod["spec"]["containers"][0]["resources"]["requests"][MEM] = "2"
    with pytest.raises(ApiError) as mismatch:
        env.create_pod(env.on, pod)
    assert mismatch.value.status == 400
    assert "differs from the limit" in mismatch.value.detail
    with pytest.raises(ApiError) as missing:
        env.get_pod(env.on, "bad")
    assert missing.value.status == 404


def test_dry_run_creates_no_template(env: Env) -> None:
    got = env.create_pod(env.on, _pod("dry", {MEM: "7", CORE: "11"}), dry=True)
    assert got["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "gpu-share-m7-c11"
    assert env.template(env.on, "gpu-share-m7-c11") is None


def test_a_foreign_template_of_our_name_is_refused(env: Env) -> None:
    body = template_body(ClaimShape(3, 20), env.on, SETTINGS)
    # Someone's template of that name adds a selector (it could steer pods to devices
    # of their choosing): no pod may get a claim from it.
    body["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": 'device.attributes["gpu-share.vendor.com"].index == 0'}}
    ]
    env.api.create("create template", templates_path(env.on), body)
    with pytest.raises(ApiError) as denied:
        env.create_pod(env.on, _pod("victim", {MEM: "3", CORE: "20"}))
    assert denied.value.status == 409
    assert "asks something other than" in denied.value.detail


def test_the_webhook_runs_with_no_more_than_its_rules(env: Env) -> None:
    ClaimTemplates(env.api).ensure(template_body(ClaimShape(4, 30), env.on, SETTINGS))
    assert env.hook_api.get("get template", templates_path(env.on, "gpu-share-m4-c30"))
    for op, path in (("list pods", f"/api/v1/namespaces/{env.on}/pods"),
                     ("delete template", templates_path(env.on, "gpu-share-m4-c30"))):
        with pytest.raises(ApiError) as e:
            env.hook_api.request(op, "DELETE" if "delete" in op else "GET", path)
        assert e.value.status == 403


def test_a_forged_review_creates_nothing_outside_opted_in_namespaces(env: Env) -> None:
    """Anyone who reaches the webhook's port can send it a review naming any namespace:
    the webhook reads the namespace's label itself (with its own RBAC) and creates no
    template where the namespace has not opted in."""
    import http.client
    import json
    import ssl
    from urllib.parse import urlsplit

    assert env.ca is not None
    u = urlsplit(env.url)
    ctx = ssl.create_default_context(cafile=str(env.ca))

    def forge(ns: str) -> dict[str, Any]:
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": str(uuid.uuid4()), "namespace": ns, "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": _pod("forged", {MEM: "3", CORE: "17"}), "dryRun": False}}
        conn = http.client.HTTPSConnection(u.hostname or "", u.port, timeout=10, context=ctx)
        try:
            conn.request("POST", u.path, body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
            answer: dict[str, Any] = json.loads(conn.getresponse().read())["response"]
        finally:
            conn.close()
        return answer

    for ns in (env.off, "kube-system", f"no-such-{uuid.uuid4().hex[:6]}"):
        r = forge(ns)
        assert r["allowed"] is False and r["status"]["code"] == 403, r
        assert env.template(ns, "gpu-share-m3-c17") is None, ns
    # The same review for the opted-in namespace is what the API server would get.
    assert forge(env.on)["allowed"] is True
    assert env.template(env.on, "gpu-share-m3-c17") is not None
