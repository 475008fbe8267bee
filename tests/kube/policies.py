"""One chart policy (and its binding), as `helm template` renders it, renamed for the L3
module that applies it to the shared test API server."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from tests.chart.conftest import CHART, NAMESPACE, RELEASE, helm_path


def rendered_policy(suffix: str, name: str, *sets: str,
                    kube_version: str = "1.35.0") -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy whose name ends with ``suffix`` and its binding,
    both renamed ``name``; ``sets``: ``--set`` values of the render."""
    args = [helm_path(4), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--kube-version", kube_version]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    objs = [d for d in yaml.safe_load_all(out) if d
            and d["kind"].startswith("ValidatingAdmissionPolicy")
            and d["metadata"]["name"].endswith(suffix)]
    assert len(objs) == 2, [o["metadata"]["name"] for o in objs]
    for o in objs:
        o["metadata"]["name"] = name
        if o["kind"] == "ValidatingAdmissionPolicyBinding":
            o["spec"]["policyName"] = name
    return objs
