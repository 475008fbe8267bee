"""The node agent's CDI spec file: written at start for the pool's devices, removed on a
clean exit (so an uninstall leaves none behind). Only for pools whose deviceListStrategy
uses CDI (cdi-annotations / cdi-cri); otherwise both calls do nothing.

What the spec holds and the interop rule with other specs of the same kind (nvidia-ctk)
are in ``sharing/cdi.py`` and docs/enforcement.md ("CDI").
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

from gpu_share.agent.files import write_atomic
from gpu_share.config.model import AgentConfig, EnforcementMode
from gpu_share.devices.base import Device, RuntimeNaming
from gpu_share.sharing.cdi import (
    DYNAMIC_SPEC_DIR,
    STATIC_SPEC_DIR,
    CdiPlan,
    ForeignSpec,
    claim_spec_prefix,
    foreign_spec,
    memory_limits_spec,
    plan_spec,
    spec_file_name,
    uses_cdi,
)

log = logging.getLogger(__name__)

# Reading the other specs is bounded: a spec dir holds a handful of small files.
MAX_FOREIGN_FILES = 256
MAX_SPEC_BYTES = 4 << 20
SPEC_SUFFIXES = (".json", ".yaml", ".yml")
SPEC_MODE = 0o644


def _parse(data: bytes, suffix: str) -> object:
    if suffix == ".json":
        return json.loads(data)
    return yaml.safe_load(data)


def read_foreign_specs(
    dirs: Iterable[str], kind: str, own: Path, ours_prefix: str | None = None
) -> list[ForeignSpec]:
    """Specs of ``kind`` in ``dirs`` other than ``own`` and files named ``ours_prefix*``
    (the agent's per-claim specs in DRA mode: one per prepared claim, so many, and they
    must not use up the ``MAX_FOREIGN_FILES`` budget before another vendor's spec is
    seen). Unreadable or malformed files are skipped with a warning: the runtime ignores
    them too."""
    found: list[ForeignSpec] = []
    seen = 0
    for d in dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue  # no such dir: nothing defined there
        for name in names:
            path = Path(d) / name
            if path.suffix not in SPEC_SUFFIXES or name.startswith(".") or path == own:
                continue
            if ours_prefix and name.startswith(ours_prefix):
                continue
            seen += 1
            if seen > MAX_FOREIGN_FILES:
                log.warning("CDI: more than %d spec files; the rest are not checked", seen - 1)
                return found
            spec = _read_one(path, kind)
            if spec is not None:
                found.append(spec)
    return found


def _read_one(path: Path, kind: str) -> ForeignSpec | None:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_SPEC_BYTES + 1)
        if len(data) > MAX_SPEC_BYTES:
            raise ValueError(f"larger than {MAX_SPEC_BYTES} bytes")
        return foreign_spec(str(path), _parse(data, path.suffix), kind)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        log.warning("CDI: skipping spec file %s: %s", path, exc)
        return None


class CdiSpecWriter:
    """``write()`` at agent start (after the backend started), ``remove()`` on clean exit.

    ``spec_dir``: where our file goes (the runtime's transient dir); ``scan_dirs``: where
    other specs of our kind are looked for. Inside the agent container both are the host
    dirs mounted at the same paths (charts/gpu-share mounts them for CDI pools).
    """

    def __init__(
        self,
        cfg: AgentConfig,
        devices: Sequence[Device],
        naming: RuntimeNaming | None = None,
        *,
        spec_dir: str = DYNAMIC_SPEC_DIR,
        scan_dirs: Sequence[str] = (STATIC_SPEC_DIR, DYNAMIC_SPEC_DIR),
    ) -> None:
        self.kind = cfg.runtime.cdi_kind
        self.enabled = uses_cdi(cfg.runtime)
        self.devices = list(devices)
        self.naming = naming
        self.path = Path(spec_dir) / spec_file_name(self.kind)
        self.scan_dirs = tuple(scan_dirs)
        self.claim_prefix = claim_spec_prefix(cfg.dra.driver_name)
        self.plan: CdiPlan | None = None
        # nvidia-memory-limits: the toolkit's hook as hook-only devices of their own kind
        # (a DRA claim's spec carries the hook itself).
        nml = cfg.runtime.nvidia_memory_limits
        self.hook_spec = (
            memory_limits_spec(nml.cdi_kind, self.devices, nml.hook_path, nml.driver_root)
            if cfg.runtime.enforcement in (EnforcementMode.NVIDIA_MEMORY_LIMITS,
                                           EnforcementMode.AUTO)
            and not cfg.dra.enabled else None
        )
        self.hook_path = Path(spec_dir) / spec_file_name(nml.cdi_kind)

    def write(self) -> Path | None:
        """Writes (atomically, 0644) or refreshes our spec; returns its path, or None when
        CDI is off or every device is defined by another spec (then no file of ours)."""
        if not self.enabled:
            return None
        if self.hook_spec is not None:
            data = (json.dumps(self.hook_spec, indent=2, sort_keys=True) + "\n").encode()
            write_atomic(self.hook_path, data, SPEC_MODE)
            log.info("CDI: wrote %s (the memory-limits hook per GPU)", self.hook_path)
        foreign = read_foreign_specs(self.scan_dirs, self.kind, self.path, self.claim_prefix)
        plan = plan_spec(self.kind, self.devices, self.naming, foreign)
        self.plan = plan
        self._report(plan)
        if plan.spec is None:
            self.path.unlink(missing_ok=True)
            return None
        data = (json.dumps(plan.spec, indent=2, sort_keys=True) + "\n").encode()
        write_atomic(self.path, data, SPEC_MODE)
        log.info(
            "CDI: wrote %s (%d device(s) of kind %s)",
            self.path,
            len(plan.spec["devices"]),
            self.kind,
        )
        return self.path

    def remove(self) -> bool:
        """Removes our spec file; True if there was one. Never touches other files."""
        if not self.enabled:
            return False
        if self.hook_spec is not None:
            self.hook_path.unlink(missing_ok=True)
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        log.info("CDI: removed %s", self.path)
        return True

    def _report(self, plan: CdiPlan) -> None:
        for uuid, path in plan.referenced:
            log.info("CDI: %s=%s is defined by %s; not duplicated", self.kind, uuid, path)
        for uuid, path, names in plan.shadowed:
            log.warning(
                "CDI: %s defines device %s only as %s=%s; %s=%s will not resolve. "
                "Regenerate that spec with device names by UUID (nvidia-ctk cdi generate "
                "--device-name-strategy=uuid) or use another runtime.cdiKind",
                path,
                uuid,
                self.kind,
                ",".join(names),
                self.kind,
                uuid,
            )
        for uuid in plan.invalid:
            log.warning("CDI: device id %r is not a valid CDI device name; left out", uuid)
