"""The DRA plugin's checkpoint (``<pluginDir>/checkpoint.json``): the claims this node
has prepared, each with its CDI spec, cache dir and shares, so that prepare answers again
after a restart without the API server and a pool switched back to device-plugin mode
knows what DRA left on the host (agent/dra/leftovers.py).

Written atomically (0600). A file that cannot be read as ours is renamed aside
(``checkpoint.json.corrupt-<time>``) with an error log line, and the reader starts with
none.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_share.agent.dra.ports import PreparedDevice
from gpu_share.agent.files import write_atomic
from gpu_share.errors import InputError
from gpu_share.sharing.dra.claims import CLAIM_UID
from gpu_share.sharing.model import DeviceShare

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_VERSION = "v1"
CHECKPOINT_MODE = 0o600
MAX_CHECKPOINT_BYTES = 16 << 20


class CheckpointError(InputError):
    """The checkpoint is not one this driver wrote."""


@dataclass(frozen=True)
class PreparedClaim:
    """One prepared claim as the checkpoint keeps it."""

    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    spec: Mapping[str, Any]  # the CDI spec written for it
    host_dir: str = ""  # hami-core cache dir key, "" when none
    shares: tuple[DeviceShare, ...] = ()  # what it holds of each device (capacity check)

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "devices": [
                {
                    "requests": list(d.requests),
                    "pool": d.pool,
                    "device": d.device,
                    "cdiDeviceIds": list(d.cdi_device_ids),
                }
                for d in self.devices
            ],
            "spec": self.spec,
            "hostDir": self.host_dir,
            "shares": [
                {"device": h.device, "memoryUnits": h.memory_units, "cores": h.cores,
                 "exclusive": h.exclusive}
                for h in self.shares
            ],
        }

    @classmethod
    def from_json(cls, raw: Any) -> PreparedClaim:
        if not isinstance(raw, dict) or not isinstance(raw.get("spec"), dict):
            raise CheckpointError("a claim entry is not an object with a spec")
        devices = tuple(_device_from_json(d) for d in _list(raw.get("devices")))
        return cls(
            namespace=_str(raw.get("namespace")),
            name=_str(raw.get("name")),
            devices=devices,
            spec=raw["spec"],
            host_dir=_str(raw.get("hostDir", "")),
            shares=tuple(_share_from_json(h) for h in _list(raw.get("shares", []))),
        )


def _list(v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise CheckpointError(f"expected a list, found {type(v).__name__}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise CheckpointError(f"expected a string, found {type(v).__name__}")
    return v


def _device_from_json(raw: Any) -> PreparedDevice:
    if not isinstance(raw, dict):
        raise CheckpointError("a device entry is not an object")
    return PreparedDevice(
        requests=tuple(_str(r) for r in _list(raw.get("requests"))),
        pool=_str(raw.get("pool")),
        device=_str(raw.get("device")),
        cdi_device_ids=tuple(_str(i) for i in _list(raw.get("cdiDeviceIds"))),
    )


def _share_from_json(raw: Any) -> DeviceShare:
    if not isinstance(raw, dict):
        raise CheckpointError("a share entry is not an object")
    exclusive = raw.get("exclusive")
    if not isinstance(exclusive, bool):
        raise CheckpointError("a share entry has no exclusive flag")
    return DeviceShare(_str(raw.get("device")), _count(raw.get("memoryUnits")),
                       _count(raw.get("cores")), exclusive)


def _count(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 1 << 30:
        raise CheckpointError("a share entry has a bad count")
    return v


def json_bytes(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


class Checkpoint:
    """The file at ``path`` for ``driver``; ``wall`` names quarantined copies."""

    def __init__(self, path: Path, driver: str, wall: Callable[[], float]) -> None:
        self.path = path
        self.driver = driver
        self._wall = wall

    def write(self, claims: Mapping[str, PreparedClaim]) -> None:
        doc = {
            "version": CHECKPOINT_VERSION,
            "driver": self.driver,
            "claims": {uid: p.to_json() for uid, p in sorted(claims.items())},
        }
        write_atomic(self.path, json_bytes(doc), CHECKPOINT_MODE)

    def exists(self) -> bool:
        return self.path.exists()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def load(self) -> dict[str, PreparedClaim]:
        try:
            with self.path.open("rb") as fh:
                data = fh.read(MAX_CHECKPOINT_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.error("DRA: cannot read the checkpoint %s: %s; starting without it",
                      self.path, exc)
            return {}
        try:
            claims = self.parse(data)
        except (CheckpointError, ValueError, RecursionError) as exc:
            self._quarantine(exc)
            return {}
        log.info("DRA: %d prepared claim(s) in the checkpoint %s", len(claims), self.path)
        return claims

    def parse(self, data: bytes) -> dict[str, PreparedClaim]:
        if len(data) > MAX_CHECKPOINT_BYTES:
            raise CheckpointError(f"larger than {MAX_CHECKPOINT_BYTES} bytes")
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise CheckpointError("not a JSON object")
        if doc.get("version") != CHECKPOINT_VERSION:
            raise CheckpointError(f"version {str(doc.get('version'))[:40]!r} is not "
                                  f"{CHECKPOINT_VERSION}")
        if doc.get("driver") != self.driver:
            raise CheckpointError(f"written for driver {str(doc.get('driver'))[:80]!r}")
        raw = doc.get("claims")
        if not isinstance(raw, dict):
            raise CheckpointError("claims is not an object")
        claims = {}
        for uid, entry in raw.items():
            if not CLAIM_UID.match(uid):
                raise CheckpointError(f"claim uid {uid[:80]!r} is not a valid name")
            claims[uid] = PreparedClaim.from_json(entry)
        return claims

    def _quarantine(self, why: Exception) -> None:
        aside = self.path.with_name(f"{CHECKPOINT_FILE}.corrupt-{int(self._wall())}")
        try:
            os.replace(self.path, aside)
            moved = f"moved to {aside}"
        except OSError as exc:
            moved = f"could not be moved aside ({exc})"
        log.error("DRA: the checkpoint %s is unusable (%s); %s. Starting without it: "
                  "prepared claims are read from the API server again",
                  self.path, why, moved, extra={"reason": "CheckpointCorrupt"})
