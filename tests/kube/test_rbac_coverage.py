"""Every API call of gpu_share.kube is covered by the rule list of the component that makes
it (rbac.AGENT_RULES, extender_rbac.EXTENDER_RULES, claim_templates.WEBHOOK_RULES), and
every rule is used."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from kube_fakes import Call, FakeStream, fake_rest, pod_obj, status_obj

import gpu_share.kube
from gpu_share.config.model import ResourcesConfig
from gpu_share.kube.claim_templates import WEBHOOK_RULES, ClaimTemplates, OptInNamespaces
from gpu_share.kube.cordon import NodeCordonWatch
from gpu_share.kube.pods import KubePodSource, NodePodCache
from gpu_share.kube.publish import KubePublisher
from gpu_share.kube.rbac import AGENT_RULES, merged_rules
from gpu_share.kube.resourceclaims import KubeClaimReader
from gpu_share.sharing.dra.claim_translation import ClaimShape, TranslationSettings, template_body
from gpu_share.sharing.model import ResourceNames

KUBE_DIR = Path(gpu_share.kube.__file__).parent

def granted() -> set[tuple[str, str, str]]:
    return {(g, r, v) for (g, r), verbs in merged_rules().items() for v in verbs}


def exercise_everything() -> set[tuple[str, str, str]]:
    """Drive every public operation of the package against a fake API server."""
    streams: list[FakeStream] = []

    def handler(call: Call) -> Any:
        if call.query.get("watch") == "true":
            s = FakeStream(block=True)
            streams.append(s)
            return s
        if call.method == "GET" and call.path == "/api/v1/pods":
            return 200, {"metadata": {"resourceVersion": "5"}, "items": [pod_obj("a")]}
        if call.method == "GET" and "/pods/" in call.path:
            return 200, pod_obj("p")
        if call.method == "GET" and "/nodes/" in call.path:
            return 200, {"metadata": {"name": "node-a"}}
        return 200, {}

    api, http = fake_rest(handler)
    src = KubePodSource.from_config(api, ResourcesConfig())
    src.get_pod("ns", "p")
    src.list_node_pods("node-a")
    cache = NodePodCache(src, "node-a")
    cache.start()
    try:
        assert cache.wait_synced(10)
        deadline = time.monotonic() + 10
        while not streams and time.monotonic() < deadline:
            time.sleep(0.01)
        assert streams, "the cache never opened its watch"
    finally:
        cache.stop()
    # The agent's watch of its own node (device cordons): list, then watch.
    seen = len(streams)
    node_watch = NodeCordonWatch(api, "node-a", "gpu-share.vendor.com/cordon.", lambda _a: None)
    node_watch.start()
    try:
        deadline = time.monotonic() + 10
        while len(streams) == seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(streams) > seen, "the node watch never opened"
    finally:
        node_watch.stop()
    pub = KubePublisher(api, host_node="node-a")
    pub.annotate_node("node-a", {"a": "1"})
    pub.annotate_pod("ns", "p", {"a": None})
    pub.node_annotations("node-a")
    pub.pod_event("ns", "p", reason="R", message="m", warning=True)
    pub.pod_event("ns", "p", reason="R", message="m", warning=True)  # aggregated: patch
    pub.node_event("node-a", reason="R", message="m", warning=False)
    assert pub.failures == {}
    # A claim the kubelet asks to prepare (DRA mode), or one a DRA pool left (device-plugin
    # mode, agent/dra/leftovers.py).
    KubeClaimReader(api).get_claim("ns", "claim")
    return {c.rbac() for c in http.calls}


def test_every_recorded_call_is_granted_and_every_rule_is_used() -> None:
    used = exercise_everything()
    assert used <= granted(), f"calls not in rbac.AGENT_RULES: {sorted(used - granted())}"
    assert granted() <= used, f"rules never used: {sorted(granted() - used)}"


# The agent's modules call the API through kube.rest: a verb method of the client (or a
# list/watch helper) followed by the literal path it calls.
REST_CALL = re.compile(
    r"(_api\.(?:get|patch|create)|rest_watch|rest_paged_list)\b[^\n]*\n?(?:[^\n]*\n){0,3}?"
    r"[^\n]*?f?\"(/api/v1/[^\"]*)\""
)
REST_VERBS = {"_api.patch": "patch", "_api.create": "create", "rest_watch": "watch",
              "rest_paged_list": "list"}


def static_calls() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every REST call written in the agent's modules."""
    found: set[tuple[str, str, str]] = set()
    for path in KUBE_DIR.glob("*.py"):
        if path.name in EXTENDER_MODULES | WEBHOOK_MODULES | {"listwatch.py"}:
            continue  # the extender's (test above); the webhook's below
        for fn, url in REST_CALL.findall(path.read_text()):
            parts = [p for p in url.strip("/").split("/") if p][2:]
            if parts[:1] == ["namespaces"]:
                parts = parts[2:]
            named = len(parts) > 1
            verb = REST_VERBS.get(fn) or ("get" if named else "list")
            found.add(("", parts[0], verb))
    return found


# Modules used only by the scheduler extender, not by the node agent.
EXTENDER_MODULES = {"cluster_view.py", "binder.py", "view_objects.py", "view_trust.py",
                    "extender_rbac.py"}


