"""L2: ``gpu-share-plugin`` as a real process, standalone on the dummy backend."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from testkit.harness.wait import poll
from testkit.host_agent import agent_argv
from testkit.kubelet_stub import FakePodResources, KubeletStub
from tests.agent.served_agent import kill_if_running, spawn_agent


def test_serves_registers_and_cleans_up_on_sigterm(workdir: Path) -> None:
    kubelet = KubeletStub(workdir / "dp").start()
    pr = FakePodResources(workdir / "pr.sock").start()
    proc = spawn_agent(workdir, "--metrics-port", "19431")
    try:
        assert kubelet.wait_for_registrations(2, timeout_s=20), proc.stdout
        sockets = sorted(p.name for p in (workdir / "dp").iterdir())
        assert sockets == [
            "gpu-share-vcuda-core.sock",
            "gpu-share-vcuda-memory.sock",
            "kubelet.sock",
        ]
        client = kubelet.plugin("gpu-share-vcuda-memory.sock").watch()
        assert len(client.wait_for_list(lambda ds: len(ds) > 0)) == 4 * 16
        ready = poll(lambda: _get("http://127.0.0.1:19431/readyz") == 200, 10)
        assert ready
        body = urllib.request.urlopen("http://127.0.0.1:19431/metrics", timeout=5).read()
        assert b"gpu_share_registrations_total" in body
        client.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
        left = sorted(p.name for p in (workdir / "dp").iterdir())
        assert left == ["kubelet.sock"]  # ours removed, the kubelet's untouched
        assert (workdir / "state" / "ledger.json").exists()
    finally:
        kill_if_running(proc)
        pr.stop()
        kubelet.stop()


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except Exception:
        return 0


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ("version: v1\ndummy:\n  memoryMib: 3\n", ["dummy.memoryMib"]),  # the bad key
        ("version: v7\n", ["v7", "v1"]),  # an unknown version, and the known one
    ],
    ids=["invalid-key", "unknown-version"],
)
def test_bad_config_exits_2_naming_what_is_wrong(
    workdir: Path, config: str, named: list[str]
) -> None:
    cfg = workdir / "c.yaml"
    cfg.write_text(config)
    proc = spawn_agent(workdir, "--config", str(cfg))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert all(word in out for word in named), out


def test_device_list_over_1mib_is_refused_with_a_unit_suggestion(workdir: Path) -> None:
    # 64 devices x 80 GiB at 1 MiB units: over five million ids, far over the limit.
    proc = spawn_agent(
        workdir,
        "--memory-unit-mib",
        "1",
        "--dummy-device-count",
        "64",
        env_extra={"GPU_SHARE_DUMMY__MEMORY_MIB": "81920"},
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out  # a config the devices make invalid: exit 2
    assert "memoryUnitMiB" in out, out


# ---------------------------------------------------------------- lifecycle
# SIGTERM ends the agent within 5 s in every state (the chart grants 30 s), after telling
# the kubelet every device is going; one agent per state dir; a socket the OS refuses
# names its cause.

EXIT_BOUND_S = 5.0


def _sigterm_and_time(proc: subprocess.Popen[str]) -> tuple[float, str]:
    """Send SIGTERM; seconds until the process ended (the test fails past 20 s)."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=5)
        pytest.fail(f"no exit 20 s after SIGTERM:\n{out[-3000:]}")
    took = time.monotonic() - t0
    print(f"exit {took:.2f}s after SIGTERM")  # shown with -s or on failure
    return took, out


def _wait_for_sockets(d: Path, proc: subprocess.Popen[str]) -> None:
    ours = {"gpu-share-vcuda-core.sock", "gpu-share-vcuda-memory.sock"}
    ok = poll(
        lambda: proc.poll() is not None or ours <= {p.name for p in (d / "dp").iterdir()}, 30
    )
    assert ok and proc.poll() is None, proc.stdout.read() if proc.stdout else ""


def test_sigterm_before_first_registration_exits_within_5s(workdir: Path) -> None:
    """No kubelet.sock: the agent serves and waits to register (the old one sat in
    registration retries and took 64 s to exit)."""
    proc = spawn_agent(workdir)
    try:
        _wait_for_sockets(workdir, proc)
        time.sleep(1.0)  # well into what used to be the registration retries
        took, out = _sigterm_and_time(proc)
        assert proc.returncode == 0, out
        assert took < EXIT_BOUND_S, (took, out[-3000:])
        assert sorted(p.name for p in (workdir / "dp").iterdir()) == []
    finally:
        kill_if_running(proc)


def test_sigterm_sends_every_device_unhealthy_before_the_stream_ends(workdir: Path) -> None:
    kubelet = KubeletStub(workdir / "dp").start()
    pr = FakePodResources(workdir / "pr.sock").start()
    proc = spawn_agent(workdir)
    try:
        kubelet.wait_for_registrations(2, timeout_s=20)
        clients = {
            ep: kubelet.plugin(ep).watch()
            for ep in ("gpu-share-vcuda-memory.sock", "gpu-share-vcuda-core.sock")
        }
        first = {
            ep: c.wait_for_list(lambda ds: len(ds) > 0 and all(d.healthy for d in ds), 10)
            for ep, c in clients.items()
        }
        took, out = _sigterm_and_time(proc)
        assert proc.returncode == 0, out
        assert took < EXIT_BOUND_S, (took, out[-3000:])
        for ep, c in clients.items():
            assert c.watch_ended.wait(5), ep
            last = c.lists[-1]
            # The very last list before the stream ended: every device, unhealthy.
            assert [d.id for d in last] == [d.id for d in first[ep]], ep
            assert not any(d.healthy for d in last), ep
    finally:
        kill_if_running(proc)
        pr.stop()
        kubelet.stop()


