"""Building a generated-client ``ApiClient`` (the scheduler extender, admin tools), and
its call helpers. The node agent uses ``kube.rest`` instead (no generated client).

This package is the only place that imports ``kubernetes``. Every call made from here
passes an explicit (connect, read) timeout: the generated client has no default and
would otherwise wait forever on a half-open connection.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes.config import ConfigException, kube_config
from kubernetes.config.incluster_config import (
    SERVICE_CERT_FILENAME,
    SERVICE_HOST_ENV_NAME,
    SERVICE_PORT_ENV_NAME,
    SERVICE_TOKEN_FILENAME,
    InClusterConfigLoader,
)

from gpu_share.errors import KubeAccessError
from gpu_share.kube.rest import KubeTimeouts, RestClient, RestConfig

__all__ = [
    "ApiClient",
    "KubeTimeouts",
    "api_status",
    "call_json",
    "make_api_client",
]

ApiClient = k8s.ApiClient

# The kubernetes package is untyped; these names make that explicit at one place.
_InClusterLoader: Any = InClusterConfigLoader
_load_kube_config: Any = kube_config.load_kube_config


def make_api_client(
    kubeconfig: str | None = None,
    *,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
    token_file: str = SERVICE_TOKEN_FILENAME,
    ca_file: str = SERVICE_CERT_FILENAME,
) -> k8s.ApiClient:
    """An ApiClient from, in this order: ``kubeconfig`` if given; the in-cluster service
    account when ``KUBERNETES_SERVICE_HOST``/``PORT`` are set; the ``KUBECONFIG`` env;
    ``~/.kube/config``. Raises KubeAccessError when none works.

    In-cluster, the projected token is re-read periodically (bound tokens rotate).
    """
    env = os.environ if environ is None else environ
    cfg = k8s.Configuration()
    # Retry only failed connects: a request that reached the server is never repeated
    # (callers on the allocation path prefer a fast, honest failure).
    cfg.retries = urllib3.Retry(total=2, connect=2, read=0, redirect=0, status=0, other=0)
    try:
        if kubeconfig:
            _load_kubeconfig(kubeconfig, context, cfg)
        elif env.get(SERVICE_HOST_ENV_NAME) and env.get(SERVICE_PORT_ENV_NAME):
            _InClusterLoader(
                token_filename=token_file,
                cert_filename=ca_file,
                try_refresh_token=True,
                environ=env,
            ).load_and_set(cfg)
        elif env.get("KUBECONFIG"):
            # KUBECONFIG may list several files; the first existing one is enough here.
            paths = [p for p in env["KUBECONFIG"].split(os.pathsep) if p]
            existing = [p for p in paths if Path(p).is_file()]
            if not existing:
                raise KubeAccessError(
                    f"KUBECONFIG={env['KUBECONFIG']!r} names no existing file",
                    reason="KubeConfigMissing",
                )
            _load_kubeconfig(existing[0], context, cfg)
        else:
            default = Path(env.get("HOME", str(Path.home()))) / ".kube" / "config"
            if not default.is_file():
                raise KubeAccessError(
                    "no API server configuration: not in a cluster "
                    f"({SERVICE_HOST_ENV_NAME} unset), no KUBECONFIG, no {default}",
                    reason="KubeConfigMissing",
                )
            _load_kubeconfig(str(default), context, cfg)
    except (ConfigException, OSError, ValueError) as e:
        raise KubeAccessError(
            f"cannot load API server configuration: {e}", reason="KubeConfigInvalid"
        ) from e
    api = k8s.ApiClient(configuration=cfg)
    api.user_agent = "gpu-share-plugin"
    return api


def rest_client_of(api: Any) -> RestClient:
    """The agent's REST client for what a generated ``ApiClient`` was configured with
    (admin tools that build one and pass it on). Its token is read once."""
    c = api.configuration
    auth = next((v.get("value") for v in c.auth_settings().values()
                 if v.get("key") == "authorization"), None)
    token = str(auth).removeprefix("Bearer ").removeprefix("bearer ") if auth else None
    return RestClient(RestConfig(
        server=str(c.host), ca_file=c.ssl_ca_cert or None, insecure=not c.verify_ssl,
        tls_server_name=getattr(c, "tls_server_name", None) or None,
        cert_file=c.cert_file or None, key_file=c.key_file or None, token=token,
    ))


def _load_kubeconfig(path: str, context: str | None, cfg: k8s.Configuration) -> None:
    _load_kube_config(
        config_file=path,
        context=context,
        client_configuration=cfg,
        persist_config=False,
    )


def api_status(exc: BaseException) -> int | None:
    """HTTP status of an API error, None for transport errors."""
    if isinstance(exc, k8s.ApiException):
        status = exc.status
        return int(status) if isinstance(status, int) and status > 0 else None
    return None


# What a failed call can raise: the API's error, or the transport's.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    k8s.ApiException,
    urllib3.exceptions.HTTPError,
    OSError,
)


def call_json(op: str, fn: Any, *args: Any, timeouts: KubeTimeouts, **kwargs: Any) -> Any:
    """Call a generated API method for its raw JSON answer (parsed into dicts).

    Raw JSON is parsed here instead of the generated models: it is several times faster
    for pod lists and survives fields the client library does not know yet.
    Raises ``ApiException`` for HTTP errors (callers map 404 and 409), KubeAccessError
    for transport errors and undecodable answers.
    """
    try:
        resp = fn(*args, _preload_content=False, _request_timeout=timeouts.pair(), **kwargs)
        data = resp.data
    except k8s.ApiException:
        raise
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise KubeAccessError(f"{op}: API server unreachable: {e}") from e
    try:
        return json.loads(data) if data else {}
    except ValueError as e:
        raise KubeAccessError(f"{op}: undecodable answer from API server: {e}") from e


def access_error(op: str, exc: BaseException) -> KubeAccessError:
    """KubeAccessError for a failed call, naming the operation and the HTTP status."""
    status = api_status(exc)
    if status is None:
        return KubeAccessError(f"{op}: API server unreachable: {exc}")
    reason = "KubeForbidden" if status in (401, 403) else "KubeUnreachable"
    detail = getattr(exc, "reason", "") or ""
    body = getattr(exc, "body", None)
    if body:
        with contextlib.suppress(ValueError, AttributeError):
            detail = json.loads(body).get("message", detail)
    return KubeAccessError(f"{op}: API server answered {status}: {detail}", reason=reason)
