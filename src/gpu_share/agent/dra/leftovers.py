"""What a DRA pool leaves on the host when it is switched back to device-plugin mode: the
checkpoint (``<dra.pluginDir>/checkpoint.json``), each prepared claim's CDI spec and its
hami-core cache dir.

A prepared claim may still be in use after the switch: the kubelet keeps the claims of
running pods prepared and restarts their containers from the claim's CDI spec, with no
DRA driver involved. So each claim of the checkpoint is read from the API server, at
start in device-plugin mode and then every ``RECHECK_S`` until none is left:

- gone, a new claim under its name (another uid), or no allocation: no pod can use it.
  Its CDI spec, cache dir and checkpoint entry go; the checkpoint file goes with its
  last claim.
- still allocated, unreadable, or no API server to ask: kept. The devices it holds take
  no device-plugin slice until it goes (held back as a cordon is): a slice there would
  over-commit what the claim holds. The node gets a ``DraClaimsHeld`` Event and the
  devices count as cordoned in the device metrics.

It is also the ``ClaimPreparer`` of a DRA plugin the agent keeps registered while such
claims are left (cli/plugin_main.py): the kubelet tears a pod down only after its claims
are unprepared, so ``unprepare`` releases a left claim at once; ``prepare`` answers a
left claim from the checkpoint (a container restart) and refuses any other (the pool
publishes no ResourceSlice, so none should come).

Nothing here deletes what a kept claim needs; a file that cannot be removed is retried at
the next pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpu_share.agent.cdi import SPEC_MODE
from gpu_share.agent.dra.checkpoint import Checkpoint, PreparedClaim, json_bytes
from gpu_share.agent.dra.claims import ClaimSource
from gpu_share.agent.dra.ports import CHECKPOINT_FILE, ClaimRef, PrepareResult
from gpu_share.agent.files import write_atomic
from gpu_share.agent.hostdirs import HostDirs
from gpu_share.config.model import AgentConfig
from gpu_share.errors import KubeAccessError
from gpu_share.kube.resourceclaims import ClaimNotFoundError
from gpu_share.sharing.dra.cdi import claim_spec_file_name

log = logging.getLogger(__name__)

RECHECK_S = 30.0
REFUSED = ("this node's pool runs in device-plugin mode: it prepares no new DRA claim "
           "(only those prepared before the switch)")


def released(uid: str, claim: PreparedClaim, source: ClaimSource | None) -> bool:
    """True when no pod can use the prepared claim ``uid`` any more; False when it may
    (allocated), or when that cannot be known (no API server, a read that failed)."""
    if source is None:
        return False
    try:
        obj: Mapping[str, Any] = source.get_claim(claim.namespace, claim.name)
    except ClaimNotFoundError:
        return True
    except KubeAccessError as exc:
        log.warning("DRA leftovers: claim %s/%s unreadable (%s): kept",
                    claim.namespace, claim.name, exc)
        return False
    meta, status = obj.get("metadata"), obj.get("status")
    if not isinstance(meta, dict) or meta.get("uid") != uid:
        return True
    return not (isinstance(status, dict) and status.get("allocation"))


class DraLeftovers:
    """The checkpoint a DRA pool left, read and cleaned from device-plugin mode.

    ``hold``: told the devices the kept claims hold (empty when none is left); a kept
    claim whose shares the checkpoint does not say holds every device of ``devices()``.
    ``event``: a node Event (reason, message) when claims keep devices held.
    """

    def __init__(
        self,
        cfg: AgentConfig,
        *,
        hold: Callable[[Collection[str]], None],
        devices: Callable[[], Collection[str]],
        event: Callable[[str, str], None] = lambda reason, message: None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        driver = cfg.dra.driver_name
        self._driver = driver
        self._cdi_dir = Path(cfg.dra.cdi_dir)
        self._dirs = HostDirs(cfg.runtime.hami_core.cache_dir)
        self._checkpoint = Checkpoint(Path(cfg.dra.plugin_dir) / CHECKPOINT_FILE, driver,
                                      wall_clock)
        self._hold = hold
        self._devices = devices
        self._event = event
        self._claims: dict[str, PreparedClaim] = {}
        self._told: frozenset[str] = frozenset()
        self._lock = threading.Lock()  # _claims, the files, the hold
        self._changed = threading.Event()  # an unprepare, or ``wake``

    @property
    def pending(self) -> int:
        """Prepared claims left that may still be in use."""
        with self._lock:
            return len(self._claims)

    # -- ClaimPreparer (the kubelet, while claims are left)

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        out = {}
        with self._lock:
            for ref in claims:
                known = self._claims.get(ref.uid)
                if known is None:
                    out[ref.uid] = PrepareResult(error=REFUSED)
                    continue
                spec = self._spec_path(ref.uid)
                if not spec.exists():  # /var/run after a reboot: the runtime needs it
                    write_atomic(spec, json_bytes(known.spec), SPEC_MODE)
                out[ref.uid] = PrepareResult(devices=known.devices)
        return out

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        out = {}
        with self._lock:
            for ref in claims:
                known = self._claims.get(ref.uid)
                if known is not None and not self._clean(ref.uid, known):
                    out[ref.uid] = "its CDI spec or cache dir could not be removed (retried)"
                    continue
                self._claims.pop(ref.uid, None)
                out[ref.uid] = ""
            self._save()
            self._apply()
        self._changed.set()
        return out

    def wait(self, timeout_s: float) -> None:
        """Until the next unprepare or ``wake``, at most ``timeout_s``."""
        self._changed.wait(timeout_s)
        self._changed.clear()

    def wake(self) -> None:
        self._changed.set()

    def load(self) -> bool:
        """Read the checkpoint and hold back the devices of every claim in it (no API
        read: call before any device is advertised); True when it holds claims (then
        ``step`` until it returns True)."""
        if not self._checkpoint.exists():
            return False
        with self._lock:
            self._claims = self._checkpoint.load()
            if not self._claims:
                self._checkpoint.remove()
                return False
            log.info("DRA leftovers: %d claim(s) prepared before the switch to "
                     "device-plugin mode", len(self._claims))
            self._apply()
        return True

    def step(self, source: ClaimSource | None) -> bool:
        """One pass with ``source`` (None: no API server): release what no pod can use,
        hold back what may be used. True when nothing is left."""
        with self._lock:
            left = list(self._claims.items())
        gone = [(uid, claim) for uid, claim in left if released(uid, claim, source)]
        with self._lock:
            for uid, claim in gone:
                if self._claims.get(uid) is claim and self._clean(uid, claim):
                    del self._claims[uid]
            self._save()
            self._apply()
            return not self._claims

    def _apply(self) -> None:
        held = frozenset(s.device for c in self._claims.values() for s in c.shares)
        if any(not c.shares for c in self._claims.values()):
            held = frozenset(self._devices())
        self._hold(held)
        self._report(held)

    def _clean(self, uid: str, claim: PreparedClaim) -> bool:
        """Remove the claim's CDI spec and cache dir; False when one is left (retried)."""
        try:
            self._spec_path(uid).unlink(missing_ok=True)
            if claim.host_dir and Path(self._dirs.path(claim.host_dir)).exists():
                self._dirs.trash(claim.host_dir)
                self._dirs.sweep()
        except (OSError, ValueError) as exc:
            log.warning("DRA leftovers: claim %s/%s (%s) not cleaned: %s",
                        claim.namespace, claim.name, uid, exc)
            return False
        log.info("DRA leftovers: claim %s/%s (%s) ended: its CDI spec and cache dir removed",
                 claim.namespace, claim.name, uid)
        return True

    def _spec_path(self, uid: str) -> Path:
        return self._cdi_dir / claim_spec_file_name(self._driver, uid)

    def _save(self) -> None:
        try:
            if self._claims:
                self._checkpoint.write(self._claims)
            else:
                self._checkpoint.remove()
        except OSError as exc:
            log.warning("DRA leftovers: checkpoint %s not updated: %s",
                        self._checkpoint.path, exc)

    def _report(self, held: frozenset[str]) -> None:
        if held == self._told:
            return
        self._told = held
        if held:
            names = ", ".join(sorted(f"{c.namespace}/{c.name}" for c in self._claims.values()))
            self._event("DraClaimsHeld",
                        f"{len(self._claims)} claim(s) prepared in DRA mode may still be in "
                        f"use ({names[:300]}): devices {', '.join(sorted(held))} take no "
                        "new slice until they end")
        else:
            log.info("DRA leftovers: no claim left; every device takes slices again")