def test_sigterm_during_a_kubelet_call_exits_within_5s(workdir: Path) -> None:
    """An Allocate waits on a PodResources call that answers only after 30 s (the
    agent's lock is held meanwhile)."""
    kubelet = KubeletStub(workdir / "dp").start()
    pr = FakePodResources(workdir / "pr.sock").start()
    proc = spawn_agent(
        workdir, env_extra={"GPU_SHARE_KUBELET__POD_RESOURCES_TIMEOUT_SECONDS": "30"}
    )
    try:
        kubelet.wait_for_registrations(2, timeout_s=20)
        client = kubelet.plugin("gpu-share-vcuda-memory.sock").watch()
        ids = [d.id for d in client.wait_for_list(lambda ds: len(ds) > 0, 10)]
        pr.delay_s = 30.0
        before = pr.calls["List"]
        client.timeout_s = 60.0

        def allocate() -> None:
            with contextlib.suppress(Exception):  # cancelled by the stopping agent
                client.allocate(ids[:2])

        threading.Thread(target=allocate, daemon=True).start()
        assert poll(lambda: pr.calls["List"] > before, 10)  # the call is in flight
        took, out = _sigterm_and_time(proc)
        assert proc.returncode == 0, out
        assert took < EXIT_BOUND_S, (took, out[-3000:])
    finally:
        kill_if_running(proc)
        pr.delay_s = 0.0
        pr.stop()
        kubelet.stop()


class _BlackHole:
    """A TCP listener on 127.0.0.1 that accepts and never answers (an API server that
    hangs)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.accepted.append(conn)

    def close(self) -> None:
        for c in self.accepted:
            c.close()
        self.sock.close()


def test_sigterm_while_waiting_for_the_api_server_exits_within_5s(workdir: Path) -> None:
    hole = _BlackHole()
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:{hole.port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    pr = FakePodResources(workdir / "pr.sock").start()
    proc = spawn_agent(
        workdir,
        env_extra={
            "KUBECONFIG": str(kubeconfig),
            "GPU_SHARE_IDENTITY__USE_API_SERVER": "true",
            "GPU_SHARE_PUBLISH__NODE_ANNOTATION": "true",
        },
    )
    try:
        _wait_for_sockets(workdir, proc)
        assert poll(lambda: len(hole.accepted) >= 1, 20), "the agent never called"
        time.sleep(0.5)
        took, out = _sigterm_and_time(proc)
        assert proc.returncode == 0, out
        assert took < EXIT_BOUND_S, (took, out[-3000:])
    finally:
        kill_if_running(proc)
        pr.stop()
        hole.close()


def _identity(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def test_second_agent_on_the_same_state_dir_changes_nothing(workdir: Path) -> None:
    from gpu_share.sharing.node.ledger import Ledger

    state = workdir / "state"
    state.mkdir()
    ledger = state / "ledger.json"
    ledger.write_text(Ledger().to_json())
    kubelet = KubeletStub(workdir / "dp").start()
    pr = FakePodResources(workdir / "pr.sock").start()
    port = _free_port()
    a = spawn_agent(workdir, "--metrics-port", str(port))
    others: list[subprocess.Popen[str]] = []
    try:
        kubelet.wait_for_registrations(2, timeout_s=20)
        socks = {p.name: _identity(p) for p in (workdir / "dp").iterdir()}
        before = (ledger.read_bytes(), _identity(ledger))
        # B on A's metrics port (the old agent failed on it and then wrote the ledger),
        # C on a free port (the old agent took A's sockets over).
        for extra in (("--metrics-port", str(port)), ("--metrics-port", "0")):
            b = spawn_agent(workdir, *extra)
            others.append(b)
            out, _ = b.communicate(timeout=30)
            assert b.returncode not in (0, None), out
            assert "agent.lock" in out and "another gpu-share agent" in out, out
        assert {p.name: _identity(p) for p in (workdir / "dp").iterdir()} == socks
        assert (ledger.read_bytes(), _identity(ledger)) == before
        # A still serves.
        client = kubelet.plugin("gpu-share-vcuda-memory.sock").watch()
        assert len(client.wait_for_list(lambda ds: len(ds) > 0, 10)) == 4 * 16
        assert a.poll() is None
        _, out = _sigterm_and_time(a)
        assert a.returncode == 0, out
    finally:
        kill_if_running(a, *others)
        pr.stop()
        kubelet.stop()


def test_socket_path_over_the_unix_limit_names_the_cause(workdir: Path) -> None:
    long_dir = workdir / ("d" * 40) / ("e" * 40)
    long_dir.mkdir(parents=True)
    proc = subprocess.Popen(
        [*agent_argv("n1", str(long_dir), str(workdir / "pr.sock"), str(workdir / "state"), 0)],
        env={k: v for k, v in os.environ.items() if not k.startswith(("GPU_SHARE_", "KUBE"))}
        | {"GPU_SHARE_IDENTITY__USE_API_SERVER": "false",
           "GPU_SHARE_PUBLISH__NODE_ANNOTATION": "false",
           "GPU_SHARE_PUBLISH__POD_ANNOTATION": "false",
           "GPU_SHARE_PUBLISH__EVENTS": "false"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    path = long_dir / "gpu-share-vcuda-memory.sock"
    n = len(os.fsencode(path))
    assert n > 107
    assert f"socket path {path} is {n} bytes, the limit is 107" in out, out
    assert "cannot join thread" not in out and "Traceback" not in out, out
    assert list(long_dir.iterdir()) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
