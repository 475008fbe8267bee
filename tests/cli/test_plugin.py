"""L1: the plugin's command line: kubectl flags before or after the subcommand, the
selectors each LIST carries, the kubeconfig and namespace found as kubectl finds them,
exit codes and read-only errors (the API answers faked at the LIST)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_share.cli import kubectl_plugin as kp
from gpu_share.kube.rest import ApiError
from tests.cli.objects import POOL, assignment, node_obj, pod_obj

NODES = [node_obj("gpu-a", [(16, 4, 30, True)], pool="t4"),
         node_obj("gpu-b", [(16, 0, 0, False)], pool="a100")]
PODS = [pod_obj("p1", "gpu-a", {"main": (4, 30)},
                annotation=assignment("gpu-a", {"main": [(0, 4, 30, False)]}))]


class Api:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.forbid: set[str] = set()

    def close(self) -> None:
        pass


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    fake = Api()

    def paged(a: Api, op: str, path: str, *, page_size: int = 500, **sel: str) -> Any:
        a.calls.append((path, {"limit": page_size, **sel}))
        if path in a.forbid:
            raise ApiError(op, 403, "forbidden")
        return (NODES if path.endswith("/nodes") else PODS), "1"

    monkeypatch.setattr(kp, "client", lambda a, env: fake)
    monkeypatch.setattr(kp, "rest_paged_list", paged)
    yield fake


def run(argv: list[str], capsys: pytest.CaptureFixture[str], env: dict[str, str] | None = None
        ) -> tuple[int, str, str]:
    rc = kp.main(argv, environ=env if env is not None else {"HOME": "/nonexistent"})
    out, err = capsys.readouterr()
    return rc, out, err


def test_nodes_one_list_each_with_selectors(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["nodes", "-l", "zone=x", "--pool", "t4"], capsys)
    assert rc == 0 and out.splitlines()[0].startswith("NODE")
    assert api.calls == [
        ("/api/v1/nodes", {"limit": 500, "labelSelector": f"zone=x,{POOL}=t4"}),
        ("/api/v1/pods", {"limit": 500, "fieldSelector":
                          "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"}),
    ]


def test_flags_before_or_after_the_subcommand(api: Api, capsys: pytest.CaptureFixture[str]
                                              ) -> None:
    _, before, _ = run(["-o", "json", "--chunk-size", "50", "nodes"], capsys)
    _, after, _ = run(["nodes", "-o", "json", "--chunk-size", "50"], capsys)
    assert before == after and json.loads(after)["kind"] == "GpuShareNodeList"
    assert {c[1]["limit"] for c in api.calls} == {50}
    rc, out, _ = run(["nodes", "--unhealthy", "-o", "yaml"], capsys)
    assert rc == 0 and "name: gpu-b" in out and "gpu-a" not in out


def test_pods_namespace_from_flag_context_or_all(
    api: Api, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    kc = tmp_path / "config"
    kc.write_text("current-context: c1\ncontexts:\n- {name: c1, context: {namespace: team-a}}\n"
                  "- {name: c2, context: {}}\n")
    env = {"KUBECONFIG": f"{tmp_path / 'missing'}:{kc}", "HOME": "/nonexistent"}
    rc, out, _ = run(["pods"], capsys, env)
    assert rc == 0 and out.split()[:9] == ["POD", "CONTAINER", "NODE", "GPU", "MEMORY",
                                           "CORES", "MODE", "SOURCE", "AGE"]
    assert api.calls[0][0] == "/api/v1/namespaces/team-a/pods"
    run(["pods", "--context", "c2"], capsys, env)
    assert api.calls[2][0] == "/api/v1/namespaces/default/pods"
    run(["pods", "-n", "x y", "-l", "app=a"], capsys, env)
    assert api.calls[4] == ("/api/v1/namespaces/x%20y/pods", {
        "limit": 500, "fieldSelector": kp.LIVE, "labelSelector": "app=a"})
    rc, out, _ = run(["-A", "pods", "-o", "wide"], capsys, env)
    assert api.calls[6][0] == "/api/v1/pods" and out.startswith("NAMESPACE")


def test_pods_without_node_access(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    api.forbid.add("/api/v1/nodes")
    rc, out, err = run(["pods", "-n", "team-a"], capsys)
    assert rc == 0 and "cannot list nodes (forbidden)" in err
    assert "GPU-gpu-a-0" in out  # by uuid when the node's inventory is unknown


def test_forbidden_is_an_error_naming_the_rbac(api: Api, capsys: pytest.CaptureFixture[str]
                                               ) -> None:
    api.forbid.add("/api/v1/pods")
    rc, _, err = run(["nodes"], capsys)
    assert rc == kp.EXIT_ERROR
    assert "403" in err and "needs get/list on nodes and pods" in err


def test_fit_exit_codes(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["fit", "--memory", "6", "--cores", "30"], capsys)
    assert rc == 0 and out.splitlines()[2].split()[:3] == ["gpu-a", "10", "main:0"]
    assert "gpu-b   gpu-share: no healthy device" in out
    rc, out, _ = run(["fit", "--memory", "16", "--cores", "30", "-o", "json"], capsys)
    assert rc == kp.EXIT_NO_FIT and json.loads(out)["fits"] == []
    rc, _, _ = run(["fit", "--memory", "1", "--cores", "1", "--cpu", "lots"], capsys)
    assert rc == kp.EXIT_USAGE
    with pytest.raises(SystemExit) as e:
        run(["fit", "--memory", "0", "--cores", "0"], capsys)
    assert e.value.code == 2


def test_kubeconfig_search_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text("{}")
    one = tmp_path / "one"
    one.write_text("{}")
    assert kp.kubeconfig_path("flag", {"KUBECONFIG": str(one)}) == "flag"
    assert kp.kubeconfig_path(None, {"KUBECONFIG": f"/nope:{one}", "HOME": str(home)}) == str(one)
    assert kp.kubeconfig_path(None, {"HOME": str(home)}) == str(home / ".kube" / "config")
    assert kp.kubeconfig_path(None, {"HOME": str(tmp_path)}) is None  # in-cluster
    assert kp.context_namespace(None, None) == "default"


def test_request_timeout_forms() -> None:
    assert [kp.timeout_seconds(t) for t in ("30", "30s", "2m", "1h", "0")] == [
        30, 30, 120, 3600, 60]
    for bad in ("soon", "-1", "5x"):
        with pytest.raises(ValueError):
            kp.timeout_seconds(bad)
