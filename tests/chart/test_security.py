"""What the chart does to keep the extender, the annotations and the slice limits out of
tenants' reach: render checks with helm 3 and helm 4, and the
generated certificates tried in a real TLS handshake over loopback."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_share.agent.response import build
from gpu_share.config.model import DeviceListStrategy, EnforcementMode, RuntimeConfig
from gpu_share.devices.base import RuntimeNaming
from gpu_share.devices.dummy import VISIBLE_DEVICES_ENV as DUMMY_ENV
from gpu_share.devices.nvml import VISIBLE_DEVICES_ENV as NVML_ENV
from gpu_share.errors import AllocationError
from gpu_share.kube.extender_rbac import EXTENDER_RULES
from gpu_share.sharing.model import ContainerRef, ContainerRequest, DeviceShare
from gpu_share.sharing.node.ledger import EntrySource, LedgerEntry
from gpu_share.sharing.placement.pod_models import models_key
from tests.chart.conftest import (
    NAMESPACE,
    REPO,
    by_kind,
    helm_path,
    one,
    render,
    render_error,
    render_notes,
    tls_handshake,
)

SCHED = ["scheduler.enabled=true"]
SERVICE = [*SCHED, "scheduler.extender.mode=service"]
FN = "gs-gpu-share"
EXT_SVC = f"{FN}-extender"
NODE_POOLS = REPO / "values-examples" / "node-pools.yaml"


def _deployment(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return one(objs, "Deployment", name)


def _containers(dep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def _scheduler_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = one(objs, "ConfigMap", f"{FN}-scheduler")
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return cfg


def _names(objs: list[dict[str, Any]], kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in by_kind(objs, kind)}


def _binding_subjects(objs: list[dict[str, Any]], role: str) -> list[str]:
    (crb,) = [b for b in by_kind(objs, "ClusterRoleBinding") if b["roleRef"]["name"] == role]
    return [s["name"] for s in crb["subjects"]]


# ---------------------------------------------------------------- item 1: sidecar (default)


def test_sidecar_is_the_default_and_listens_on_loopback_only(helm: str) -> None:
    """Old chart: the extender listened on 0.0.0.0 behind a plain-HTTP Service anyone in
    the cluster could call. Now, by default, it is a container of the scheduler pod bound
    to 127.0.0.1, and no Service, Deployment or port exposes it."""
    objs = render(helm, sets=SCHED)
    assert f"{FN}-extender" not in _names(objs, "Deployment")
    assert f"{FN}-extender" not in _names(objs, "Service")
    assert not by_kind(objs, "NetworkPolicy")
    assert not [s for s in _names(objs, "Secret") if "tls" in s]
    pod = _deployment(objs, f"{FN}-scheduler")["spec"]["template"]["spec"]
    assert "hostNetwork" not in pod  # the pod's loopback is its own
    ext = _containers(_deployment(objs, f"{FN}-scheduler"))["extender"]
    assert "--listen=127.0.0.1:8888" in ext["args"]
    # The only listener off loopback is the read-only metrics one (GET /metrics, probes:
    # nothing there filters, scores or binds; tests/extender/test_metrics.py).
    assert not [a for a in ext["args"] if "insecure" in a]
    assert not [a for a in ext["args"] if "0.0.0.0" in a]
    # The metrics listener binds the pod's own address (downward API), not every interface.
    assert "--metrics-bind=$(POD_IP)" in ext["args"]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in ext[
        "env"
    ]
    assert ext["ports"] == [{"name": "metrics", "containerPort": 9402}]
    for probe, path in (("readinessProbe", "readyz"), ("livenessProbe", "healthz")):
        assert set(ext[probe]) - {"initialDelaySeconds", "periodSeconds", "timeoutSeconds"} == {
            "exec"
        }
        cmd = ext[probe]["exec"]["command"]
        assert cmd[:2] == ["gpu-share", "probe"] and cmd[-1] == f"http://127.0.0.1:8888/{path}"
    (extender,) = _scheduler_config(objs)["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:8888"
    assert extender["enableHTTPS"] is False
    mounts = {m["name"]: m["mountPath"] for m in ext["volumeMounts"]}
    assert mounts == {"decision-key": "/etc/gpu-share-decision"}


def test_sidecar_pod_holds_the_scheduler_and_the_extender_rbac(helm: str) -> None:
    objs = render(helm, sets=SCHED)
    sa = f"{FN}-scheduler"
    assert _deployment(objs, sa)["spec"]["template"]["spec"]["serviceAccountName"] == sa
    assert _names(objs, "ServiceAccount") == {FN, sa}  # agent + scheduler, no extender SA
    role = one(objs, "ClusterRole", "-extender")
    got = [(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in role["rules"]]
    assert got == list(EXTENDER_RULES)
    assert _binding_subjects(objs, role["metadata"]["name"]) == [sa]
    assert _binding_subjects(objs, "system:kube-scheduler") == [sa]
    assert _binding_subjects(objs, "system:volume-scheduler") == [sa]


@pytest.mark.parametrize("mode", ["sidecar", "service"])
def test_extender_limits_reach_its_flags(mode: str) -> None:
    objs = render(
        helm_path(4),
        sets=[
            *SCHED,
            f"scheduler.extender.mode={mode}",
            "scheduler.extender.maxBodyBytes=1048576",
            "scheduler.extender.readTimeoutSeconds=7",
            "scheduler.extender.idleTimeoutSeconds=30",
            "scheduler.extender.workers=4",
        ],
    )
    dep = f"{FN}-scheduler" if mode == "sidecar" else f"{FN}-extender"
    args = _containers(_deployment(objs, dep))["extender"]["args"]
    for flag in (
        "--max-body-bytes=1048576",
        "--read-timeout-seconds=7",
        "--idle-timeout-seconds=30",
        "--workers=4",
    ):
        assert flag in args, args


def test_sidecar_needs_a_scheduler_replica() -> None:
    err = render_error(helm_path(4), sets=[*SCHED, "scheduler.replicas=0"])
    assert "scheduler.replicas: 0 needs scheduler.extender.mode=service" in err, err


# ---------------------------------------------------------------- item 1: service mode


def _secret_data(objs: list[dict[str, Any]], name: str) -> dict[str, bytes]:
    sec = one(objs, "Secret", name)
    assert sec["type"] == "kubernetes.io/tls"
    return {k: base64.b64decode(v) for k, v in sec["data"].items()}


def test_service_mode_wires_mutual_tls(helm: str) -> None:
    objs = render(helm, sets=SERVICE)
    server = _secret_data(objs, f"{FN}-extender-server-tls")
    client = _secret_data(objs, f"{FN}-extender-client-tls")
    assert set(server) == set(client) == {"tls.crt", "tls.key", "ca.crt"}
    assert server["ca.crt"] == client["ca.crt"]  # one CA signs both ends

    ext_dep = _deployment(objs, f"{FN}-extender")
    ext = _containers(ext_dep)["extender"]
    args = ext["args"]
    assert "--listen=0.0.0.0:8888" in args
    assert "--tls-cert-file=/etc/gpu-share-extender-tls/tls.crt" in args
    assert "--tls-key-file=/etc/gpu-share-extender-tls/tls.key" in args
    assert "--client-ca-file=/etc/gpu-share-extender-tls/ca.crt" in args
    assert not [a for a in args if "insecure" in a]
    vols = {v["name"]: v for v in ext_dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["extender-tls"]["secret"]["secretName"] == f"{FN}-extender-server-tls"
    assert {
        "name": "extender-tls",
        "mountPath": "/etc/gpu-share-extender-tls",
        "readOnly": True,
    } in (ext["volumeMounts"])
    # TLS with a required client certificate: the probes only open a TCP connection.
    assert ext["readinessProbe"]["tcpSocket"] == {"port": "https"}
    assert ext["livenessProbe"]["tcpSocket"] == {"port": "https"}
    assert ext_dep["spec"]["template"]["spec"]["serviceAccountName"] == f"{FN}-extender"

    (cfg,) = _scheduler_config(objs)["extenders"]
    assert cfg["urlPrefix"] == f"https://{EXT_SVC}.{NAMESPACE}.svc:8888"
    assert cfg["enableHTTPS"] is True
    assert cfg["tlsConfig"] == {
        "insecure": False,
        "certFile": "/etc/gpu-share-extender-client/tls.crt",
        "keyFile": "/etc/gpu-share-extender-client/tls.key",
        "caFile": "/etc/gpu-share-extender-client/ca.crt",
    }
    sched_dep = _deployment(objs, f"{FN}-scheduler")
    sched = _containers(sched_dep)["kube-scheduler"]
    assert {
        "name": "extender-client-tls",
        "mountPath": "/etc/gpu-share-extender-client",
        "readOnly": True,
    } in sched["volumeMounts"]
    svols = {v["name"]: v for v in sched_dep["spec"]["template"]["spec"]["volumes"]}
    assert svols["extender-client-tls"]["secret"]["secretName"] == f"{FN}-extender-client-tls"
    assert "extender" not in _containers(sched_dep)
    # New certificates roll both sides.
    sums = {
        d["spec"]["template"]["metadata"]["annotations"]["checksum/extender-tls"]
        for d in (ext_dep, sched_dep)
    }
    assert len(sums) == 1
    svc = one(objs, "Service", EXT_SVC)
    assert svc["spec"]["ports"] == [{"name": "https", "port": 8888, "targetPort": "https"}]
    assert _binding_subjects(objs, one(objs, "ClusterRole", "-extender")["metadata"]["name"]) == [
        f"{FN}-extender"
    ]


def test_service_mode_without_our_scheduler() -> None:
    objs = render(helm_path(4), sets=[*SERVICE, "scheduler.replicas=0"])
    assert _names(objs, "Deployment") == {f"{FN}-extender"}
    assert f"{FN}-scheduler" not in _names(objs, "ServiceAccount")
    assert one(objs, "Secret", "-extender-client-tls")  # for the operator's scheduler


def test_existing_tls_secrets_are_used(helm: str) -> None:
    objs = render(
        helm,
        sets=[
            *SERVICE,
            "scheduler.extender.tls.existingServerSecret=cm-server",
            "scheduler.extender.tls.existingClientSecret=cm-client",
        ],
    )
    assert not [s for s in _names(objs, "Secret") if "tls" in s]
    ext_vols = _deployment(objs, f"{FN}-extender")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "extender-tls", "secret": {"secretName": "cm-server"}} in ext_vols
    sched_vols = _deployment(objs, f"{FN}-scheduler")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "extender-client-tls", "secret": {"secretName": "cm-client"}} in sched_vols


def test_one_existing_tls_secret_alone_fails() -> None:
    err = render_error(
        helm_path(4), sets=[*SERVICE, "scheduler.extender.tls.existingServerSecret=x"]
    )
    assert "set both existingServerSecret and existingClientSecret" in err, err


def _write_dir(d: Path, data: dict[str, bytes]) -> dict[str, str]:
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for k, v in data.items():
        (d / k).write_bytes(v)
        out[k] = str(d / k)
    return out


def _binary_plan(args: list[str], mounts: dict[str, Path]) -> Any:
    """What gpu-share-extender makes of the rendered args (the mounted paths mapped to
    local dirs): its Serving plan, or the UsageError it would exit 2 with."""
    from gpu_share.cli.extender_main import UsageError, parse_args, serving

    mapped = []
    for a in args:
        for mount, local in mounts.items():
            a = a.replace(mount, str(local))
        mapped.append(a)
    try:
        return serving(parse_args(mapped))
    except UsageError as e:
        return e


def _handshake(
    sctx: ssl.SSLContext, client: dict[str, str] | None, ca: str, hostname: str
) -> str:
    """One TLS connection over loopback to a server with context ``sctx``, the client
    trusting ``ca`` and presenting ``client``'s certificate if given; "ok" or the errors."""
    cctx = ssl.create_default_context(cafile=ca)
    if client is not None:
        cctx.load_cert_chain(client["tls.crt"], client["tls.key"])
    return tls_handshake(sctx, cctx, hostname)


