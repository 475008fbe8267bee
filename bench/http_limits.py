"""Threads and RSS of the HTTP servers under idle, half-sent and stalled-upload clients,
and the probes' answer times while slow bodies trickle in.

    python bench/http_limits.py [--idle 300] [--half 400] [--uploads 8] [--upload-mib 60]
                                [--slow 48] [--slow-length 1000 200000] [--slow-seconds 12]

Starts the extender (fake view and binder) and the agent's metrics endpoint in child
processes on 127.0.0.1 and reads their ``Threads`` and ``VmRSS`` from ``/proc``:
1. ``--idle`` connections that send nothing (extender);
2. ``--half`` requests to ``/metrics`` that stop in the middle of the headers;
3. ``--uploads`` POSTs to ``/filter`` announcing ``--upload-mib`` MiB and sending all but
   the last byte, then stalling.
4. ``--slow`` connections to the DRA webhook (8 workers, 5 s read timeout) that each send
   a whole head announcing ``--slow-length`` body bytes and then one body byte every
   ``--slow-interval`` seconds, reopened (head again) whenever the server closes them; once
   without and once with ``Expect: 100-continue``. Meanwhile a fresh client times
   ``/healthz`` every second for ``--slow-seconds``: a kubelet probe has 1 s.
After each step it also times one normal request. Figures before the bounds: 300 idle
connections held 309 threads; 400 half-sent requests 417; 8 stalled 60 MiB uploads took
RSS from 32 to 273 MiB.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SERVE = r"""
import sys, threading
from gpu_share.extender.core import Extender, ExtenderSettings
from gpu_share.extender.http import make_server
from gpu_share.observability.http import start_http
from gpu_share.observability.metrics import Metrics
from gpu_share.sharing.model import ResourceNames
from gpu_share.sharing.placement import make_policy, Workload, Shape

class View:
    def node(self, n): return None
    def workload(self): return Workload([Shape(4, 30, 1.0)])
    def reserve(self, *a): pass
    def pod(self, ns, n): return None

class Binder:
    def annotate_and_bind(self, *a): pass

if sys.argv[1] == "webhook":
    from gpu_share.sharing.dra.claim_translation import TranslationSettings
    from gpu_share.webhook.http import make_server as webhook_server
    from gpu_share.webhook.review import Mutator
    names = ResourceNames("vendor.com/vcuda-memory", "vendor.com/vcuda-core")
    mutator = Mutator(TranslationSettings(names, 1024), lambda bodies, deadline: None)
    srv = webhook_server(mutator, "127.0.0.1", 0, ssl_context=None)
    srv.start()
    port = srv.server_address[1]
