from __future__ import annotations

from pathlib import Path

import pytest

from gpu_share.errors import KubeAccessError
from gpu_share.kube.client import make_api_client
from tests.kube.conftest import write_kubeconfig


def auth_header(api: object) -> str | None:
    settings = api.configuration.auth_settings()  # type: ignore[attr-defined]
    return next((v["value"] for v in settings.values() if v["key"] == "authorization"), None)


def test_explicit_kubeconfig_wins(tmp_path: Path) -> None:
    explicit = write_kubeconfig(tmp_path, 1111)
    env = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBECONFIG": write_kubeconfig(tmp_path, 2222),
    }
    api = make_api_client(explicit, environ=env)
    assert api.configuration.host == "https://127.0.0.1:1111"
    assert auth_header(api) == "Bearer tok-1111"
    assert api.user_agent == "gpu-share-plugin"


def test_in_cluster_honours_service_env(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("sa-token")
    ca = tmp_path / "ca.crt"
    ca.write_text("not really a cert, only read as a path")
    env = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": "6443",
        "KUBECONFIG": write_kubeconfig(tmp_path, 2222),
    }
    api = make_api_client(environ=env, token_file=str(token), ca_file=str(ca))
    assert api.configuration.host == "https://127.0.0.1:6443"
    assert api.configuration.ssl_ca_cert == str(ca)
    assert (auth_header(api) or "").lower() == "bearer sa-token"


def test_kubeconfig_env_then_missing_everything(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    env = {"KUBECONFIG": f"{missing}:{write_kubeconfig(tmp_path, 3333)}"}
    assert make_api_client(environ=env).configuration.host == "https://127.0.0.1:3333"
    with pytest.raises(KubeAccessError) as ei:
        make_api_client(environ={"KUBECONFIG": missing})
    assert ei.value.reason == "KubeConfigMissing"
    with pytest.raises(KubeAccessError, match="not in a cluster"):
        make_api_client(environ={"HOME": str(tmp_path)})


def test_in_cluster_without_token_file_is_an_access_error(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    with pytest.raises(KubeAccessError) as ei:
        make_api_client(environ=env, token_file=str(tmp_path / "t"), ca_file=str(tmp_path / "c"))
    assert ei.value.reason == "KubeConfigInvalid"


def test_broken_kubeconfig_is_an_access_error(tmp_path: Path) -> None:
    p = tmp_path / "bad"
    p.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nope\n")
    with pytest.raises(KubeAccessError):
        make_api_client(str(p))