def test_rendered_flags_make_the_binary_require_client_certificates(tmp_path: Path) -> None:
    """The extender's rendered args, parsed by gpu-share-extender itself with the chart's
    generated files: mutual TLS in service mode, and its TLS context in a real handshake
    accepts the scheduler's client certificate for every Service DNS name; no certificate,
    one from another release's CA, or a name outside the certificate is refused."""
    objs = render(helm_path(4), sets=SERVICE)
    server_dir = tmp_path / "server"
    _write_dir(server_dir, _secret_data(objs, f"{FN}-extender-server-tls"))
    client = _write_dir(tmp_path / "client", _secret_data(objs, f"{FN}-extender-client-tls"))
    args = _containers(_deployment(objs, f"{FN}-extender"))["extender"]["args"]
    plan = _binary_plan(args, {"/etc/gpu-share-extender-tls": server_dir})
    assert not isinstance(plan, Exception), plan
    assert plan.mutual_tls and plan.tls is not None and plan.host == "0.0.0.0"
    ns = NAMESPACE
    for host in (f"{EXT_SVC}.{ns}.svc", f"{EXT_SVC}.{ns}", f"{EXT_SVC}.{ns}.svc.cluster.local"):
        assert _handshake(plan.tls, client, client["ca.crt"], host) == "ok", host
    assert "certificate" in _handshake(plan.tls, None, client["ca.crt"], f"{EXT_SVC}.{ns}.svc")
    # Another render generates another CA: its client certificate is a stranger.
    other = render(helm_path(3), sets=SERVICE)
    stranger = _write_dir(tmp_path / "x", _secret_data(other, f"{FN}-extender-client-tls"))
    assert Path(stranger["ca.crt"]).read_bytes() != Path(client["ca.crt"]).read_bytes()
    assert _handshake(plan.tls, stranger, client["ca.crt"], f"{EXT_SVC}.{ns}.svc") != "ok"
    assert _handshake(plan.tls, client, client["ca.crt"], "evil.example.com") != "ok"
    # Without the TLS flags the same listen address is refused by the binary.
    bare = [a for a in args if not a.startswith(("--tls-", "--client-ca-file"))]
    assert "without mutual TLS" in str(_binary_plan(bare, {}))


