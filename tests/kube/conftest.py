"""A real etcd + kube-apiserver on 127.0.0.1 for the ``apiserver`` tests (L3).

Binaries come from the build cache (hack/cluster/build.sh):
``${GPU_SHARE_CACHE:-~/.cache/gpu-share}/k8s-<version of hack/k8s/go.mod>/bin/kube-apiserver`` and
``etcd-v3.6.*/bin/etcd``; ``GPU_SHARE_KUBE_APISERVER`` / ``GPU_SHARE_ETCD`` override them.
Without them the tests are skipped with a loud reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kube_fakes import ApiServer, stop_fake_servers

from testkit.harness import K8S_VERSION
from testkit.process import stop_process

START_TIMEOUT_S = 90.0

# A one-context kubeconfig with a token user, ``{port}`` its server's port (and token).
KUBECONFIG = """
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}
users:
- name: u
  user: {{token: "tok-{port}"}}
contexts:
- name: ctx
  context: {{cluster: c, user: u}}
current-context: ctx
"""


def write_kubeconfig(tmp_path: Path, port: int, text: str = KUBECONFIG) -> str:
    """``text`` for ``port`` written under ``tmp_path``; its path."""
    p = tmp_path / f"kc-{port}"
    p.write_text(text.format(port=port))
    return str(p)


def _cache() -> Path:
    return Path(os.environ.get("GPU_SHARE_CACHE", str(Path.home() / ".cache" / "gpu-share")))


def find_binaries() -> tuple[Path | None, Path | None]:
    api = os.environ.get("GPU_SHARE_KUBE_APISERVER")
    etcd = os.environ.get("GPU_SHARE_ETCD")
    api_p = Path(api) if api else _cache() / f"k8s-{K8S_VERSION}" / "bin" / "kube-apiserver"
    if etcd:
        etcd_p: Path | None = Path(etcd)
    else:
        found = sorted(_cache().glob("etcd-v3.6.*/bin/etcd"))  # built by the test command
        etcd_p = found[-1] if found else None
    return (
        api_p if api_p.is_file() else None,
        etcd_p if etcd_p is not None and etcd_p.is_file() else None,
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_pki(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=d)
    _openssl(
        "req", "-x509", "-new", "-nodes", "-key", "ca.key", "-sha256", "-days", "2",
        "-subj", "/CN=gpu-share-test-ca", "-out", "ca.crt",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=d,
    )  # fmt: skip
    for name, subj, usage, san in (
        ("apiserver", "/CN=kube-apiserver", "serverAuth", "DNS:localhost,IP:127.0.0.1"),
        ("admin", "/O=system:masters/CN=test-admin", "clientAuth", ""),
    ):
        _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=d)
        _openssl("req", "-new", "-key", f"{name}.key", "-subj", subj, "-out", f"{name}.csr", cwd=d)
        ext = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={usage}",
        ]
        if san:
            ext.append(f"subjectAltName={san}")
        (d / f"{name}.ext").write_text("\n".join(ext) + "\n")
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-sha256", "-extfile", f"{name}.ext",
            "-out", f"{name}.crt",
            cwd=d,
        )  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _wait_http(
    url: str, proc: subprocess.Popen[bytes], log: Path, ctx: ssl.SSLContext | None = None
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    last = ""
    for _ in range(int(START_TIMEOUT_S / 0.2) + 1):
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited {proc.returncode}\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready in {START_TIMEOUT_S}s ({last})\n{_tail(log)}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    stop_process(proc, grace_s=15, kill_wait_s=15)


@pytest.fixture(autouse=True)
def _stop_loopback_servers() -> Iterator[None]:
    """The loopback API servers a test started (kube_fakes.fake_rest) end with it."""
    yield
    stop_fake_servers()


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    api_bin, etcd_bin = find_binaries()
    if api_bin is None or etcd_bin is None:
        msg = (
            "L3 SKIPPED (NOT RUN against a real API server): missing "
            + ", ".join(
                n
                for n, b in (
                    (f"kube-apiserver {K8S_VERSION}", api_bin),
                    ("etcd v3.6.x", etcd_bin),
                )
                if b is None
            )
            + f" under {_cache()} (build with hack/cluster/build.sh all)"
        )
        print(f"\n*** {msg} ***", file=sys.stderr)
        pytest.skip(msg)
    if shutil.which("openssl") is None:
        pytest.skip("L3 SKIPPED: openssl CLI missing (needed for test certificates)")

    root = tmp_path_factory.mktemp("apiserver")
    pki = root / "pki"
    _make_pki(pki)
    etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    etcd_log = root / "etcd.log"
    api_log = root / "kube-apiserver.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with etcd_log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        str(etcd_bin),
                        "--name=test",
                        f"--data-dir={root / 'etcd'}",
                        f"--listen-client-urls={etcd_url}",
                        f"--advertise-client-urls={etcd_url}",
                        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                        f"--initial-cluster=test=http://127.0.0.1:{peer_port}",
                        "--unsafe-no-fsync",
                        "--log-level=warn",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        _wait_http(f"{etcd_url}/health", procs[0], etcd_log)
        with api_log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        str(api_bin),
                        "--bind-address=127.0.0.1",
                        "--advertise-address=127.0.0.1",
                        f"--secure-port={api_port}",
                        f"--etcd-servers={etcd_url}",
                        "--endpoint-reconciler-type=none",
                        "--service-cluster-ip-range=10.0.0.0/24",
                        f"--tls-cert-file={pki / 'apiserver.crt'}",
                        f"--tls-private-key-file={pki / 'apiserver.key'}",
                        f"--client-ca-file={pki / 'ca.crt'}",
                        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                        f"--service-account-key-file={pki / 'sa.pub'}",
                        f"--service-account-signing-key-file={pki / 'sa.key'}",
                        "--api-audiences=https://kubernetes.default.svc.cluster.local",
                        "--authorization-mode=Node,RBAC",
                        # DRA mode: consumable capacity is alpha in 1.34.
                        "--feature-gates=DRAConsumableCapacity=true",
                        "--enable-priority-and-fairness=false",
                        "--profiling=false",
                        f"--cert-dir={root / 'certs'}",
                        "--v=1",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        url = f"https://127.0.0.1:{api_port}"
        _wait_http(f"{url}/readyz", procs[1], api_log, ctx)
        kubeconfig = root / "admin.kubeconfig"
        kubeconfig.write_text(
            f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: {url}
    certificate-authority: {pki / "ca.crt"}
users:
- name: admin
  user:
    client-certificate: {pki / "admin.crt"}
    client-key: {pki / "admin.key"}
contexts:
- name: test
  context: {{cluster: test, user: admin}}
current-context: test
"""
        )
        yield ApiServer(
            url=url, port=api_port, kubeconfig=str(kubeconfig), ca_file=str(pki / "ca.crt")
        )
    finally:
        for p in reversed(procs):
            _stop(p)
