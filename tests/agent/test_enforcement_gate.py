"""Nodes that cannot enforce take no slices (agent/enforcement.py): each check of each
mode (L1), and the whole agent (L2: real gRPC, kubelet stub) holding every device back in
ListAndWatch within seconds of its library vanishing, keeping the running slice, saying
why (node Event, annotation, metric) and taking new slices again once it is restored."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpu_share.agent import enforcement
from gpu_share.config.model import EnforcementMode, RuntimeConfig
from gpu_share.sharing.annotations import enforcement_key
from tests.agent.served_agent import (
    MEM,
    Rig,
    hami_core_install,
    pod_view,
    rig_with,
)


def _until(cond: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _hami(d: Path) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {"enforcement": "hami-core", "hamiCore": hami_core_install(d)}
    )


def test_an_installed_library_is_ready(tmp_path: Path) -> None:
    runtime = _hami(tmp_path)
    os.makedirs(runtime.hami_core.cache_dir)
    assert enforcement.check(runtime).problems == ()


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (lambda lib: lib.unlink(), "missing"),
        (lambda lib: lib.write_bytes(b"#!/bin/sh\n" * 10), "not an ELF file"),
        (lambda lib: lib.write_bytes(lib.read_bytes() + b"\0"), "does not match its checksum"),
        (lambda lib: Path(f"{lib}.sha256").unlink(), "unreadable"),
        (lambda lib: Path(f"{lib}.sha256").write_text("nope\n"), "holds no sha256"),
        (lambda lib: (lib.parent / "ld.so.preload").write_text("/other/lib.so\n"),
         "does not name"),
        (lambda lib: shutil.rmtree(lib.parent.parent / "cache"), "cache dir"),
    ],
)
def test_each_missing_part_is_named(
    tmp_path: Path, spoil: Callable[[Path], None], says: str
) -> None:
    runtime = _hami(tmp_path)
    os.makedirs(runtime.hami_core.cache_dir)
    spoil(Path(runtime.hami_core.library_path))
    status = enforcement.check(runtime)
    assert not status.ready and says in status.describe(), status.describe()


def test_a_library_for_another_machine_is_not_loadable(tmp_path: Path) -> None:
    runtime = _hami(tmp_path)
    os.makedirs(runtime.hami_core.cache_dir)
    other = bytearray(Path(runtime.hami_core.library_path).read_bytes()[:20])
    other[18:20] = (183).to_bytes(2, "little")  # EM_AARCH64
    problems = enforcement.check_hami_core(runtime, own_elf=lambda: bytes(other))
    assert any("another machine" in p for p in problems), problems


def test_mps_needs_its_control_daemon_answering(tmp_path: Path) -> None:
    runtime = RuntimeConfig.model_validate(
        {"enforcement": "mps", "mps": {"pipeDir": str(tmp_path)}}
    )
    assert "not running" in enforcement.check(runtime).describe()
    control = tmp_path / "control"
    os.mkfifo(control)  # a pipe nobody reads: the daemon is gone
    assert "not answering" in enforcement.check(runtime).describe()
    reader = os.open(control, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert enforcement.check(runtime).ready
    finally:
        os.close(reader)
    control.unlink()
    with socket.socket(socket.AF_UNIX) as srv:
        srv.bind(str(control))
        assert "not answering" in enforcement.check(runtime).describe()  # not listening
        srv.listen(1)
        assert enforcement.check(runtime).ready
    assert stat.S_ISSOCK(control.stat().st_mode)


def test_none_checks_nothing() -> None:
    status = enforcement.check(RuntimeConfig(enforcement=EnforcementMode.NONE))
    assert status.ready and status.as_doc() == {"mode": "none", "ready": True, "problems": []}


@contextlib.contextmanager
def _hami_rig() -> Iterator[Rig]:
    runtime = {"runtime": lambda d: {"enforcement": "hami-core", "hamiCore": hami_core_install(d)}}
    with rig_with(runtime) as r:
        yield r


def _healthy_units(rig: Rig) -> int:
    latest = rig.clients[MEM].latest or []
    return sum(1 for d in latest if d.healthy)


def _status(rig: Rig) -> dict[str, object]:
    text = rig.publisher.node.get(enforcement_key("vendor.com"))
    return json.loads(text) if text else {}


def test_a_node_whose_library_vanishes_takes_no_new_slice_until_it_is_back() -> None:
    with _hami_rig() as rig:
        assert rig.agent is not None and rig.agent.engine is not None
        lib = Path(rig.cfg.runtime.hami_core.library_path)
        total = len(rig.all_ids(MEM))
        rig.admit(pod_view("running", ("main", 4, 0)), random.Random(1))
        _until(lambda: _status(rig).get("ready") is True)
        assert rig.publisher.labels[enforcement_key("vendor.com")] == "hami-core"
        saved = lib.read_bytes()
        lib.unlink()
        # Within a health pass: every unit unhealthy in ListAndWatch, the reason
        # published and an Event naming the library.
        _until(lambda: _healthy_units(rig) == 0)
        _until(lambda: _status(rig).get("ready") is False)
        # The node's label: gone while it cannot enforce (a nodeSelector on it keeps
        # pods that need enforcement off the node).
        _until(lambda: rig.publisher.labels.get(enforcement_key("vendor.com"), "x") is None)
        assert any(str(lib) in str(p) for p in _status(rig)["problems"])  # type: ignore[attr-defined]
        assert not rig.agent.enforcement.ready
        _until(lambda: any(r == "EnforcementUnavailable" and str(lib) in m
                           for _, r, m in rig.publisher.events))
        # The running slice stays.
        assert rig.agent.engine.ledger.pod_entries(("default", "running")) != []
        # Restored: the units come back, new slices land.
        lib.write_bytes(saved)
        _until(lambda: _healthy_units(rig) == total)
        _until(lambda: any(r == "EnforcementReady" for _, r, _m in rig.publisher.events))
        _until(lambda: rig.publisher.labels.get(enforcement_key("vendor.com")) == "hami-core")
        rig.admit(pod_view("after", ("main", 2, 0)), random.Random(2))
        assert rig.agent.engine.ledger.pod_entries(("default", "after")) != []
