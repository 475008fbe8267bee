"""API clients for tests.

- ``admin_client``: a generated ``kubernetes`` client for the tests' own setup and checks
  (namespaces, RBAC, admission objects, typed reads), configured by the product's one
  loader (``kube.rest_config``). Test-side only: gpu_share never imports ``kubernetes``;
  the code under test gets a ``kube.rest.RestClient``.
  ``client_for`` makes one for any ``RestConfig`` (a service account's, say);
  ``admin_apis`` the admin's core, RBAC and admission APIs.
- ``allowed``: whether a call of such a client gets through or is refused (403).
- ``idle_api``: a ``RestClient`` for code under test that must never call it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_share.kube.rest import RestClient
from gpu_share.kube.rest_config import RestConfig, load_rest_config

if TYPE_CHECKING:
    from kubernetes import client as k8s


def idle_api() -> RestClient:
    """A client of a port nothing listens on (calls fail at once)."""
    return RestClient(RestConfig(server="http://127.0.0.1:9"))


_INLINE_DIR: list[str] = []  # one private dir per process, removed at exit


def _as_file(data: bytes | None, name: str) -> str | None:
    """Inline kubeconfig data as a 0600 file in a 0700 temporary dir, or None."""
    if not data:
        return None
    if not _INLINE_DIR:
        d = tempfile.mkdtemp(prefix="gpu-share-admin-")
        atexit.register(shutil.rmtree, d, True)
        _INLINE_DIR.append(d)
    fd, path = tempfile.mkstemp(prefix=name, dir=_INLINE_DIR[0])
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


def admin_client(kubeconfig: str | None = None, *, context: str | None = None) -> k8s.ApiClient:
    """An ApiClient for the kubeconfig (and context) as ``load_rest_config`` reads it."""
    return client_for(load_rest_config(kubeconfig, context=context))


@dataclass(frozen=True)
class AdminApis:
    """The generated APIs a test's setup uses, as the admin."""

    core: Any  # CoreV1Api
    rbac: Any  # RbacAuthorizationV1Api
    admission: Any  # AdmissionregistrationV1Api


def admin_apis(kubeconfig: str) -> AdminApis:
    from kubernetes import client as k8s

    api = admin_client(kubeconfig)
    return AdminApis(
        k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api), k8s.AdmissionregistrationV1Api(api)
    )


def client_for(cfg: RestConfig) -> k8s.ApiClient:
    """An ApiClient for ``cfg`` (inline certificate data is written to private files for
    the process's life: the generated client reads files; a token file is read once)."""
    from kubernetes import client as k8s  # imported here: idle_api needs none

    c: Any = k8s.Configuration()
    c.host = cfg.server
    c.verify_ssl = not cfg.insecure
    c.ssl_ca_cert = _as_file(cfg.ca_data, "ca.crt") or cfg.ca_file
    c.cert_file = _as_file(cfg.cert_data, "client.crt") or cfg.cert_file
    c.key_file = _as_file(cfg.key_data, "client.key") or cfg.key_file
    c.tls_server_name = cfg.tls_server_name
    token = cfg.token or (Path(cfg.token_file).read_text().strip() if cfg.token_file else None)
    if token:
        c.api_key = {"authorization": f"Bearer {token}"}
    return k8s.ApiClient(configuration=c)


def allowed(call: Callable[[], Any]) -> bool:
    """True when ``call`` goes through, False when the API server answers 403 (RBAC or an
    admission policy not in force yet, or in force); any other failure is raised."""
    from kubernetes import client as k8s

    try:
        call()
    except k8s.ApiException as e:
        if e.status == 403:
            return False
        raise
    return True