HOST_SIDECAR = [*SCHED, "scheduler.hostNetwork=true"]


def test_host_network_sidecar_takes_mutual_tls(tmp_path: Path) -> None:
    """In the host network the pod's 127.0.0.1 is the node's: any process or host-network
    pod there could call /bind over plain HTTP. The sidecar then takes mutual TLS as in
    service mode: the binary, given the rendered args and the chart's generated files,
    accepts only the scheduler's client certificate, for the name the scheduler's config
    checks; the scheduler and the probes present that certificate."""
    objs = render(helm_path(4), sets=HOST_SIDECAR)
    dep = _deployment(objs, f"{FN}-scheduler")
    assert dep["spec"]["template"]["spec"]["hostNetwork"] is True
    ext = _containers(dep)["extender"]
    server_dir = tmp_path / "server"
    _write_dir(server_dir, _secret_data(objs, f"{FN}-extender-server-tls"))
    client = _write_dir(tmp_path / "client", _secret_data(objs, f"{FN}-extender-client-tls"))
    plan = _binary_plan(ext["args"], {"/etc/gpu-share-extender-tls": server_dir})
    assert not isinstance(plan, Exception), plan
    assert plan.mutual_tls and plan.tls is not None
    assert (plan.host, plan.port) == ("127.0.0.1", 8888)

    (cfg,) = _scheduler_config(objs)["extenders"]
    name = f"{EXT_SVC}.{NAMESPACE}.svc"
    assert cfg["urlPrefix"] == "https://127.0.0.1:8888" and cfg["enableHTTPS"] is True
    assert cfg["tlsConfig"] == {
        "insecure": False,
        "serverName": name,
        "certFile": "/etc/gpu-share-extender-client/tls.crt",
        "keyFile": "/etc/gpu-share-extender-client/tls.key",
        "caFile": "/etc/gpu-share-extender-client/ca.crt",
    }
    assert _handshake(plan.tls, client, client["ca.crt"], name) == "ok"
    assert "certificate" in _handshake(plan.tls, None, client["ca.crt"], name)

    sched = _containers(dep)["kube-scheduler"]
    tls_mount = {
        "name": "extender-client-tls",
        "mountPath": "/etc/gpu-share-extender-client",
        "readOnly": True,
    }
    assert tls_mount in sched["volumeMounts"] and tls_mount in ext["volumeMounts"]
    for probe, path in (("readinessProbe", "readyz"), ("livenessProbe", "healthz")):
        cmd = ext[probe]["exec"]["command"]
        assert cmd[-1] == f"https://127.0.0.1:8888/{path}", cmd
        opts = dict(zip(cmd[4:-1:2], cmd[5:-1:2], strict=True))
        assert opts == {
            "--cert": "/etc/gpu-share-extender-client/tls.crt",
            "--key": "/etc/gpu-share-extender-client/tls.key",
            "--ca": "/etc/gpu-share-extender-client/ca.crt",
            "--server-name": name,
        }
    # Metrics: the node's address (the pod's IP in the host network), not 0.0.0.0.
    assert "--metrics-bind=$(POD_IP)" in ext["args"]


