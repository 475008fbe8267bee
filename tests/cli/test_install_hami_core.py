"""``gpu-share install-hami-core`` (the chart's init container): what it writes is what
the agent's enforcement check accepts; a source that does not match its checksum writes
nothing; an identical library is left in place."""

from __future__ import annotations

import _ctypes
import hashlib
import os
import shutil
from pathlib import Path

import yaml

from gpu_share.agent import enforcement
from gpu_share.cli import admin
from gpu_share.config.model import RuntimeConfig


def _source(d: Path) -> Path:
    src = d / "image"
    src.mkdir()
    shutil.copyfile(str(_ctypes.__file__), src / "libvgpu.so")
    digest = hashlib.sha256((src / "libvgpu.so").read_bytes()).hexdigest()
    (src / "libvgpu.so.sha256").write_text(f"{digest}\n")
    (src / "LICENSE").write_text("Apache License 2.0\n")
    (src / "VERSION").write_text("HAMi-core test\n")
    return src


def _config(d: Path, mode: str = "hami-core") -> tuple[Path, dict[str, str]]:
    hc = {"libraryPath": str(d / "node" / "vgpu" / "libvgpu.so"),
          "preloadPath": str(d / "node" / "etc" / "ld.so.preload"),
          "cacheDir": str(d / "node" / "cache")}
    path = d / "config.yaml"
    path.write_text(yaml.safe_dump(
        {"version": "v1", "backend": "dummy", "runtime": {"enforcement": mode, "hamiCore": hc}}))
    return path, hc


def test_what_it_installs_is_what_the_agent_accepts(tmp_path: Path) -> None:
    src = _source(tmp_path)
    cfg, hc = _config(tmp_path)
    assert admin.main(["install-hami-core", "--config", str(cfg), "--source", str(src)]) == 0
    os.makedirs(hc["cacheDir"])
    runtime = RuntimeConfig.model_validate({"enforcement": "hami-core", "hamiCore": hc})
    assert enforcement.check(runtime).ready, enforcement.check(runtime).describe()
    lib = Path(hc["libraryPath"])
    assert (lib.parent / "hami-core.LICENSE").read_text().startswith("Apache")
    assert Path(hc["preloadPath"]).read_text() == f"{lib}\n"
    # Again: the same library stays (same inode), the rest is rewritten.
    inode = lib.stat().st_ino
    assert admin.main(["install-hami-core", "--config", str(cfg), "--source", str(src)]) == 0
    assert lib.stat().st_ino == inode


def test_a_source_not_matching_its_checksum_writes_nothing(tmp_path: Path) -> None:
    src = _source(tmp_path)
    with (src / "libvgpu.so").open("ab") as f:
        f.write(b"tampered")
    cfg, hc = _config(tmp_path)
    assert admin.main(["install-hami-core", "--config", str(cfg), "--source", str(src)]) == 1
    assert not Path(hc["libraryPath"]).exists() and not Path(hc["preloadPath"]).exists()


def test_other_modes_install_nothing(tmp_path: Path) -> None:
    src = _source(tmp_path)
    cfg, hc = _config(tmp_path, mode="none")
    assert admin.main(["install-hami-core", "--config", str(cfg), "--source", str(src)]) == 0
    assert not Path(hc["libraryPath"]).exists()