def test_extender_calls_are_granted_by_extender_rules() -> None:
    """The cluster view (list+watch of nodes and pods, a missed pod's read) and the binder
    (annotate, bind) driven against a fake API server."""
    from gpu_share.kube.binder import KubeBinder
    from gpu_share.kube.cluster_view import KubeClusterView
    from gpu_share.kube.extender_rbac import EXTENDER_RULES
    from gpu_share.sharing.placement import Shape, Workload

    def handler(call: Call) -> Any:
        if call.query.get("watch") == "true":
            return FakeStream(block=False)
        if call.method == "GET" and "/pods/" in call.path:
            return 200, pod_obj("p")
        if call.method == "GET":
            return 200, {"metadata": {"resourceVersion": "5"}, "items": []}
        return 201, call.body

    api, http = fake_rest(handler)
    view = KubeClusterView(api, domain="vendor.com", memory_resource="vendor.com/vcuda-memory",
                           core_resource="vendor.com/vcuda-core",
                           default_workload=Workload([Shape(4, 25, 1.0)]),
                           decision_key=b"k" * 32)
    view.start()
    try:
        assert view.wait_synced(10)
    finally:
        view.stop()
    assert view.pod("ns", "p") is not None
    KubeBinder(api).annotate_and_bind("ns", "p", "uid-p", "node-a", {"k": "v"})
    used = {c.rbac() for c in http.calls}
    granted_ext = {(g, r, v) for g, r, verbs in EXTENDER_RULES for v in verbs}
    assert used <= granted_ext, f"not granted: {sorted(used - granted_ext)}"
    assert {("", "nodes", "list"), ("", "pods", "watch"), ("", "pods", "get"),
            ("", "pods", "patch"), ("", "bindings", "create")} <= used  # the fake saw them


def test_every_api_call_in_the_source_is_granted() -> None:
    calls = static_calls()
    # Sanity: the scan sees the calls we know are there (a broken regex would pass).
    assert {
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "nodes", "patch"),
        ("", "events", "create"),
        ("", "events", "patch"),
    } <= calls
    missing = calls - granted()
    assert not missing, f"API calls without an RBAC rule: {sorted(missing)}"


def test_rules_have_no_duplicates() -> None:
    seen: set[tuple[str, str, str]] = set()
    for group, resource, verbs in AGENT_RULES:
        for v in verbs:
            assert (group, resource, v) not in seen
            seen.add((group, resource, v))


# ---------------------------------------------------------------- the admission webhook

# Modules of the DRA admission webhook, not of the node agent: their calls are granted by
# claim_templates.WEBHOOK_RULES (the chart's webhook ClusterRole, tests/chart/test_webhook.py).
WEBHOOK_MODULES = {"claim_templates.py"}
WEBHOOK_VERBS = {"create": "create", "get": "get"}
# A call of the webhook's client on a path made by templates_path(namespace[, name]).
WEBHOOK_CALL = re.compile(
    r"_api\.(\w+)\((?:[^()]|\([^()]*\))*?(templates_path|namespace_path)\(([^()]*)\)"
)


def webhook_granted() -> set[tuple[str, str, str]]:
    return {(g, r, v) for g, r, verbs in WEBHOOK_RULES for v in verbs}


def _apis_rbac(call: Call) -> tuple[str, str, str]:
    """(apiGroup, resource, verb) of a request on an /api/v1/ or /apis/<group>/<version>/
    path."""
    parts = call.path.strip("/").split("/")
    assert parts[0] in ("api", "apis"), call.path
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        call.method
    )
    return (group, rest[0], verb or ("get" if len(rest) > 1 else "list"))


def test_webhook_calls_are_granted_by_webhook_rules_and_every_rule_is_used() -> None:
    """ClaimTemplates driven through both of its paths (a new template: create; one that
    exists: create answered 409, then get) and OptInNamespaces (get) against a fake API
    server."""
    settings = TranslationSettings(
        ResourceNames("vendor.com/vcuda-memory", "vendor.com/vcuda-core"), 1024
    )
    new, old = (template_body(ClaimShape(m, 10), "team-a", settings) for m in (1, 2))

    def handler(call: Call) -> Any:
        if call.method == "POST":
            if call.body["metadata"]["name"] == old["metadata"]["name"]:
                return 409, status_obj(409, "AlreadyExists", "exists")
            return 201, call.body
        return 200, old

    api, http = fake_rest(handler)
    templates = ClaimTemplates(api)
    assert templates.ensure(new) == "created"
    assert templates.ensure(old) == "exists"
    assert OptInNamespaces(api, "k", "v").opted_in("team-a") is False
    used = {_apis_rbac(c) for c in http.calls}
    assert used == webhook_granted(), f"used {sorted(used)}, granted {sorted(webhook_granted())}"


def test_every_api_call_in_the_webhook_source_is_granted() -> None:
    """Static: each call of the webhook's client in claim_templates.py, on the path of
    templates_path (named: get; unnamed: list; create) or namespace_path (get), is in
    WEBHOOK_RULES; every kube
    module that calls a /apis/ path is assigned to a component here."""
    from gpu_share.kube import claim_templates

    source = (KUBE_DIR / "claim_templates.py").read_text()
    calls = WEBHOOK_CALL.findall(source)
    assert {m for m, _, _ in calls} == {"create", "get"}, calls  # the scan sees both
    assert {p for _, p, _ in calls} == {"templates_path", "namespace_path"}, calls
    path = claim_templates.templates_path("ns")
    group = path.split("/")[2]
    resource = path.rsplit("/", 1)[1]
    found = set()
    for method, maker, args in calls:
        if maker == "namespace_path":  # one namespace by name
            found.add(("", "namespaces", WEBHOOK_VERBS[method]))
            continue
        named = args.count(",") >= 1
        verb = WEBHOOK_VERBS[method] if method != "get" else ("get" if named else "list")
        found.add((group, resource, verb))
    assert found <= webhook_granted(), sorted(found - webhook_granted())
    # Who owns each module calling a group API: a new one must be assigned a rule list.
    dra_agent = {"resourceslices.py", "resourceclaims.py"}
    for module in KUBE_DIR.glob("*.py"):
        if "/apis/" in module.read_text():
            assert module.name in WEBHOOK_MODULES | dra_agent, module.name