def test_rendered_sidecar_flags_serve_loopback_without_tls() -> None:
    objs = render(helm_path(4), sets=SCHED)
    args = _containers(_deployment(objs, f"{FN}-scheduler"))["extender"]["args"]
    plan = _binary_plan(args, {})
    assert not isinstance(plan, Exception), plan
    assert (plan.host, plan.port, plan.tls) == ("127.0.0.1", 8888, None)
    assert plan.limits.max_body_bytes == 4 * 1024 * 1024


def test_extender_network_policy_admits_only_the_scheduler(helm: str) -> None:
    extra = {"ipBlock": {"cidr": "10.0.0.0/28"}}
    objs = render(
        helm,
        sets=[*SERVICE, 'json:scheduler.extender.networkPolicy.extraFrom=[{"ipBlock":'
              '{"cidr":"10.0.0.0/28"}}]'],
    )  # fmt: skip
    (np,) = by_kind(objs, "NetworkPolicy")
    spec = np["spec"]
    ext_labels = _deployment(objs, f"{FN}-extender")["spec"]["template"]["metadata"]["labels"]
    sched_labels = _deployment(objs, f"{FN}-scheduler")["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= ext_labels.items()
    assert not spec["podSelector"]["matchLabels"].items() <= sched_labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    rule, metrics = spec["ingress"]
    assert rule["ports"] == [{"port": 8888, "protocol": "TCP"}]
    # The read-only metrics port: any source (metrics.networkPolicy off), that port only.
    assert metrics == {"ports": [{"port": 9402, "protocol": "TCP"}]}
    first, *rest = rule["from"]
    assert set(first) == {"podSelector"}
    assert first["podSelector"]["matchLabels"].items() <= sched_labels.items()
    assert not first["podSelector"]["matchLabels"].items() <= ext_labels.items()
    assert rest == [extra]
    off = render(helm, sets=[*SERVICE, "scheduler.extender.networkPolicy.enabled=false"])
    assert not by_kind(off, "NetworkPolicy")


def test_metrics_network_policy_is_opt_in() -> None:
    helm = helm_path(4)
    assert not by_kind(render(helm, [NODE_POOLS]), "NetworkPolicy")
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    objs = render(
        helm,
        [NODE_POOLS],
        sets=[
            "metrics.networkPolicy.enabled=true",
            'json:metrics.networkPolicy.from=[{"namespaceSelector":{"matchLabels":'
            '{"kubernetes.io/metadata.name":"monitoring"}}}]',
        ],
    )
    agents = [d for d in by_kind(objs, "DaemonSet") if not d["metadata"]["name"].endswith("-mps")]
    pols = by_kind(objs, "NetworkPolicy")
    assert len(pols) == len(agents) == 3
    tests = {p["metadata"]["name"]: p for p in by_kind(objs, "Pod")}
    for ds in agents:
        labels = ds["spec"]["template"]["metadata"]["labels"]
        (pol,) = [
            p for p in pols if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        ]
        cfg_port = next(
            c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"
        )["ports"][0]["containerPort"]
        (rule,) = pol["spec"]["ingress"]
        assert rule["ports"] == [{"port": cfg_port, "protocol": "TCP"}]
        test_sel, user = rule["from"]
        assert user == peer
        test_pod = tests[ds["metadata"]["name"] + "-test"]
        assert (
            test_sel["podSelector"]["matchLabels"].items() <= test_pod["metadata"]["labels"].items()
        )


# ---------------------------------------------------------------- item 8: annotations


def _policy(objs: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    vap = one(objs, "ValidatingAdmissionPolicy", suffix)
    binding = one(objs, "ValidatingAdmissionPolicyBinding", suffix)
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    assert vap["spec"]["failurePolicy"] == "Fail"
    spec: dict[str, Any] = vap["spec"]
    return spec


def _var(spec: dict[str, Any], name: str) -> str:
    expr: str = next(v["expression"] for v in spec["variables"] if v["name"] == name)
    return expr


@pytest.mark.parametrize(
    ("sets", "writers"),
    [
        ([], ["gs-gpu-share"]),
        (SCHED, ["gs-gpu-share", "gs-gpu-share-scheduler"]),
        (SERVICE, ["gs-gpu-share", "gs-gpu-share-extender"]),
    ],
    ids=["agent-only", "sidecar", "service"],
)
def test_annotation_policy_reserves_the_prefix_for_agent_and_extender(
    helm: str, sets: list[str], writers: list[str]
) -> None:
    spec = _policy(render(helm, sets=sets), "-annotations")
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["pods", "pods/*", "bindings", "nodes", "nodes/*"],
        }
    ]
    (cond,) = spec["matchConditions"]
    users = [f"system:serviceaccount:{NAMESPACE}:{w}" for w in writers]
    assert cond["expression"] == f"!(request.userInfo.username in {_json(users)})"
    assert _var(spec, "prefixes") == '["gpu-share.vendor.com/"]'
    # Pod authors write the GPU models their pod accepts (sharing/placement/pod_models.py).
    assert _var(spec, "tenantKeys") == f'["{models_key("vendor.com")}"]'
    (validation,) = spec["validations"]
    assert validation["expression"] == "size(variables.touched) == 0"
    assert validation["reason"] == "Forbidden"


