"""kubectl and helm against the local cluster, as its admin."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.harness.env import REPO


def helm_path(major: int = 3) -> str:
    """The helm binary hack/install-tools.sh installed (installs it when missing)."""
    out = subprocess.run(
        ["bash", str(REPO / "hack" / "install-tools.sh")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    paths = dict(line.split("=", 1) for line in out.stdout.split() if "=" in line)
    return paths.get(f"helm{major}") or next(iter(paths.values()))


@dataclass
class Kubectl:
    """Runs kubectl (and helm, when ``helm_bin`` is set) with the cluster's admin
    kubeconfig; a failing command raises AssertionError with its output."""

    env: Mapping[str, str]
    helm_bin: str = ""

    @property
    def node(self) -> str:
        return self.env["NODE_NAME"]

    def run(
        self,
        cmd: Sequence[str],
        *,
        check: bool = True,
        timeout: float = 180,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": self.env["KUBECONFIG"]}
        proc = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, input=input, env=env
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{shlex.join(cmd)} failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run([self.env["KUBECTL"], *args], **kw)

    def helm(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        assert self.helm_bin, "no helm binary given"
        return self.run([self.helm_bin, *args], **kw)

    def get(self, *args: str) -> Any:
        """``kubectl get ARGS -o json``, decoded."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, docs: Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> None:
        """``kubectl apply`` of one manifest or several."""
        items = [docs] if isinstance(docs, Mapping) else list(docs)
        self.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in items))

    def log_tail(self, component: str, lines: int = 30) -> str:
        """The last lines of a cluster component's log (kubelet, kube-apiserver, ...)."""
        path = Path(self.env.get("CLUSTER_LOG_DIR", "/nonexistent")) / f"{component}.log"
        try:
            return "".join(path.read_text(errors="replace").splitlines(True)[-lines:])
        except OSError as exc:
            return f"<cannot read {path}: {exc}>"
