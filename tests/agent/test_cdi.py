"""The agent's CDI spec file (agent/cdi.py): written atomically 0644 for CDI pools only,
other kinds' and our own earlier file not taken for foreign specs, nvidia-ctk YAML read,
removed on exit without touching other files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from gpu_share.agent.cdi import (
    MAX_FOREIGN_FILES,
    MAX_SPEC_BYTES,
    CdiSpecWriter,
    read_foreign_specs,
)
from gpu_share.config.model import AgentConfig
from gpu_share.devices.dummy import DummyBackend
from gpu_share.sharing.dra.cdi import claim_spec_file_name

KIND = "vendor.com/npu"


def _cfg(*strategies: str) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "backend": "dummy",
            "runtime": {"deviceListStrategy": list(strategies), "cdiKind": KIND},
            "dummy": {"deviceCount": 2},
        }
    )


def _writer(tmp_path: Path, *strategies: str) -> CdiSpecWriter:
    cfg = _cfg(*strategies)
    backend = DummyBackend(cfg.dummy, "node-a")
    return CdiSpecWriter(
        cfg,
        backend.devices(),
        backend.naming(),
        spec_dir=str(tmp_path / "run"),
        scan_dirs=(str(tmp_path / "etc"), str(tmp_path / "run")),
    )


def test_write_and_remove(tmp_path: Path) -> None:
    w = _writer(tmp_path, "cdi-cri")
    path = w.write()
    assert path == tmp_path / "run" / "gpu-share_vendor.com-npu.json"
    assert path.stat().st_mode & 0o777 == 0o644
    doc = json.loads(path.read_text())
    assert doc["kind"] == KIND
    assert [d["containerEdits"]["deviceNodes"][0]["path"] for d in doc["devices"]] == [
        "/dev/dummy-npu0",
        "/dev/dummy-npu1",
    ]
    assert doc["containerEdits"]["deviceNodes"][0]["path"] == "/dev/dummy-npuctl"
    # Rewriting (a restart) does not take our own file for another spec.
    assert w.write() == path
    assert len(json.loads(path.read_text())["devices"]) == 2
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    other = path.parent / "other.json"
    other.write_text("{}")
    assert w.remove() is True
    assert not path.exists() and other.exists()
    assert w.remove() is False


def test_nothing_without_a_cdi_strategy(tmp_path: Path) -> None:
    w = _writer(tmp_path, "envvar")
    assert w.write() is None
    assert not (tmp_path / "run").exists()
    assert w.remove() is False


def test_nvidia_ctk_yaml_in_etc_cdi_is_not_duplicated(tmp_path: Path) -> None:
    w = _writer(tmp_path, "cdi-annotations")
    (tmp_path / "etc").mkdir()
    first = w.devices[0]
    (tmp_path / "etc" / "vendor.yaml").write_text(
        yaml.safe_dump(
            {
                "cdiVersion": "0.5.0",
                "kind": KIND,
                "devices": [{"name": first.uuid, "containerEdits": {"env": ["A=1"]}}],
            }
        )
    )
    path = w.write()
    assert path is not None
    assert [d["name"] for d in json.loads(path.read_text())["devices"]] == [w.devices[1].uuid]
    assert w.plan is not None
    assert w.plan.referenced == ((first.uuid, str(tmp_path / "etc" / "vendor.yaml")),)


def test_all_devices_elsewhere_removes_our_file(tmp_path: Path) -> None:
    w = _writer(tmp_path, "cdi-cri")
    path = w.write()
    assert path is not None
    spec = json.loads(path.read_text())
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "theirs.json").write_text(json.dumps(spec))
    assert w.write() is None
    assert not path.exists()


def test_unreadable_or_huge_files_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "etc"
    d.mkdir()
    (d / "bad.yaml").write_text("kind: [unclosed")
    (d / "huge.json").write_bytes(b" " * (MAX_SPEC_BYTES + 1))
    (d / "notes.txt").write_text("not a spec")
    (d / "ok.json").write_text(json.dumps({"kind": KIND, "devices": [{"name": "x"}]}))
    found = read_foreign_specs([str(d), str(tmp_path / "missing")], KIND, d / "ours.json")
    assert [f.path for f in found] == [str(d / "ok.json")]
    assert "bad.yaml" in caplog.text and "huge.json" in caplog.text


def test_claim_specs_do_not_hide_another_vendors_spec(tmp_path: Path) -> None:
    """In DRA mode the agent writes one spec per prepared claim into the same dir. More
    of them than MAX_FOREIGN_FILES must not stop the scan before another vendor's spec
    (here sorted after them) that defines our devices: they are ours and skipped."""
    w = _writer(tmp_path, "cdi-cri")
    run = tmp_path / "run"
    run.mkdir()
    driver = _cfg("cdi-cri").dra.driver_name
    for i in range(MAX_FOREIGN_FILES + 5):
        (run / claim_spec_file_name(driver, f"{i:08d}-0000-4000-8000-000000000000")).write_text(
            json.dumps({"cdiVersion": "0.6.0", "kind": f"{driver}/claim", "devices": []}))
    uuids = [d.uuid for d in DummyBackend(_cfg("cdi-cri").dummy, "node-a").devices()]
    (run / "zz-vendor.json").write_text(json.dumps(
        {"kind": KIND, "devices": [{"name": u, "containerEdits": {}} for u in uuids]}))
    assert w.write() is None  # every device is defined by the vendor's spec: none of ours
    assert w.plan is not None and {u for u, _ in w.plan.referenced} == set(uuids)


def test_failed_write_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _writer(tmp_path, "cdi-cri")

    def boom(src: str, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        w.write()
    assert list((tmp_path / "run").iterdir()) == []