def _json(v: Any) -> str:
    import json

    return json.dumps(v, separators=(",", ":"))


def test_annotation_policy_covers_every_pool_domain_and_extra_writers() -> None:
    pools = (
        '[{"name":"a","nodeSelector":{"p":"a"}},'
        '{"name":"b","nodeSelector":{"p":"b"},"agentConfig":{"resources":{"domain":"b.example"}}}]'
    )
    spec = _policy(
        render(
            helm_path(4),
            sets=[f"json:nodePools={pools}", 'json:admissionPolicy.extraAnnotationWriters=["ops"]'],
        ),
        "-annotations",
    )
    assert _var(spec, "prefixes") == '["gpu-share.vendor.com/","gpu-share.b.example/"]'
    assert _var(spec, "tenantKeys") == (
        f'["{models_key("vendor.com")}","{models_key("b.example")}"]'
    )
    assert '"ops"]' in spec["matchConditions"][0]["expression"]


# ---------------------------------------------------------------- item 9: env and cores


def _agent_env_names() -> set[str]:
    """Every env name build hands out, over modes, strategies and backends."""
    from gpu_share.devices.base import Device

    dev = Device(uuid="GPU-0", index=0, minor=0, memory_mib=8192, model="m")
    names: set[str] = set()
    for env in (NVML_ENV, DUMMY_ENV):
        naming = RuntimeNaming(env)
        for mode in EnforcementMode:
            for strategy in DeviceListStrategy:
                for mem, cores in ((2, 30), (2, 0), (0, 100), (0, 30)):
                    entry = LedgerEntry(
                        ref=ContainerRef("ns", "p", "c", "uid"),
                        request=ContainerRequest(mem, cores),
                        shares=(DeviceShare("GPU-0", mem, cores, exclusive=cores >= 100),),
                        source=EntrySource.NODE_AGENT,
                        created_at=0.0,
                        updated_at=0.0,
                    )
                    rt = RuntimeConfig(enforcement=mode, device_list_strategy=[strategy])
                    try:
                        spec = build(entry, ({"GPU-0": dev}).get, naming, rt, 1024)
                    except AllocationError:  # a shared cores-only slice under enforcement
                        continue
                    names |= set(spec.envs)
    return names


