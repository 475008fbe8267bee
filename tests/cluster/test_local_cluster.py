"""Smoke tests of the real local cluster (hack/local-up-cluster.sh).

Run with:  python -m pytest -m cluster tests/cluster -v
"""

from __future__ import annotations

import os
import ssl
import subprocess
import urllib.request
from pathlib import Path

import pytest

from testkit.harness import K8S_VERSION, REPO, wait_until
from tests.cluster.cluster_support import Cluster

pytestmark = pytest.mark.cluster

BUSYBOX = "localhost/busybox:local"


def test_node_ready_and_busybox_pod_logs(cluster: Cluster, namespace: str) -> None:
    node = cluster.get("node", cluster.node)
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready.get("Ready") == "True", node["status"]["conditions"]
    assert node["status"]["nodeInfo"]["kubeletVersion"] == K8S_VERSION

    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "hello", "namespace": namespace},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "hello",
                        "image": BUSYBOX,
                        "imagePullPolicy": "Never",
                        "command": [
                            "sh",
                            "-c",
                            "echo hello from $(hostname); ip -4 addr show eth0 | grep -c inet",
                        ],
                    }
                ],
            },
        }
    )
    pod = cluster.wait_pod_phase(namespace, "hello")
    assert pod["spec"]["nodeName"] == cluster.node
    logs = cluster.kubectl("-n", namespace, "logs", "hello").stdout
    assert "hello from hello" in logs, logs
    # The pod got an address on the cluster's bridge network.
    assert pod["status"].get("podIP", "").startswith("10."), pod["status"]


def test_hostnetwork_pod_reaches_apiserver_with_sa_token(cluster: Cluster, namespace: str) -> None:
    """The documented way for in-cluster clients: hostNetwork + 127.0.0.1:6443."""
    cluster.kubectl(
        "create",
        "rolebinding",
        "sa-view",
        "--clusterrole=view",
        f"--serviceaccount={namespace}:default",
        "-n",
        namespace,
    )
    script = (
        "TOKEN=$(cat /var/run/secrets/kubernetes.io/serviceaccount/token); "
        'wget -q -O - --no-check-certificate --header "Authorization: Bearer $TOKEN" '
        "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/"
        f"{namespace}/pods && echo; echo done"
    )
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "in-cluster", "namespace": namespace},
            "spec": {
                "restartPolicy": "Never",
                "hostNetwork": True,
                "containers": [
                    {
                        "name": "c",
                        "image": BUSYBOX,
                        "imagePullPolicy": "Never",
                        "env": [
                            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                            {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
                        ],
                        "command": ["sh", "-c", script],
                    }
                ],
            },
        }
    )
    cluster.wait_pod_phase(namespace, "in-cluster")
    logs = cluster.kubectl("-n", namespace, "logs", "in-cluster").stdout
    assert '"kind":"PodList"' in logs.replace(" ", ""), logs
    assert "in-cluster" in logs, logs


def scrape_kubelet_metrics(cluster: Cluster) -> str:
    ctx = ssl.create_default_context(cafile=cluster.env["CLUSTER_CA_CERT"])
    ctx.load_cert_chain(cluster.env["CLUSTER_ADMIN_CERT"], cluster.env["CLUSTER_ADMIN_KEY"])
    with urllib.request.urlopen(
        cluster.env["KUBELET_METRICS_URL"], context=ctx, timeout=30
    ) as resp:
        return resp.read().decode()


def test_kubelet_metrics_scrapable_with_admin_cert(cluster: Cluster) -> None:
    body = scrape_kubelet_metrics(cluster)
    assert "kubelet_running_pods" in body or "kubelet_node_name" in body


def test_pod_resources_socket_and_in_kubelet_ns(cluster: Cluster) -> None:
    sock = Path(cluster.env["POD_RESOURCES_SOCKET"])
    assert sock.is_socket(), f"{sock} is not a socket"
    # in-kubelet-ns.sh shows the cluster's kubelet paths at the default places.
    proc = subprocess.run(
        [
            str(REPO / "hack" / "cluster" / "in-kubelet-ns.sh"),
            "sh",
            "-c",
            "test -S /var/lib/kubelet/pod-resources/kubelet.sock && "
            "test -S /var/lib/kubelet/device-plugins/kubelet.sock && echo ok",
        ],
        env=dict(os.environ, KUBELET_ROOT_DIR=cluster.env["KUBELET_ROOT_DIR"]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_sample_device_plugin_registers_and_pod_gets_device(
    cluster: Cluster, namespace: str
) -> None:
    plugin = cluster.env["SAMPLE_DEVICE_PLUGIN"]
    assert os.access(plugin, os.X_OK), f"{plugin} was not built"
    dp_dir = Path(cluster.env["DEVICE_PLUGIN_DIR"])
    assert (dp_dir / "kubelet.sock").exists(), f"no kubelet.sock in {dp_dir}"

    # The kubelet's registration socket is always
    # /var/lib/kubelet/device-plugins/kubelet.sock (= DEVICE_PLUGIN_DIR), which
    # is also the sample plugin's default: run it as a plain host process.
    log_path = Path(cluster.env["CLUSTER_LOG_DIR"]) / "sample-device-plugin.log"
    env = dict(os.environ, PLUGIN_SOCK_DIR=str(dp_dir))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [plugin], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    cluster.processes.append(proc)
    try:
        allocatable: dict[str, str] = {}

        def advertised() -> bool:
            nonlocal allocatable
            assert proc.poll() is None, (
                f"sample-device-plugin exited:\n{log_path.read_text()[-3000:]}"
            )
            allocatable = cluster.get("node", cluster.node)["status"].get("allocatable", {})
            return allocatable.get("example.com/resource", "0") not in ("0", "")

        wait_until("example.com/resource advertised", advertised, 90, fail=False)
        assert allocatable.get("example.com/resource") == "2", (
            f"node allocatable: {allocatable}\nplugin log:\n{log_path.read_text()[-3000:]}\n"
            f"kubelet log:\n{cluster.log_tail('kubelet')}"
        )

        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "with-device", "namespace": namespace},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "c",
                            "image": BUSYBOX,
                            "imagePullPolicy": "Never",
                            # The plugin's Allocate mounts a fake device file /tmp/Dev-N.
                            "command": ["sh", "-c", "ls /tmp/ | grep Dev- && echo allocated"],
                            "resources": {"limits": {"example.com/resource": "1"}},
                        }
                    ],
                },
            }
        )
        cluster.wait_pod_phase(namespace, "with-device")
        logs = cluster.kubectl("-n", namespace, "logs", "with-device").stdout
        assert "allocated" in logs and "Dev-" in logs, logs
        # The device-plugin latency histograms a later benchmark relies on.
        metrics = scrape_kubelet_metrics(cluster)
        assert "kubelet_device_plugin_alloc_duration_seconds_bucket" in metrics
        assert (
            'kubelet_device_plugin_registration_total{resource_name="example.com/resource"}'
            in metrics
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
