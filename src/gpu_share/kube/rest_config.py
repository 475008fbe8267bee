"""Where the API server is and how ``kube.rest`` (the one API client) authenticates.

In this order: an explicit kubeconfig; the in-cluster
service account (``KUBERNETES_SERVICE_HOST`` / ``_PORT``, the token and CA under
/var/run/secrets/kubernetes.io/serviceaccount); the first existing file of
``KUBECONFIG``; ``~/.kube/config``. From a kubeconfig: the current (or given) context's
server, CA (file or data, or insecure-skip-tls-verify), client certificate and key (file
or data), bearer token or token file, tls-server-name. Exec and auth-provider plugins,
basic auth (username/password) and proxy-url are not supported (refused with a clear
error). A token file is re-read when it changes (bound service-account tokens rotate).
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from gpu_share.errors import KubeAccessError

SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"
SERVICE_PORT_ENV = "KUBERNETES_SERVICE_PORT"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICE_TOKEN_FILE = f"{SERVICE_ACCOUNT_DIR}/token"
SERVICE_CA_FILE = f"{SERVICE_ACCOUNT_DIR}/ca.crt"


@dataclass(frozen=True)
class RestConfig:
    """Where the API server is and how to authenticate; see the module docstring."""

    server: str  # scheme://host[:port][/prefix]
    ca_file: str | None = None
    ca_data: bytes | None = None  # PEM
    insecure: bool = False  # insecure-skip-tls-verify
    tls_server_name: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None  # PEM
    key_data: bytes | None = None  # PEM
    token: str | None = None
    token_file: str | None = None


def _config_error(msg: str) -> KubeAccessError:
    return KubeAccessError(f"cannot load API server configuration: {msg}",
                           reason="KubeConfigInvalid")


def in_cluster_config(
    environ: Mapping[str, str], token_file: str = SERVICE_TOKEN_FILE,
    ca_file: str = SERVICE_CA_FILE,
) -> RestConfig:
    """The pod's service account: server from the service env, token and CA files."""
    host, port = environ.get(SERVICE_HOST_ENV, ""), environ.get(SERVICE_PORT_ENV, "")
    if not host or not port:
        raise _config_error(f"{SERVICE_HOST_ENV}/{SERVICE_PORT_ENV} not set")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    for what, path in (("token", token_file), ("CA", ca_file)):
        if not Path(path).is_file():
            raise _config_error(f"service account {what} file {path} does not exist")
    if not Path(token_file).read_text().strip():
        raise _config_error(f"service account token file {token_file} is empty")
    return RestConfig(server=f"https://{host}:{port}", ca_file=ca_file, token_file=token_file)


def _named(items: Any, name: str, what: str) -> dict[str, Any]:
    for item in items or ():
        if isinstance(item, dict) and item.get("name") == name:
            body = item.get(what)
            return body if isinstance(body, dict) else {}
    raise _config_error(f"kubeconfig has no {what} named {name!r}")


def _b64(text: Any, key: str) -> bytes:
    import base64
    import binascii

    try:
        return base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError) as e:
        raise _config_error(f"kubeconfig {key} is not base64: {e}") from e


def _refuse_unsupported(path: str, cluster: dict[str, Any], user: dict[str, Any]) -> None:
    """Refuse what the client cannot honour rather than connect without it."""
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise _config_error(f"{path}: user {plugin} plugins are not supported by"
                                " gpu-share's API client; use a token, a token file or a"
                                " client certificate")
    if user.get("username") or user.get("password"):
        raise _config_error(f"{path}: basic auth (username/password) is not supported;"
                            " use a token, a token file or a client certificate")
    if cluster.get("proxy-url"):
        raise _config_error(f"{path}: cluster proxy-url is not supported")