def _reserved(spec: dict[str, Any]) -> tuple[list[str], list[str]]:
    return yaml.safe_load(_var(spec, "reservedNames")), yaml.safe_load(
        _var(spec, "reservedPrefixes")
    )


def test_every_env_the_agent_sets_is_reserved() -> None:
    names, prefixes = _reserved(_policy(render(helm_path(4)), "-workloads"))
    agent = _agent_env_names()
    assert {"NVIDIA_VISIBLE_DEVICES", "DUMMY_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY"} <= agent
    assert {"CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT"} <= agent
    unreserved = {n for n in agent if n not in names and not any(n.startswith(p) for p in prefixes)}
    assert not unreserved, f"env the agent sets but a pod could override: {sorted(unreserved)}"
    # And the knobs that lift a limit without being set by the agent.
    for n in (
        "CUDA_DEVICE_MEMORY_LIMIT",
        "LD_PRELOAD",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DISABLE_CONTROL",
        "GPU_CORE_UTILIZATION_POLICY",
        "CUDA_OVERSUBSCRIBE",
    ):
        assert n in names, n
    assert {"CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_MPS_", "GPU_SHARE_"} <= set(prefixes)


def test_workload_policy_matches_pods_requesting_our_resources(helm: str) -> None:
    spec = _policy(render(helm), "-workloads")
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["pods/ephemeralcontainers"],
        },
    ]
    (cond,) = spec["matchConditions"]
    assert cond["expression"].count('["vendor.com/vcuda-memory","vendor.com/vcuda-core"]') == 2
    assert "initContainers" in cond["expression"]
    checks = [v["expression"] for v in spec["validations"]]
    assert checks == [
        "size(variables.badEnv) == 0",
        "size(variables.badEphemeralEnv) == 0",
        "size(variables.badEnvFrom) == 0",
        "size(variables.badEphemeralEnvFrom) == 0",
    ]  # enforcement none: cores-only containers are allowed


