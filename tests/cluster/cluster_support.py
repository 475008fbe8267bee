"""The ``Cluster`` handle of the tests that need the real local cluster (fixtures are in
conftest.py): the harness's kubectl runner plus what these tests add (host processes to
stop at the end, waiting for a pod's phase)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from typing import Any

from testkit.harness import Kubectl, wait_until


@dataclass
class Cluster(Kubectl):
    started_here: bool = False
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def wait_pod_phase(
        self,
        namespace: str,
        name: str,
        phases: tuple[str, ...] = ("Succeeded",),
        timeout: float = 180,
    ) -> dict[str, Any]:
        """The pod once its phase is one of ``phases``; fails at once on an unexpected
        Failed, or after ``timeout`` seconds, with ``kubectl describe`` and the kubelet's
        log tail."""
        last: dict[str, Any] = {}

        def reached() -> dict[str, Any] | None:
            nonlocal last
            proc = self.kubectl("-n", namespace, "get", "pod", name, "-o", "json", check=False)
            if proc.returncode != 0:
                return None
            last = json.loads(proc.stdout)
            phase = last.get("status", {}).get("phase")
            if phase in phases:
                return last
            if phase == "Failed":
                raise AssertionError("Failed")
            return None

        try:
            return wait_until(f"pod {namespace}/{name} in {phases}", reached, timeout)
        except AssertionError:
            describe = self.kubectl("-n", namespace, "describe", "pod", name, check=False).stdout
            raise AssertionError(
                f"pod {namespace}/{name} did not reach {phases} in {timeout}s "
                f"(phase={last.get('status', {}).get('phase')}):\n{describe}\n"
                f"kubelet log tail:\n{self.log_tail('kubelet')}"
            ) from None
