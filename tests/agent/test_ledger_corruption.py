"""L2: the node agent (dummy backend) starting on a corrupt, inconsistent or unwritable
ledger: it keeps running, quarantines what it cannot read (bounded), says
so with a log line, a node Event and a metric, and rebuilds from PodResources."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpu_share.agent.journal import JOURNAL_TORN
from gpu_share.agent.node_agent import NodeAgent
from gpu_share.agent.ports import AgentMetrics
from gpu_share.agent.state import (
    JOURNAL_PREFIX,
    MAX_LEDGER_BYTES,
    MAX_QUARANTINED,
    TOO_LARGE,
    UNREADABLE,
    LedgerStore,
)
from gpu_share.config.model import AgentConfig
from gpu_share.devices.dummy import DummyBackend
from gpu_share.plugin.manager import PluginManager
from gpu_share.plugin.podresources import PodResourcesClient
from gpu_share.sharing.model import (
    PodResourcesContainer,
    PodResourcesPod,
    PodResourcesView,
    ResourceKind,
)
from gpu_share.sharing.node.ledger import DUPLICATE_UNIT, MALFORMED, UNKNOWN_DEVICE, EntrySource
from testkit.harness.wait import poll
from testkit.kubelet_stub import (
    FakePodResources,
    KubeletStub,
    PluginClient,
    fast_plugin_settings,
)
from tests.agent.served_agent import (
    CORE,
    MEM,
    FakePods,
    RecordingPublisher,
    agent_config,
    kill_if_running,
    scratch_dir,
    spawn_agent,
)


@dataclass
class RecordingMetrics(AgentMetrics):
    quarantined: Counter[str] = field(default_factory=Counter)
    anomalies: Counter[str] = field(default_factory=Counter)
    write_failures: int = 0
    writes: int = 0

    def ledger_quarantined(self, reason: str) -> None:
        self.quarantined[reason] += 1

    def ledger_anomaly(self, reason: str) -> None:
        self.anomalies[reason] += 1

    def ledger_write_failed(self) -> None:
        self.write_failures += 1

    def ledger_write(self) -> None:
        self.writes += 1


@dataclass
class Node:
    dir: Path
    cfg: AgentConfig
    pr: FakePodResources
    publisher: RecordingPublisher = field(default_factory=RecordingPublisher)
    metrics: RecordingMetrics = field(default_factory=RecordingMetrics)
    agent: NodeAgent | None = None

    @property
    def ledger(self) -> Path:
        return self.dir / "state" / "ledger.json"

    def corrupt_files(self) -> list[Path]:
        return sorted(
            (self.dir / "state").glob("ledger.json.corrupt.*"),
            key=lambda p: int(p.name.rsplit(".", 1)[1]),
        )

    def uuids(self) -> list[str]:
        backend = DummyBackend(self.cfg.dummy, self.cfg.node_name)
        return [d.uuid for d in backend.devices()]

    def start(self, *, api: bool = True) -> NodeAgent:
        backend = DummyBackend(self.cfg.dummy, self.cfg.node_name, check_interval_s=0.05)
        backend.start()
        client = PodResourcesClient(str(self.dir / "pr.sock"), timeout_s=1.0,
                                    resource_names=[MEM, CORE])
        self.agent = NodeAgent(self.cfg, backend, pod_resources=client,
                               pods=FakePods() if api else None,
                               publisher=self.publisher, metrics=self.metrics)
        self.agent.start()
        return self.agent

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
            self.agent = None

    def events(self, reason: str) -> list[str]:
        assert self.agent is not None and self.agent.flush(5)
        return [msg for _who, r, msg in self.publisher.events if r == reason]


@pytest.fixture
def node() -> Iterator[Node]:
    with scratch_dir() as d:
        (d / "state").mkdir()
        pr = FakePodResources(d / "pr.sock").start()
        n = Node(d, agent_config(d), pr)
        try:
            yield n
        finally:
            n.stop()
            pr.stop()


def _entry(pod: str, mem_ids: list[str], device: str) -> dict[str, object]:
    return {
        "namespace": "default", "podName": pod, "containerName": "main",
        "podUid": f"uid-{pod}", "containerKind": "app", "order": 0,
        "request": {"memoryUnits": len(mem_ids), "cores": 0},
        "shares": [{"device": device, "memoryUnits": len(mem_ids), "cores": 0,
                    "exclusive": False}],
        "memoryIds": mem_ids, "coreIds": [], "source": "node-agent",
        "createdAt": 1.0, "updatedAt": 1.0,
    }


def _doc(*entries: dict[str, object]) -> bytes:
    return json.dumps({"version": "v1", "seq": 0, "entries": list(entries)}).encode()


CORRUPT: dict[str, tuple[bytes, str]] = {
    "random-bytes": (bytes(range(256)) * 4, MALFORMED),
    "ff-prefix": (b"\xff" + _doc(), MALFORMED),  # UnicodeDecodeError in the old code
    "not-json": (b'{"version": "v1", "entries": [', MALFORMED),
    "seq-1e999": (b'{"version": "v1", "seq": 1e999}', MALFORMED),  # OverflowError
    "wrong-types": (b'{"version": "v1", "entries": [{"namespace": 5, "request": []}]}',
                    MALFORMED),
    "deep-nesting": (b"[" * 200_000 + b"]" * 200_000, MALFORMED),  # RecursionError
    "arabic-digit-id": (_doc(_entry("a", ["X::mem::\u0663"], "X")), MALFORMED),
    "unit-twice-in-one-entry": (_doc(_entry("a", ["X::mem::1", "X::mem::1"], "X")),
                                DUPLICATE_UNIT),
}


@pytest.mark.parametrize("case", CORRUPT.values(), ids=CORRUPT.keys())
def test_corrupt_ledger_is_quarantined_and_the_agent_starts_empty(
    node: Node, case: tuple[bytes, str]
) -> None:
    content, reason = case
    node.ledger.write_bytes(content)
    agent = node.start()  # old code: UnicodeDecodeError, OverflowError, RecursionError
    assert agent.engine is not None and agent.engine.ledger.entries == []
    (moved,) = node.corrupt_files()
    assert moved.name == "ledger.json.corrupt.0" and moved.read_bytes() == content
    assert node.metrics.quarantined == Counter({reason: 1})
    (msg,) = node.events("LedgerQuarantined")
    assert reason in msg and len(msg) <= 1100


def test_ledger_over_the_size_cap_is_quarantined(node: Node) -> None:
    with node.ledger.open("wb") as fh:
        fh.truncate(MAX_LEDGER_BYTES + 1)  # sparse: costs no disk
    node.start()
    assert [p.name for p in node.corrupt_files()] == ["ledger.json.corrupt.0"]
    assert node.metrics.quarantined == Counter({TOO_LARGE: 1})


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_ledger_that_is_not_a_file_is_quarantined(node: Node, kind: str) -> None:
    if kind == "directory":
        node.ledger.mkdir()
        (node.ledger / "x").write_text("x")
    else:
        os.mkfifo(node.ledger)  # reading it must not hang the start
    node.start()
    assert len(node.corrupt_files()) == 1
    assert not os.path.lexists(node.ledger) or node.ledger.is_file()  # a new ledger
    assert node.metrics.quarantined == Counter({UNREADABLE: 1})


def test_quarantine_keeps_only_the_newest_files(node: Node) -> None:
    for i in range(MAX_QUARANTINED + 3):
        node.ledger.write_bytes(b"garbage %d" % i)
        node.start()
        node.stop()
    kept = node.corrupt_files()
    assert len(kept) == MAX_QUARANTINED
    assert [p.read_bytes() for p in kept] == [
        b"garbage %d" % i for i in range(3, MAX_QUARANTINED + 3)
    ]


def test_running_slice_is_readopted_from_podresources_after_quarantine(node: Node) -> None:
    dev = node.uuids()[0]
    held = [f"{dev}::mem::{i}" for i in range(4)]
    running = PodResourcesContainer("main", {MEM: tuple(held)})
    node.pr.set_pods(PodResourcesView((PodResourcesPod("default", "run", (running,)),)))
    node.ledger.write_bytes(b"\xff\xfe not a ledger")
    agent = node.start()
    assert agent.engine is not None
    (entry,) = agent.engine.ledger.entries
    assert (entry.ref.pod_name, entry.source) == ("run", EntrySource.RECONCILED)
    assert sorted(entry.memory_ids) == held
    assert agent.engine.usage()[dev].memory_used == 4
    assert node.metrics.quarantined == Counter({MALFORMED: 1})


def test_inconsistent_entries_are_kept_and_reported(node: Node) -> None:
    dev = node.uuids()[0]
    node.ledger.write_bytes(
        _doc(
            _entry("a", [f"{dev}::mem::3"], dev),
            _entry("b", [f"{dev}::mem::3"], dev),  # the same unit, another pod
            _entry("c", ["GPU-gone::mem::0"], "GPU-gone"),  # a device this node lacks
        )
    )
    # No API server: its (empty) pod list would release the three entries at once in
    # the background reconcile, racing the assertions; PodResources absence has a grace.
    agent = node.start(api=False)
    assert agent.engine is not None
    assert sorted(e.ref.pod_name for e in agent.engine.ledger.entries) == ["a", "b", "c"]
    assert node.corrupt_files() == []  # kept, not quarantined
    assert node.metrics.anomalies == Counter({DUPLICATE_UNIT: 1, UNKNOWN_DEVICE: 2})
    (msg,) = node.events("LedgerInconsistent")
    assert msg.startswith("3 ledger entries")
    assert agent.engine.usage()[dev].memory_used == 1  # counted once: no over-commit


# ---------------------------------------------------------------- unwritable ledger
@pytest.fixture
def served(node: Node) -> Iterator[tuple[Node, dict[str, PluginClient]]]:
    kubelet = KubeletStub(node.dir / "dp").start()
    agent = node.start()
    manager = PluginManager(agent.handlers(), node.dir / "dp", fast_plugin_settings())
    manager.start()
    clients = {h.resource_name: kubelet.plugin(h.endpoint).watch() for h in agent.handlers()}
    try:
        yield node, clients
    finally:
        manager.stop()
        kubelet.stop()


def test_failed_ledger_write_is_reported_not_internal(
    served: tuple[Node, dict[str, PluginClient]],
) -> None:
    """Old code: the OSError from the write reached the kubelet as INTERNAL. Calls append
    to the journal, a snapshot follows in the background: both made unwritable here."""
    node, clients = served
    mem = clients[MEM]
    ids = [d.id for d in mem.wait_for_list(lambda ds: len(ds) > 0)]
    assert node.agent is not None
    store = node.agent._journal.store
    # os.replace() onto (and open() of) a non-empty directory fails even for root.
    planted = [node.ledger] + [
        node.ledger.with_name(f"{JOURNAL_PREFIX}{g}")
        for g in range(store.journal_gen, store.journal_gen + 200)
    ]
    for p in planted:
        if p.exists():
            p.unlink()
        p.mkdir()
        (p / "keep").write_text("x")
    for n in (2, 3):
        offered = mem.preferred_allocation(ids, [], n)
        assert len(mem.allocate(offered).envs) > 0
        ids = [i for i in ids if i not in offered]
    assert node.metrics.write_failures >= 4  # (a reconcile pass may add one)
    (msg,) = node.events("LedgerWriteFailed")  # once per failing stretch
    assert "ledger not written" in msg
    for p in planted:
        shutil.rmtree(p)
    mem.preferred_allocation(ids, [], 1)
    deadline = time.monotonic() + 10
    while not node.ledger.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)  # the background snapshot
    assert node.ledger.is_file()  # written again once the fault is gone
    assert node.agent.engine is not None
    node.agent.compact()
    on_disk = json.loads(node.ledger.read_text())
    assert len(on_disk["entries"]) == len(node.agent.engine.ledger.entries) == 3


# ---------------------------------------------------------------- the journal
# On disk: a snapshot (ledger.json) plus an append-only journal of changes
# (ledger.journal.<gen>), compacted into a new snapshot in the background. A crash may
# cut the last record short: left out (counted), never fatal. Any other unreadable
# record quarantines snapshot and journal together, like an unreadable ledger.
MEM_KIND = ResourceKind.MEMORY


def _record(*entries: dict[str, object], removed: Sequence[str] = ()) -> str:
    return json.dumps({
        "seq": 0, "memoryUnitMiB": 1024, "entries": list(entries),
        "removed": [{"namespace": "default", "podName": p, "containerName": "main",
                     "podUid": f"uid-{p}"} for p in removed],
    })


def _journal(node: Node, gen: int) -> Path:
    return node.dir / "state" / f"{JOURNAL_PREFIX}{gen}"


def _snapshot(node: Node, gen: int, *entries: dict[str, object]) -> None:
    doc = json.loads(_doc(*entries))
    doc["journal"] = gen
    node.ledger.write_text(json.dumps(doc))


def _pods(node: Node) -> list[str]:
    assert node.agent is not None and node.agent.engine is not None
    return sorted(e.ref.pod_name for e in node.agent.engine.ledger.entries)


def test_journal_records_after_the_snapshot_are_replayed(node: Node) -> None:
    dev = node.uuids()[0]
    _snapshot(node, 3, _entry("a", [f"{dev}::mem::0"], dev))
    _journal(node, 2).write_text(_record(_entry("old", [f"{dev}::mem::9"], dev)) + "\n")
    _journal(node, 3).write_text(
        _record(_entry("b", [f"{dev}::mem::1"], dev)) + "\n"
        + _record(removed=["a"]) + "\n"
    )
    # A crash between opening the next generation and writing its snapshot: both count.
    _journal(node, 4).write_text(_record(_entry("c", [f"{dev}::mem::2"], dev)) + "\n")
    node.start(api=False)
    assert _pods(node) == ["b", "c"]  # "old" predates the snapshot: not replayed
    assert node.corrupt_files() == [] and node.metrics.anomalies == Counter()
    # Start folds it all into a new snapshot; the old generations are gone.
    assert [p.name for p in (node.dir / "state").glob(f"{JOURNAL_PREFIX}*")] == []
    on_disk = json.loads(node.ledger.read_text())
    assert sorted(e["podName"] for e in on_disk["entries"]) == ["b", "c"]
    assert on_disk["journal"] > 4


def test_journal_without_a_snapshot_is_read(node: Node) -> None:
    dev = node.uuids()[0]
    _journal(node, 1).write_text(_record(_entry("a", [f"{dev}::mem::0"], dev)) + "\n")
    node.start(api=False)
    assert _pods(node) == ["a"]


def test_torn_last_record_is_left_out_not_fatal(node: Node) -> None:
    dev = node.uuids()[0]
    whole = _record(_entry("a", [f"{dev}::mem::0"], dev))
    torn = _record(_entry("b", [f"{dev}::mem::1"], dev))[:40]  # a crash mid-write
    _journal(node, 1).write_text(whole + "\n" + torn)
    node.start(api=False)
    assert _pods(node) == ["a"]
    assert node.corrupt_files() == []
    assert node.metrics.anomalies == Counter({JOURNAL_TORN: 1})
    node.stop()
    node.start(api=False)  # no crash loop: the torn record is not appended after
    assert _pods(node) == ["a"] and node.metrics.anomalies == Counter({JOURNAL_TORN: 1})


def test_zero_filled_last_line_is_left_out(node: Node) -> None:
    """After a power loss the file may end in NULs up to the next block."""
    dev = node.uuids()[0]
    whole = _record(_entry("a", [f"{dev}::mem::0"], dev))
    _journal(node, 1).write_bytes(whole.encode() + b"\n" + b"\0" * 300 + b"\n")
    node.start(api=False)
    assert _pods(node) == ["a"] and node.metrics.anomalies == Counter({JOURNAL_TORN: 1})


def test_corrupt_record_inside_the_journal_quarantines_ledger_and_journal(node: Node) -> None:
    dev = node.uuids()[0]
    _snapshot(node, 1, _entry("a", [f"{dev}::mem::0"], dev))
    text = "not a record\n" + _record(_entry("b", [f"{dev}::mem::1"], dev)) + "\n"
    _journal(node, 1).write_text(text)
    node.start(api=False)
    assert _pods(node) == []  # starts empty; PodResources re-adopts what runs
    (moved,) = node.corrupt_files()
    assert moved.name == "ledger.json.corrupt.0"
    assert moved.with_name(f"{JOURNAL_PREFIX}1.corrupt.0").read_text() == text
    assert node.metrics.quarantined == Counter({MALFORMED: 1})
    (msg,) = node.events("LedgerQuarantined")
    assert "journal record 0" in msg


def test_record_of_the_wrong_shape_quarantines(node: Node) -> None:
    _journal(node, 1).write_text('{"entries": [{"namespace": 5}]}\n' + _record() + "\n")
    node.start(api=False)
    assert node.metrics.quarantined == Counter({MALFORMED: 1})


def test_disk_always_holds_the_ledger_in_memory(node: Node) -> None:
    """At any moment (a crash can come any time): snapshot + journal = the ledger."""
    agent = node.start(api=False)
    assert agent.engine is not None
    store = LedgerStore(str(node.dir / "state"))
    dev = node.uuids()[0]
    ids = [f"{dev}::mem::{i}" for i in range(8)]
    for n in range(1, 6):
        offered = agent.calls.preferred(MEM_KIND, ids, [], n % 2 + 1)
        agent.calls.allocate(MEM_KIND, offered)
        ids = [i for i in ids if i not in offered]
        read, torn = store.read()
        assert read is not None and torn == 0
        assert read.entries == agent.engine.ledger.entries
    # The background compaction folds the journal into ledger.json within seconds.
    def folded() -> bool:
        return len(json.loads(node.ledger.read_text())["entries"]) == 5

    assert poll(folded, timeout_s=10)
    assert len(agent.engine.ledger.entries) == 5


# ---------------------------------------------------------------- the real process
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_plugin_process_with_a_corrupt_ledger_registers(node: Node) -> None:
    """Old code: exit 1 with a UnicodeDecodeError traceback, the file left in place."""
    node.ledger.write_bytes(b"\xff" + bytes(range(256)))
    kubelet = KubeletStub(node.dir / "dp").start()
    port = _free_port()
    proc = spawn_agent(node.dir, "--metrics-port", str(port))
    try:
        try:
            kubelet.wait_for_registrations(2, timeout_s=30)
        except TimeoutError:
            proc.kill()
            pytest.fail(f"no registration; exit {proc.wait(5)}: {proc.communicate()[0]}")
        assert poll(lambda: b"ledger_quarantined_total" in _metrics(port), 10)
        assert (
            b'gpu_share_ledger_quarantined_total{reason="LedgerMalformed"} 1.0' in _metrics(port)
        )
        assert [p.name for p in node.corrupt_files()] == ["ledger.json.corrupt.0"]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
        assert "Traceback" not in out, out
        assert "ledger unreadable" in out
    finally:
        kill_if_running(proc)
        kubelet.stop()


def _metrics(port: int) -> bytes:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return bytes(r.read())
    except OSError:
        return b""