def kubeconfig_config(path: str, context: str | None = None) -> RestConfig:
    """The server and credentials of ``context`` (default: current-context) of a
    kubeconfig file; relative file paths are relative to the file's directory."""
    import yaml  # the config loader imported it already

    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise _config_error(f"{path}: {e}") from e
    if not isinstance(doc, dict):
        raise _config_error(f"{path} is not a kubeconfig (not a mapping)")
    ctx_name = context or doc.get("current-context")
    if not ctx_name:
        raise _config_error(f"{path} has no current-context")
    ctx = _named(doc.get("contexts"), str(ctx_name), "context")
    cluster = _named(doc.get("clusters"), str(ctx.get("cluster", "")), "cluster")
    user = _named(doc.get("users"), str(ctx.get("user", "")), "user") if ctx.get("user") else {}
    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise _config_error(f"{path}: cluster server {server!r} is not an http(s) URL")
    _refuse_unsupported(path, cluster, user)
    base = Path(path).resolve().parent

    def file_of(key: str) -> str | None:
        value = cluster.get(key) if key == "certificate-authority" else user.get(key)
        return str(base / str(value)) if value else None

    def data_of(source: dict[str, Any], key: str) -> bytes | None:
        value = source.get(key)
        return _b64(value, key) if value else None

    return RestConfig(
        server=server.rstrip("/"),
        ca_file=file_of("certificate-authority"),
        ca_data=data_of(cluster, "certificate-authority-data"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=cluster.get("tls-server-name") or None,
        cert_file=file_of("client-certificate"),
        key_file=file_of("client-key"),
        cert_data=data_of(user, "client-certificate-data"),
        key_data=data_of(user, "client-key-data"),
        token=str(user["token"]) if user.get("token") else None,
        token_file=file_of("tokenFile"),
    )


class ConfigSources(TypedDict, total=False):
    """Where ``load_rest_config`` looks besides a kubeconfig path (tests point them
    elsewhere)."""

    context: str | None
    environ: Mapping[str, str] | None
    token_file: str
    ca_file: str


def load_rest_config(
    kubeconfig: str | None = None,
    *,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
    token_file: str = SERVICE_TOKEN_FILE,
    ca_file: str = SERVICE_CA_FILE,
) -> RestConfig:
    """The configuration from, in this order: ``kubeconfig`` if given; the in-cluster
    service account when ``KUBERNETES_SERVICE_HOST``/``PORT`` are set; the ``KUBECONFIG``
    env (its first existing file); ``~/.kube/config``. Raises KubeAccessError
    (reason KubeConfigMissing when there is none, KubeConfigInvalid when it is broken).
    """
    env = os.environ if environ is None else environ
    if kubeconfig:
        return kubeconfig_config(kubeconfig, context)
    if env.get(SERVICE_HOST_ENV) and env.get(SERVICE_PORT_ENV):
        return in_cluster_config(env, token_file, ca_file)
    if env.get("KUBECONFIG"):
        paths = [p for p in env["KUBECONFIG"].split(os.pathsep) if p]
        existing = [p for p in paths if Path(p).is_file()]
        if not existing:
            raise KubeAccessError(f"KUBECONFIG={env['KUBECONFIG']!r} names no existing file",
                                  reason="KubeConfigMissing")
        return kubeconfig_config(existing[0], context)
    default = Path(env.get("HOME", str(Path.home()))) / ".kube" / "config"
    if not default.is_file():
        raise KubeAccessError(
            "no API server configuration: not in a cluster "
            f"({SERVICE_HOST_ENV} unset), no KUBECONFIG, no {default}",
            reason="KubeConfigMissing",
        )
    return kubeconfig_config(str(default), context)


def ssl_context(cfg: RestConfig) -> ssl.SSLContext:
    """TLS to the server: its CA (else the system's, or no check), the client's key pair."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cfg.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.ca_file or cfg.ca_data:
        ctx.load_verify_locations(cafile=cfg.ca_file,
                                  cadata=cfg.ca_data.decode() if cfg.ca_data else None)
    else:
        ctx.load_default_certs()
    if cfg.cert_data or cfg.key_data:
        # ssl loads a key pair from files only: a private temp dir, removed at once.
        with tempfile.TemporaryDirectory(prefix="gpu-share-tls-") as d:
            cert, key = Path(d) / "c.pem", Path(d) / "k.pem"
            for p, data, given in ((cert, cfg.cert_data, cfg.cert_file),
                                   (key, cfg.key_data, cfg.key_file)):
                p.touch(mode=0o600)
                p.write_bytes(data if data is not None else Path(str(given)).read_bytes())
            ctx.load_cert_chain(str(cert), str(key))
    elif cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ctx


class BearerToken:
    """The bearer token; a token file is re-read when its stat changes (rotation)."""

    def __init__(self, cfg: RestConfig) -> None:
        self._fixed = cfg.token
        self._file = cfg.token_file
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._value: str | None = None

    def header(self) -> str | None:
        if self._file is None:
            return f"Bearer {self._fixed}" if self._fixed else None
        try:
            st = os.stat(self._file)
        except OSError:
            st = None  # mid-rotation or gone: keep the last token
        with self._lock:
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino) if st is not None else None
            if stamp is not None and stamp != self._stamp:
                with contextlib.suppress(OSError):
                    self._value = Path(self._file).read_text().strip() or self._value
                    self._stamp = stamp
            return f"Bearer {self._value}" if self._value else None
