"""L3: the API client (``kube.rest``, every component's) authenticates to a real
kube-apiserver in every mode it supports: client certificate + CA (files, or data in the
kubeconfig), a bearer token (in the kubeconfig, a token file, the in-cluster service
account) whose file is re-read when it rotates, tls-server-name; a wrong CA is refused,
insecure-skip-tls-verify is not; exec, auth-provider and basic auth are refused with a
clear error before any request."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_fakes import ApiServer
from kubernetes import client as k8s  # test-side setup only

from gpu_share.errors import KubeAccessError
from gpu_share.kube.rest import ApiError, RestClient, make_rest_client
from testkit.kube_admin import admin_client

pytestmark = pytest.mark.apiserver

SA_NS = "rest-auth"


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig(tmp_path: Path, server: str, cluster: str, user: str) -> str:
    p = tmp_path / f"kc-{uuid.uuid4().hex[:6]}"
    p.write_text(
        f"apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{server}', {cluster}}}}}]\n"
        f"users: [{{name: u, user: {{{user}}}}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    return str(p)


@pytest.fixture(scope="module")
def tokens(apiserver: ApiServer) -> Iterator[tuple[str, str]]:
    """Two valid tokens of a service account allowed to list the pods of SA_NS."""
    admin = admin_client(apiserver.kubeconfig)
    core: Any = k8s.CoreV1Api(admin)  # dict bodies: the stubs want models
    core.create_namespace({"metadata": {"name": SA_NS}})
    core.create_namespaced_service_account(SA_NS, {"metadata": {"name": "reader"}})
    rbac: Any = k8s.RbacAuthorizationV1Api(admin)
    # Its own Role: the built-in "view" is aggregated by a controller this server lacks.
    rbac.create_namespaced_role(SA_NS, {
        "metadata": {"name": "reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
    })
    rbac.create_namespaced_role_binding(SA_NS, {
        "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": SA_NS}],
    })

    def token() -> str:
        tr = core.create_namespaced_service_account_token(
            "reader", SA_NS, {"spec": {"expirationSeconds": 3600}})
        return str(tr.status.token)

    yield token(), token()


def can_list(api: RestClient) -> bool:
    """True when authenticated and authorized; False on 403 (RBAC still catching up)."""
    try:
        api.get("list pods", f"/api/v1/namespaces/{SA_NS}/pods")
    except ApiError as e:
        if e.status == 403:
            return False
        raise
    return True


def eventually(api: RestClient, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not can_list(api):
        assert time.monotonic() < deadline, "RBAC binding never took effect"
        time.sleep(0.1)


def test_client_certificate_and_ca_from_files(apiserver: ApiServer) -> None:
    api = make_rest_client(apiserver.kubeconfig)  # admin client cert, CA file
    got = api.get("get namespace", "/api/v1/namespaces/default")
    assert got["metadata"]["name"] == "default"


def test_client_certificate_and_ca_as_data(apiserver: ApiServer, tmp_path: Path) -> None:
    pki = Path(apiserver.ca_file).parent
    kc = kubeconfig(
        tmp_path, apiserver.url, f"certificate-authority-data: {b64(pki / 'ca.crt')}",
        f"client-certificate-data: {b64(pki / 'admin.crt')},"
        f" client-key-data: {b64(pki / 'admin.key')}",
    )
    assert make_rest_client(kc).get("get", "/api/v1/namespaces/default")["kind"] == "Namespace"
    # No temp copy of the key is left behind.
    assert not list(Path("/tmp").glob("gpu-share-tls-*"))


def test_wrong_ca_is_refused_and_skip_verify_is_not(apiserver: ApiServer, tmp_path: Path) -> None:
    pki = Path(apiserver.ca_file).parent
    user = f"client-certificate: {pki / 'admin.crt'}, client-key: {pki / 'admin.key'}"
    # The admin's certificate is no CA of the server's certificate.
    wrong = kubeconfig(tmp_path, apiserver.url, f"certificate-authority: {pki / 'admin.crt'}",
                       user)
    with pytest.raises(KubeAccessError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify"):
        make_rest_client(wrong).get("get", "/api/v1/namespaces/default")
    skip = kubeconfig(tmp_path, apiserver.url, "insecure-skip-tls-verify: true", user)
    assert make_rest_client(skip).get("get", "/api/v1/namespaces/default")


def test_bearer_token_in_kubeconfig(
    apiserver: ApiServer, tokens: tuple[str, str], tmp_path: Path
) -> None:
    ca = f"certificate-authority: {apiserver.ca_file}"
    api = make_rest_client(kubeconfig(tmp_path, apiserver.url, ca, f"token: {tokens[0]}"))
    eventually(api)
    bad = make_rest_client(kubeconfig(tmp_path, apiserver.url, ca, "token: not-a-token"))
    with pytest.raises(ApiError) as ei:
        bad.get("list pods", f"/api/v1/namespaces/{SA_NS}/pods")
    assert ei.value.status == 401 and ei.value.reason == "KubeForbidden"


def test_in_cluster_token_file_is_reread_when_it_rotates(
    apiserver: ApiServer, tokens: tuple[str, str], tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(tokens[0])
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(apiserver.port)}
    api = make_rest_client(environ=env, token_file=str(token), ca_file=apiserver.ca_file)
    eventually(api)
    # Rotated to a token the server refuses: the next request carries it.
    nxt = tmp_path / "next"
    nxt.write_text("revoked")
    nxt.replace(token)
    with pytest.raises(ApiError) as ei:
        api.get("list pods", f"/api/v1/namespaces/{SA_NS}/pods")
    assert ei.value.status == 401
    # ... and to a new valid token: the same client works again, no restart.
    nxt.write_text(tokens[1])
    nxt.replace(token)
    assert can_list(api)


def test_token_file_in_kubeconfig(
    apiserver: ApiServer, tokens: tuple[str, str], tmp_path: Path
) -> None:
    token = tmp_path / "tf"
    token.write_text(tokens[1] + "\n")
    kc = kubeconfig(tmp_path, apiserver.url, f"certificate-authority: {apiserver.ca_file}",
                    f"tokenFile: {token.name}")  # relative to the kubeconfig's directory
    eventually(make_rest_client(kc))


def test_tls_server_name_is_the_name_checked(apiserver: ApiServer, tmp_path: Path) -> None:
    """The server's certificate names localhost and 127.0.0.1: dialled at 127.0.0.1, the
    name checked is tls-server-name's."""
    pki = Path(apiserver.ca_file).parent
    user = f"client-certificate: {pki / 'admin.crt'}, client-key: {pki / 'admin.key'}"
    ca = f"certificate-authority: {apiserver.ca_file}"
    good = kubeconfig(tmp_path, apiserver.url, f"{ca}, tls-server-name: localhost", user)
    assert make_rest_client(good).get("get", "/api/v1/namespaces/default")["kind"] == "Namespace"
    bad = kubeconfig(tmp_path, apiserver.url, f"{ca}, tls-server-name: api.example", user)
    with pytest.raises(KubeAccessError, match=r"api\.example|CERTIFICATE_VERIFY_FAILED"):
        make_rest_client(bad).get("get", "/api/v1/namespaces/default")