@pytest.mark.parametrize(
    ("sets", "values", "refused"),
    [
        ([], (), False),
        (["agentConfig.runtime.enforcement=mps"], (), True),
        (["agentConfig.runtime.enforcement=hami-core"], (), True),
        ([], (NODE_POOLS,), True),  # one pool of three enforces (mps)
        (["admissionPolicy.refuseCoresOnly=always"], (), True),
        (
            ["agentConfig.runtime.enforcement=mps", "admissionPolicy.refuseCoresOnly=never"],
            (),
            False,
        ),
    ],
    ids=["none", "mps", "hami-core", "mixed-pools", "always", "never"],
)
def test_cores_only_refused_where_limits_are_enforced(
    sets: list[str], values: tuple[Path, ...], refused: bool
) -> None:
    spec = _policy(render(helm_path(4), values, sets=sets), "-workloads")
    checks = [v["expression"] for v in spec["validations"]]
    assert ("size(variables.coresOnly) == 0" in checks) is refused
    if refused:
        expr = _var(spec, "coresOnly")
        assert '["vendor.com/vcuda-core"]' in expr and '["vendor.com/vcuda-memory"]' in expr


def test_extra_reserved_env_and_unprefixed_env_from_opt_out() -> None:
    spec = _policy(
        render(
            helm_path(4),
            sets=[
                'json:admissionPolicy.reservedEnv.extraNames=["MY_LIMIT"]',
                'json:admissionPolicy.reservedEnv.extraPrefixes=["MY_"]',
                "admissionPolicy.reservedEnv.allowUnprefixedEnvFrom=true",
            ],
        ),
        "-workloads",
    )
    names, prefixes = _reserved(spec)
    assert names[-1] == "MY_LIMIT" and prefixes[-1] == "MY_"
    assert not [v for v in spec["variables"] if "EnvFrom" in v["name"]]
    assert len(spec["validations"]) == 2


# ---------------------------------------------------------------- item 13: below 1.30


@pytest.mark.parametrize("vap", [True, False], ids=["api-listed", "api-absent"])
def test_below_1_30_rendering_fails_unless_opted_out(helm: str, vap: bool) -> None:
    """Old chart: on 1.29 the policies were silently left out and the install succeeded,
    unprotected. Now the render fails and names the opt-out."""
    err = render_error(helm, kube="1.29.0", vap=vap)
    assert "needs 1.30+" in err and "admissionPolicy.allowUnprotected=true" in err, err
    objs = render(helm, sets=["admissionPolicy.allowUnprotected=true"], kube="1.29.0", vap=vap)
    assert not by_kind(objs, "ValidatingAdmissionPolicy")
    assert by_kind(objs, "DaemonSet")


