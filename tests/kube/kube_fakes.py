"""A fake API server answering from a handler and recording every request:
``fake_rest``, a real HTTP server on loopback for ``kube.rest.RestClient`` (the one API
client), so the real transport (keep-alive, chunked watches, closing) runs."""

from __future__ import annotations

import contextlib
import http.server
import json
import queue
import select
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class ApiServer:
    """What the ``apiserver`` fixture (conftest.py) yields."""

    url: str
    port: int
    kubeconfig: str  # admin (system:masters) kubeconfig
    ca_file: str


def bind_cluster_role(rbac: Any, name: str, rules: list[dict[str, Any]], ns: str, sa: str) -> None:
    """ClusterRole ``name`` with ``rules``, bound (a ClusterRoleBinding of the same name)
    to the service account ``sa`` of namespace ``ns``; ``rbac``: an RbacAuthorizationV1Api."""
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
    rbac.create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
    })


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    timeout: Any

    def rbac(self) -> tuple[str, str, str]:
        """(apiGroup, resource, verb) this request needs (core/v1 and /apis/<group>/<v>)."""
        parts = self.path.strip("/").split("/")
        if parts[:1] == ["apis"]:
            group, rest = parts[1], parts[3:]
        else:
            assert parts[:2] == ["api", "v1"], self.path
            group, rest = "", parts[2:]
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            rest = rest[2:]
        resource, name = rest[0], (rest[1] if len(rest) > 1 else "")
        if len(rest) > 2:
            resource = f"{resource}/{rest[2]}"
        verb = {
            "POST": "create",
            "PATCH": "patch",
            "PUT": "update",
            "DELETE": "delete" if name else "deletecollection",
        }.get(self.method)
        if verb is None:
            if name:
                verb = "get"
            else:
                verb = "watch" if self.query.get("watch") in ("true", "True", "1") else "list"
        return (group, resource, verb)


class FakeStream:
    """A streaming answer (a watch) fed line by line from a queue."""

    def __init__(self, lines: list[dict[str, Any]] | None = None, *, block: bool = False):
        self.status = 200
        self.reason = "OK"
        self.headers: dict[str, str] = {"Content-Type": "application/json"}
        self.data = b""
        self._q: queue.Queue[bytes | None] = queue.Queue()
        for obj in lines or ():
            self._q.put(json.dumps(obj).encode() + b"\n")
        if not block:
            self._q.put(None)
        self.shut = threading.Event()

    def feed(self, obj: dict[str, Any]) -> None:
        self._q.put(json.dumps(obj).encode() + b"\n")

    def stream(self, amt: Any = None, decode_content: Any = None) -> Iterator[bytes]:
        # Bounded: at most 1000 chunks, each waited for at most 10 s.
        for _ in range(1000):
            try:
                item = self._q.get(timeout=10)
            except queue.Empty:
                return
            if item is None:
                return
            yield item

    def shutdown(self) -> None:
        self.shut.set()
        self._q.put(None)

    def release_conn(self) -> None:
        pass


Handler = Callable[[Call], "tuple[int, Any] | FakeStream"]


@dataclass
class FakeHttp:
    """The handler of a loopback server and the requests it got."""

    handler: Handler
    calls: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def rbac_allows(call: Callable[[], Any]) -> bool:
    """True when ``call`` goes through, False when the API server refuses it as forbidden
    (RBAC still propagating); any other failure is raised."""
    from gpu_share.errors import KubeAccessError

    try:
        call()
    except KubeAccessError as e:
        if e.reason == "KubeForbidden":
            return False
        raise
    return True


def status_obj(code: int, reason: str = "NotFound", message: str = "nope") -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


def pod_obj(
    name: str,
    *,
    namespace: str = "ns",
    uid: str | None = None,
    node: str = "node-a",
    init: list[dict[str, Any]] | None = None,
    app: list[dict[str, Any]] | None = None,
    rv: str = "1",
    deleting: bool = False,
    annotations: dict[str, str] | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{name}",
        "resourceVersion": rv,
        "creationTimestamp": "2024-05-01T10:00:00Z",
    }
    if annotations:
        meta["annotations"] = annotations
    if deleting:
        meta["deletionTimestamp"] = "2024-05-01T10:05:00Z"
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": app if app is not None else [{"name": "main"}],
    }
    if init:
        spec["initContainers"] = init
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase},
    }


# ---------------------------------------------------------------- loopback server


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _LoopbackServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        call = Call(
            method=self.command,
            path=parts.path,
            query={k: v[-1] for k, v in parse_qs(parts.query).items()},
            headers=dict(self.headers.items()),
            body=json.loads(raw) if raw else None,
            timeout=None,
        )
        fake = self.server.fake
        with fake.lock:
            fake.calls.append(call)
        answer = fake.handler(call)
        if isinstance(answer, FakeStream):
            self._stream(answer)
            return
        status, obj = answer
        if isinstance(obj, Exception):  # a transport failure: drop the connection
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        data = obj if isinstance(obj, bytes) else (json.dumps(obj).encode() if obj is not None
                                                   else b"")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, s: FakeStream) -> None:
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        for _ in range(200_000):  # bounded: ~10 min of 3 ms polls at most
            try:
                item = s._q.get(timeout=0.003)
            except queue.Empty:
                if _peer_closed(self.connection):
                    s.shut.set()
                    return
                continue
            try:
                if item is None:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    return
                self.wfile.write(b"%x\r\n%s\r\n" % (len(item), item))
                self.wfile.flush()
            except OSError:
                s.shut.set()
                return

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve


def _peer_closed(sock: socket.socket) -> bool:
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class _LoopbackServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeHttp


_servers: list[_LoopbackServer] = []


def fake_rest(handler: Handler, **client_kw: Any) -> tuple[Any, FakeHttp]:
    """A ``RestClient`` talking to a loopback server that answers from ``handler``."""
    from gpu_share.kube.rest import RestClient, RestConfig

    server = _LoopbackServer(("127.0.0.1", 0), _Handler)
    server.fake = FakeHttp(handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    _servers.append(server)
    port = server.server_address[1]
    return RestClient(RestConfig(server=f"http://127.0.0.1:{port}"), **client_kw), server.fake


def stop_fake_servers() -> None:
    while _servers:
        server = _servers.pop()
        server.shutdown()
        server.server_close()