elif sys.argv[1] == "extender":
    names = ResourceNames("vendor.com/vcuda-memory", "vendor.com/vcuda-core")
    ext = Extender(ExtenderSettings(names, "vendor.com", b"k" * 32), View(), Binder(),
                   lambda v: make_policy("fgd", v.workload()))
    srv = make_server(ext, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
else:
    port = start_http(Metrics().registry, bind_address="127.0.0.1", port=0).port
print(port, flush=True)
sys.stdin.read()
"""


def proc_status(pid: int) -> tuple[int, float]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) / 1024


class Child:
    def __init__(self, kind: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        time.sleep(0.5)  # let the server's threads start before the baseline

    def status(self) -> tuple[int, float]:
        return proc_status(self.proc.pid)

    def close(self) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")


def timed_request(url: str, body: bytes | None) -> str:
    t0 = time.monotonic()
    try:
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=15) as r:
            code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    except OSError as e:
        return f"failed after {time.monotonic() - t0:.1f} s ({type(e).__name__})"
    return f"{code} in {time.monotonic() - t0:.2f} s"


FILTER = json.dumps({"Pod": {}, "NodeNames": ["a"]}).encode()


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(5)
    return s


def held(
    child: Child, n: int, what: str, open_one: Callable[[int], socket.socket],
    path: str, body: bytes | None,
) -> list[socket.socket]:
    """``n`` connections from ``open_one(port)``, held for 2 s: the child's threads before
    and then, and how a normal request to ``path`` fared meanwhile (printed)."""
    base = child.status()
    socks = [open_one(child.port) for _ in range(n)]
    time.sleep(2)
    during = child.status()
    req = timed_request(f"http://127.0.0.1:{child.port}{path}", body)
    print(f"{n} {what}: threads {base[0]} -> {during[0]}; a normal {path} meanwhile: {req}")
    return socks


def half_open(port: int) -> socket.socket:
    s = connect(port)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: half-sent
    return s


def idle(n: int) -> None:
    child = Child("extender")
    try:
        socks = held(child, n, "idle connections (extender)", connect, "/filter", FILTER)
        for s in socks:
            s.close()
    finally:
        tail = child.close()
    print(f"  tracebacks on stderr: {tail.count('Traceback')}")


def half_sent(n: int) -> None:
    child = Child("metrics")
    try:
        socks = held(child, n, "half-sent /metrics requests", half_open, "/metrics", None)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        time.sleep(1)
    finally:
        tail = child.close()
    print(f"  tracebacks on stderr after the clients went away: {tail.count('Traceback')}")


def uploads(n: int, mib: int) -> None:
    child = Child("extender")
    try:
        base = child.status()
        size = mib * 2**20
        chunk = b" " * 2**20
        socks = []
        refused = 0
        for _ in range(n):
            s = connect(child.port)
            socks.append(s)
            try:
                s.sendall(f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                          f"\r\nContent-Length: {size}\r\n\r\n".encode())
                sent = 0
                while sent < size - 1:
                    part = chunk[: min(len(chunk), size - 1 - sent)]
                    s.sendall(part)
                    sent += len(part)
            except OSError:
                refused += 1
        time.sleep(2)
        during = child.status()
        req = timed_request(f"http://127.0.0.1:{child.port}/filter", FILTER)
        print(f"{n} stalled {mib} MiB uploads: RSS {base[1]:.0f} -> {during[1]:.0f} MiB, "
              f"threads {base[0]} -> {during[0]}, uploads cut short by the server: {refused}; "
              f"a normal /filter meanwhile: {req}")
        for s in socks:
            s.close()
    finally:
        child.close()


class Trickler:
    """``n`` connections, each a head announcing ``length`` body bytes, then one body byte
    per ``tick()``; a connection the server closed (or answered) is opened again."""

    def __init__(self, port: int, n: int, length: int, expect: bool) -> None:
        self.port = port
        expect_line = "Expect: 100-continue\r\n" if expect else ""
        self.head = (f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"{expect_line}Content-Length: {length}\r\n\r\n").encode()
        self.socks: list[socket.socket | None] = [None] * n
        self.reopened = 0
        self.answers: dict[str, int] = {}

    def _open(self, i: int) -> None:
        old = self.socks[i]
        if old is not None:
            old.close()
            self.reopened += 1
        try:
            s = connect(self.port)
            s.sendall(self.head)
            self.socks[i] = s
        except OSError:
            self.socks[i] = None

    def _ended(self, s: socket.socket) -> bool:
        """Whether the server answered or closed ``s`` (the answer's status is counted)."""
        if not select.select([s], [], [], 0)[0]:
            return False
        try:
            data = s.recv(4096)
        except OSError:
            return True
        if not data:
            return True
        data = data.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not data:
            return False  # only the interim answer: the server waits for the body
        status = data.split(b" ", 2)[1].decode(errors="replace")
        self.answers[status] = self.answers.get(status, 0) + 1
        return True

    def tick(self) -> None:
        for i, s in enumerate(self.socks):
            if s is None or self._ended(s):
                self._open(i)
                continue
            try:
                s.send(b" ")
            except OSError:
                self._open(i)

    def close(self) -> None:
        for s in self.socks:
            if s is not None:
                s.close()


def probe(url: str, timeout_s: float) -> tuple[float, str]:
    """(seconds, outcome) of a GET of ``url``: its status, or the error's name."""
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            r.read()
            outcome = str(r.status)
    except urllib.error.HTTPError as e:
        outcome = str(e.code)
    except OSError as e:
        outcome = type(getattr(e, "reason", e)).__name__
    return time.monotonic() - t0, outcome


def slow_bodies(n: int, length: int, expect: bool, interval_s: float, seconds: float) -> None:
    child = Child("webhook")
    url = f"http://127.0.0.1:{child.port}/healthz"
    trick = Trickler(child.port, n, length, expect)
    took: list[tuple[float, str]] = []
    try:
        trick.tick()  # opens them all
        time.sleep(1)
        last_tick = time.monotonic()
        end = last_tick + seconds
        while time.monotonic() < end:
            took.append(probe(url, 5))
            if time.monotonic() - last_tick >= interval_s:
                trick.tick()
                last_tick = time.monotonic()
            time.sleep(max(0.0, 1 - took[-1][0]))
    finally:
        trick.close()
        child.close()
    ok = sorted(t for t, outcome in took if outcome == "200")
    within = sum(1 for t in ok if t <= 1)
    failed: dict[str, int] = {}
    for _, outcome in took:
        if outcome != "200":
            failed[outcome] = failed.get(outcome, 0) + 1
    worst = f"{ok[-1]:.3f} s" if ok else "-"
    print(f"{n} slow bodies of {length} bytes{' (Expect: 100-continue)' if expect else ''}, "
          f"1 byte per {interval_s:g} s, {seconds:g} s: /healthz 200 for {len(ok)}/{len(took)} "
          f"probes ({within} within 1 s, slowest {worst}), otherwise {failed or '-'}; slow "
          f"connections reopened {trick.reopened}, server answers to them "
          f"{trick.answers or '-'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=int, default=300)
    ap.add_argument("--half", type=int, default=400)
    ap.add_argument("--uploads", type=int, default=8)
    ap.add_argument("--upload-mib", type=int, default=60)
    ap.add_argument("--slow", type=int, default=48)
    ap.add_argument("--slow-length", type=int, nargs="+", default=[1000, 200_000])
    ap.add_argument("--slow-interval", type=float, default=2.0)
    ap.add_argument("--slow-seconds", type=float, default=12.0)
    ap.add_argument("--only-slow", action="store_true", help="skip steps 1 to 3")
    a = ap.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))
    if not a.only_slow:
        idle(a.idle)
        half_sent(a.half)
        uploads(a.uploads, a.upload_mib)
    for length in a.slow_length:
        for expect in (False, True):
            slow_bodies(a.slow, length, expect, a.slow_interval, a.slow_seconds)


if __name__ == "__main__":
    main()
