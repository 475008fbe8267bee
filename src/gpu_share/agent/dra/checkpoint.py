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
from typing import Annotated, Any

from pydantic import Field, model_validator

from gpu_share.agent.dra.ports import CHECKPOINT_FILE, PreparedDevice
from gpu_share.agent.files import write_atomic
from gpu_share.errors import InputError
from gpu_share.sharing.dra.claims import CLAIM_UID
from gpu_share.sharing.model import DeviceShare
from gpu_share.sharing.untrusted import (
    MAX_ITEMS,
    MAX_NAME,
    Count,
    Document,
    Name,
    read_json,
    shown,
)

log = logging.getLogger(__name__)

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


_Texts = Annotated[list[Annotated[str, Field(max_length=MAX_NAME)]], Field(max_length=MAX_ITEMS)]


class _Device(Document):
    requests: _Texts
    pool: Name
    device: Name
    cdi_device_ids: _Texts = Field(alias="cdiDeviceIds")

    def prepared(self) -> PreparedDevice:
        return PreparedDevice(tuple(self.requests), self.pool, self.device,
                              tuple(self.cdi_device_ids))


class _Share(Document):
    device: Name
    memory_units: Count = Field(alias="memoryUnits")
    cores: Count
    exclusive: bool


class _Claim(Document):
    namespace: Name
    name: Name
    devices: Annotated[list[_Device], Field(max_length=MAX_ITEMS)]
    spec: dict[str, Any]
    host_dir: Name = Field(default="", alias="hostDir")
    shares: Annotated[list[_Share], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)

    def prepared(self) -> PreparedClaim:
        return PreparedClaim(
            self.namespace, self.name, tuple(d.prepared() for d in self.devices), self.spec,
            self.host_dir,
            tuple(DeviceShare(h.device, h.memory_units, h.cores, h.exclusive)
                  for h in self.shares),
        )


class _File(Document):
    version: str
    driver: str
    claims: dict[str, _Claim]

    @model_validator(mode="before")
    @classmethod
    def _version_first(cls, raw: Any) -> Any:
        # Another version is named as such, before its claims are judged.
        if isinstance(raw, dict) and raw.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"version {shown(raw.get('version'))} is not {CHECKPOINT_VERSION}")
        return raw


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
        doc = read_json(_File, data, "checkpoint", CheckpointError)
        if doc.driver != self.driver:
            raise CheckpointError(f"written for driver {shown(doc.driver)}")
        for uid in doc.claims:
            if not CLAIM_UID.match(uid):
                raise CheckpointError(f"claim uid {shown(uid)} is not a valid name")
        return {uid: c.prepared() for uid, c in doc.claims.items()}

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
