"""Fixtures of the chart tests: helm 3 and helm 4 binaries, cached renders, k8s schemas.

helm comes from hack/install-tools.sh (cached under $GPU_SHARE_CACHE); when it cannot be
installed the helm tests skip with the installer's error, and a warning says so.
"""

from __future__ import annotations

import functools
import json
import re
import socket
import ssl
import subprocess
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from referencing import Registry, Resource

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpu-share"
EXAMPLES = sorted((REPO / "values-examples").glob("*.yaml"))
HELM_MAJORS = (3, 4)
# Kubernetes minors the chart claims (Chart.yaml kubeVersion ">=1.29.0-0"), each checked
# against kubernetes-validate's strict schemas.
KUBE_MINORS = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34", "1.35")
VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
RELEASE = "gs"
NAMESPACE = "gpu-share"
HELM_TIMEOUT_S = 60


@functools.cache
def _install_tools() -> dict[int, str] | str:
    """{major: path} or the installer's error text."""
    try:
        proc = subprocess.run(
            [str(REPO / "hack" / "install-tools.sh")],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"hack/install-tools.sh did not run: {exc}"
    found = dict(re.findall(r"^helm(\d)=(\S+)$", proc.stdout, flags=re.MULTILINE))
    if proc.returncode != 0 or len(found) != len(HELM_MAJORS):
        return f"hack/install-tools.sh failed (rc={proc.returncode}): {proc.stderr[-800:]}"
    return {int(k): v for k, v in found.items()}


def helm_path(major: int) -> str:
    tools = _install_tools()
    if isinstance(tools, str):
        warnings.warn(f"chart tests SKIPPED, no helm: {tools}", stacklevel=2)
        pytest.skip(f"no helm {major}: {tools}")
    return tools[major]


@pytest.fixture(params=HELM_MAJORS, ids=lambda m: f"helm{m}")
def helm(request: pytest.FixtureRequest) -> str:
    return helm_path(request.param)


def _template_args(values: Sequence[str], sets: Sequence[str], kube: str, vap: bool) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube]
    if vap:
        args += ["--api-versions", VAP_API]
    for v in values:
        args += ["-f", v]
    for s in sets:
        args += ["--set-json" if s.startswith("json:") else "--set", s.removeprefix("json:")]
    return args


@functools.cache
def _run_template(
    helm: str, values: tuple[str, ...], sets: tuple[str, ...], kube: str, vap: bool
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm, *_template_args(values, sets, kube, vap)],
        capture_output=True,
        text=True,
        timeout=HELM_TIMEOUT_S,
        check=False,
    )


def render(
    helm: str,
    values: Sequence[str | Path] = (),
    sets: Sequence[str] = (),
    kube: str = "1.34.0",
    vap: bool = True,
) -> list[dict[str, Any]]:
    """Rendered objects (cached). ``sets`` items are --set, or --set-json with "json:"."""
    proc = _run_template(helm, tuple(map(str, values)), tuple(sets), kube, vap)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def render_error(
    helm: str,
    values: Sequence[str | Path] = (),
    sets: Sequence[str] = (),
    kube: str = "1.34.0",
    vap: bool = True,
) -> str:
    """stderr of a render that must fail."""
    proc = _run_template(helm, tuple(map(str, values)), tuple(sets), kube, vap)
    assert proc.returncode != 0, "render unexpectedly succeeded"
    return proc.stderr


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str, name_part: str = "") -> dict[str, Any]:
    found = [o for o in by_kind(objs, kind) if name_part in o["metadata"]["name"]]
    assert len(found) == 1, f"{kind} *{name_part}*: {[o['metadata']['name'] for o in found]}"
    return found[0]


# ---------------------------------------------------------------- Kubernetes schemas


def _schema_root() -> Path:
    import kubernetes_validate

    return Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"


@functools.cache
def _k8s_registry(minor: str) -> tuple[Path, Any]:
    root = _schema_root() / f"v{minor}.0-local-strict"
    if not root.is_dir():
        pytest.fail(f"kubernetes-validate ships no strict schemas for {minor}")
    defs = json.loads((root / "_definitions.json").read_text())
    # Schemas refer to "/api/_definitions.json#/$defs/...", the definitions' own $id.
    return root, Resource.from_contents(defs) @ Registry()


@functools.cache
def k8s_validator(minor: str, api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    root, registry = _k8s_registry(minor)
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = root / f"{kind.lower()}-{group_version}.json"
    if not path.is_file():
        pytest.fail(f"Kubernetes {minor} has no schema for {api_version} {kind}")
    schema = json.loads(path.read_text())
    registry = Resource.from_contents(schema) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


# ---------------------------------------------------------------- NOTES.txt

# `helm template` does not print NOTES.txt and `helm install --dry-run` has no
# --kube-version; a copy of the chart renders the very same NOTES text into a ConfigMap.
_NOTES_TPL = '{{- define "notes-under-test" -}}\n%s\n{{- end -}}\n'
_NOTES_CM = """apiVersion: v1
kind: ConfigMap
metadata:
  name: notes-under-test
data:
  notes: {{ include "notes-under-test" . | toJson }}
"""


@functools.cache
def _notes_chart(tmp_root: str) -> Path:
    import shutil

    copy = Path(tmp_root) / "gpu-share"
    shutil.copytree(CHART, copy)
    notes = (copy / "templates" / "NOTES.txt").read_text()
    (copy / "templates" / "_notes_under_test.tpl").write_text(_NOTES_TPL % notes)
    (copy / "templates" / "zz-notes-under-test.yaml").write_text(_NOTES_CM)
    return copy


def render_notes(
    helm: str, tmp_root: Path, sets: Sequence[str] = (), kube: str = "1.34.0"
) -> str:
    """NOTES.txt as `helm install` would print it for these values and Kubernetes version."""
    chart = _notes_chart(str(tmp_root))
    args = [helm, "template", RELEASE, str(chart), "--namespace", NAMESPACE]
    args += ["--kube-version", kube, "-s", "templates/zz-notes-under-test.yaml"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    (cm,) = [d for d in yaml.safe_load_all(proc.stdout) if d]
    notes: str = cm["data"]["notes"]
    return notes


def tls_handshake(sctx: ssl.SSLContext, cctx: ssl.SSLContext, hostname: str) -> str:
    """One TLS connection over loopback from a client with context ``cctx`` (naming
    ``hostname``) to a server with context ``sctx``; "ok" or the errors (client or server
    side)."""
    errors: list[str] = []
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        lsock.settimeout(10)
        port = lsock.getsockname()[1]

        def serve() -> None:
            try:
                conn, _ = lsock.accept()
                conn.settimeout(10)
                with sctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (OSError, ssl.SSLError) as exc:
                errors.append(f"server: {exc}")

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                cctx.wrap_socket(raw, server_hostname=hostname) as tls,
            ):
                got = tls.recv(2)
                if got != b"ok":
                    errors.append(f"client: read {got!r}")
        except (OSError, ssl.SSLError) as exc:
            errors.append(f"client: {exc}")
        t.join(15)
    return "ok" if not errors else "; ".join(errors)