@pytest.mark.parametrize("user", [
    "exec: {apiVersion: client.authentication.k8s.io/v1, command: gke-gcloud-auth-plugin}",
    "auth-provider: {name: oidc}",
    "username: admin, password: secret",
])
def test_an_unsupported_auth_form_is_refused_before_any_request(
    apiserver: ApiServer, tmp_path: Path, user: str
) -> None:
    kc = kubeconfig(tmp_path, apiserver.url, f"certificate-authority: {apiserver.ca_file}", user)
    with pytest.raises(KubeAccessError, match="not supported") as ei:
        make_rest_client(kc)
    assert ei.value.reason == "KubeConfigInvalid"


def test_a_host_name_is_dialled_and_checked_without_the_idna_codec(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    """Dialled at ``localhost`` (a name in the server's certificate): the request
    verifies, and the IDNA codec (0.4 MiB of stringprep and unicodedata) is never loaded
    for an ASCII name. In a fresh interpreter: this one may have loaded it already."""
    pki = Path(apiserver.ca_file).parent
    user = f"client-certificate: {pki / 'admin.crt'}, client-key: {pki / 'admin.key'}"
    url = apiserver.url.replace("127.0.0.1", "localhost")
    assert url != apiserver.url
    kc = kubeconfig(tmp_path, url, f"certificate-authority: {apiserver.ca_file}", user)
    code = (
        "import sys\n"
        "from gpu_share.kube.rest import make_rest_client\n"
        f"got = make_rest_client({kc!r}).get('get', '/api/v1/namespaces/default')\n"
        "print(got['kind'], 'encodings.idna' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["Namespace", "False"]