def test_notes_warn_loudly_when_unprotected(helm: str, tmp_path: Path) -> None:
    quiet = render_notes(helm, tmp_path, kube="1.30.0")
    assert "WARNING" not in quiet
    opted = render_notes(helm, tmp_path, ["admissionPolicy.allowUnprotected=true"], "1.29.0")
    off = render_notes(helm, tmp_path, ["admissionPolicy.enabled=false"], "1.34.0")
    for notes, why in ((opted, "< 1.30, admissionPolicy.allowUnprotected=true"),
                       (off, "admissionPolicy.enabled=false")):  # fmt: skip
        assert "WARNING: NO ADMISSION POLICY" in notes
        assert why in notes
        assert "LIFT the GPU limits" in notes and "FORGE gpu-share.* annotations" in notes


def test_notes_name_the_extender_mode(tmp_path: Path) -> None:
    helm = helm_path(4)
    assert "127.0.0.1:8888 (sidecar mode)" in render_notes(helm, tmp_path, SCHED)
    notes = render_notes(helm, tmp_path, SERVICE)
    assert "client certificate in Secret gs-gpu-share-extender-client-tls" in notes


# ---------------------------------------------------------------- schema


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["scheduler.extender.mode=public"], ["mode", "sidecar"]),
        (["admissionPolicy.refuseCoresOnly=maybe"], ["refuseCoresOnly"]),
        (["admissionPolicy.allowUnprotectd=true"], ["allowUnprotectd"]),
        (["scheduler.extender.tls.caFile=x"], ["caFile"]),
        (["scheduler.extender.maxBodyBytes=10"], ["maxBodyBytes"]),
        (["scheduler.extender.workers=0"], ["workers"]),
        (['json:scheduler.extender.networkPolicy.extraFrom=[{"pods":{}}]'], ["pods"]),
        (["json:metrics.networkPolicy.from=[{}]"], ["from"]),
        (['json:admissionPolicy.reservedEnv.extraNames=["A=B"]'], ["extraNames"]),
    ],
    ids=[
        "mode-enum",
        "cores-only-enum",
        "typo",
        "unknown-tls-key",
        "tiny-body-cap",
        "no-workers",
        "unknown-peer-key",
        "empty-peer",
        "bad-env-name",
    ],
)
def test_bad_security_values_fail_naming_the_key(sets: list[str], expected: list[str]) -> None:
    err = render_error(helm_path(4), sets=sets)
    assert "values don't meet the specifications of the schema" in err, err
    for text in expected:
        assert text in err, err


@pytest.mark.parametrize("minor", ["1.30", "1.35"])
def test_security_objects_match_kubernetes_schema(minor: str) -> None:
    """What no values example turns on: both NetworkPolicies with peers, existing and
    generated TLS Secrets, every policy option."""
    from tests.chart.conftest import k8s_validator

    variants = [
        [
            *SERVICE,
            "metrics.networkPolicy.enabled=true",
            'json:metrics.networkPolicy.from=[{"podSelector":{"matchLabels":{"a":"b"}}}]',
            'json:scheduler.extender.networkPolicy.extraFrom=[{"ipBlock":{"cidr":"10.0.0.0/8"}}]',
            "admissionPolicy.refuseCoresOnly=always",
            'json:admissionPolicy.extraAnnotationWriters=["ops"]',
        ],
        [
            *SERVICE,
            "scheduler.extender.tls.existingServerSecret=a",
            "scheduler.extender.tls.existingClientSecret=b",
            "admissionPolicy.reservedEnv.allowUnprefixedEnvFrom=true",
        ],
    ]
    for sets in variants:
        for obj in render(helm_path(4), sets=sets, kube=f"{minor}.0"):
            errors = list(k8s_validator(minor, obj["apiVersion"], obj["kind"]).iter_errors(obj))
            assert not errors, (obj["kind"], obj["metadata"]["name"], errors[0].message)
