"""The agent's side of DRA's NodePrepareResources / NodeUnprepareResources:
``DraClaimPreparer`` implements ``agent.dra.ports.ClaimPreparer``.

Prepare, per claim: read it (one GET), check that it is the claim the kubelet means
(uid), read our devices and shares in it (``sharing.dra.claims``), build the runtime
response with the device-plugin mode's builder (``agent.response.build``) and write it as
one CDI spec for the claim (atomic, 0644, ``<cdiDir>/<driver>-claim_<uid>.json``), then
record the answer in the checkpoint (``<pluginDir>/checkpoint.json``, atomic).

- Idempotent: a claim in the checkpoint answers from it, with no API read, also after a
  restart (its CDI spec is written again if it is gone, e.g. /var/run after a reboot).
- Unprepare needs the uid only: the spec file and the checkpoint entry go (and the
  hami-core cache dir of the claim); an unknown uid is done.
- A corrupt or unknown checkpoint is renamed aside (``checkpoint.json.corrupt-<time>``)
  with an error log line, and the agent starts with none: claims are then read again.
- Thread-safe: the kubelet may call for several claims at once. One claim's work is
  serialised by a lock of its uid; the checkpoint by one lock.
- Capacity: a claim that would over-commit a device with the claims prepared here is
  refused. The kubelet unprepares a finished pod's claims only after the API has
  deallocated (often deleted) them, so the scheduler may already have given their
  capacity to a new claim: on a conflict the holders are read again, and one that is
  gone, now names another claim, or has no allocation (so no pod can be using it) no
  longer counts, though it stays prepared until its unprepare. A holder that cannot be
  read still counts.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from gpu_share.agent.cdi import SPEC_MODE
from gpu_share.agent.dra.checkpoint import Checkpoint, PreparedClaim, json_bytes
from gpu_share.agent.dra.ports import CHECKPOINT_FILE, ClaimRef, PreparedDevice, PrepareResult
from gpu_share.agent.enforcement import EnforcementStatus
from gpu_share.agent.enforcement import check as check_enforcement
from gpu_share.agent.files import write_atomic
from gpu_share.agent.hostdirs import HostDirs, seed_region
from gpu_share.agent.response import build
from gpu_share.config.model import AgentConfig, EnforcementMode, RuntimeConfig
from gpu_share.devices.base import Device, RuntimeNaming
from gpu_share.errors import GpuShareError, KubeAccessError
from gpu_share.kube.resourceclaims import ClaimNotFoundError
from gpu_share.sharing.cdi import uses_cdi
from gpu_share.sharing.dra.cdi import claim_cdi_device_id, claim_cdi_spec, claim_spec_file_name
from gpu_share.sharing.dra.claims import (
    CLAIM_UID,
    ParsedClaim,
    enforcement_for,
    memory_cap_mib,
    over_capacity,
    parse_claim,
)
from gpu_share.sharing.dra.reading import ClaimError, ClaimReason
from gpu_share.sharing.inventory import Inventory
from gpu_share.sharing.model import AllocateSpec, ContainerRef, DeviceShare
from gpu_share.sharing.node.ledger import EntrySource, LedgerEntry

log = logging.getLogger(__name__)

LOCK_STRIPES = 64
# The claim as the response builder's container: "<claim>/claim" in its slice annotation.
CLAIM_CONTAINER = "claim"


class ClaimSource(Protocol):
    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The claim as JSON; raises KubeAccessError (ClaimNotFoundError on 404)."""
        ...


class DraClaimPreparer:
    """``ClaimPreparer`` of the node agent (see the module docstring).

    ``inventory``: the engine's device table as it is at the call (as for
    ``response.RuntimeResponses``); ``naming``: the backend's runtime naming.
    """

    def __init__(
        self,
        cfg: AgentConfig,
        source: ClaimSource,
        inventory: Callable[[], Inventory],
        naming: RuntimeNaming,
        *,
        host_dirs: HostDirs | None = None,
        wall_clock: Callable[[], float] = time.time,
        enforcement: Callable[[], EnforcementStatus] | None = None,
        on_refused: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.cfg = cfg
        self.driver = cfg.dra.driver_name
        self.pool = cfg.node_name
        self.cdi_dir = Path(cfg.dra.cdi_dir)
        self.checkpoint = Checkpoint(Path(cfg.dra.plugin_dir) / CHECKPOINT_FILE,
                                     self.driver, wall_clock)
        self._source = source
        self._inventory = inventory
        self._naming = naming
        self._host_dirs = host_dirs
        self._wall = wall_clock
        self._enforcement = enforcement  # None: not checked (tests of the claim path)
        self._on_refused = on_refused  # a metric, by reason
        self._lock = threading.Lock()  # _claims and the checkpoint file
        self._stripes = [threading.Lock() for _ in range(LOCK_STRIPES)]
        self._claims: dict[str, PreparedClaim] = self.checkpoint.load()
        # Claims being prepared now (checked against capacity, not yet recorded).
        self._reserved: dict[str, tuple[DeviceShare, ...]] = {}
        # Prepared claims the API has deallocated: awaiting unprepare, holding nothing.
        self._finished: set[str] = set()

    # -- ClaimPreparer

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        return {c.uid: self._prepare_one(c) for c in claims}

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        return {c.uid: self._unprepare_one(c) for c in claims}

    def prepared(self) -> dict[str, tuple[PreparedDevice, ...]]:
        """uid -> devices of every prepared claim (status, tests)."""
        with self._lock:
            return {uid: p.devices for uid, p in self._claims.items()}

    # -- one claim

    def _stripe(self, uid: str) -> threading.Lock:
        digest = hashlib.sha256(uid.encode("utf-8", "replace")).digest()
        return self._stripes[digest[0] % LOCK_STRIPES]

    def _prepare_one(self, ref: ClaimRef) -> PrepareResult:
        if not CLAIM_UID.match(ref.uid):
            return PrepareResult(error=f"claim uid {ref.uid[:80]!r} is not a valid name")
        with self._stripe(ref.uid):
            with self._lock:
                known = self._claims.get(ref.uid)
            try:
                if known is not None:
                    self._restore(ref.uid, known)
                    return PrepareResult(devices=known.devices)
                return PrepareResult(devices=self._prepare_new(ref))
            except (GpuShareError, OSError) as exc:
                reason = str(getattr(exc, "reason", "OSError"))
                log.warning("DRA: cannot prepare claim %s/%s (%s): %s",
                            ref.namespace, ref.name, ref.uid, exc, extra={"reason": reason})
                self._on_refused(reason)
                return PrepareResult(error=f"claim {ref.namespace}/{ref.name}: {exc}")

    def _prepare_new(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        status = self._enforcement() if self._enforcement is not None else None
        if status is not None and not status.ready:  # prepared claims stay, no new one
            raise ClaimError(status.describe(), ClaimReason.ENFORCEMENT_UNAVAILABLE)
        obj = self._source.get_claim(ref.namespace, ref.name)
        inv = self._inventory()
        claim = parse_claim(obj, uid=ref.uid, driver=self.driver, pool=self.pool,
                            inventory=inv)
        self._reserve(claim, inv)
        try:
            return self._write_new(claim, inv)
        finally:
            with self._lock:
                self._reserved.pop(claim.uid, None)

    def _reserve(self, claim: ParsedClaim, inv: Inventory) -> None:
        """Refuse a claim that would over-commit a device with the claims prepared (or
        being prepared) here: the scheduler never allocates so, but a forged or stale
        claim status must not give a container more than the device has. On a conflict,
        holders the API has deallocated stop counting (module docstring), once."""
        why = self._try_reserve(claim, inv)
        if why is not None and self._drop_finished(self._holders(claim)):
            why = self._try_reserve(claim, inv)
        if why is not None:
            raise ClaimError(why, ClaimReason.OVER_CAPACITY)

    def _try_reserve(self, claim: ParsedClaim, inv: Inventory) -> str | None:
        """Reserves the claim's shares if they fit beside the counted ones, else why not."""
        with self._lock:
            held = [
                *(h for _, p in self._counted(claim.uid) for h in p.shares),
                *(h for u, r in self._reserved.items() if u != claim.uid for h in r),
            ]
            why = over_capacity(held, claim.shares, inv)
            if why is None:
                self._reserved[claim.uid] = claim.shares
            return why

    def _counted(self, uid: str) -> Iterator[tuple[str, PreparedClaim]]:
        """The other prepared claims that hold capacity (caller holds ``_lock``)."""
        return ((u, p) for u, p in self._claims.items() if u != uid and u not in self._finished)

    def _holders(self, claim: ParsedClaim) -> dict[str, PreparedClaim]:
        """The counted prepared claims on the devices ``claim`` asks for."""
        devices = {h.device for h in claim.shares}
        with self._lock:
            return {
                u: p for u, p in self._counted(claim.uid)
                if any(h.device in devices for h in p.shares)
            }

    def _drop_finished(self, holders: Mapping[str, PreparedClaim]) -> bool:
        """Reads each holder (no lock held); marks those the API has deallocated. True
        when any was."""
        done = [uid for uid, p in holders.items() if self._deallocated(uid, p)]
        with self._lock:
            done = [uid for uid in done if uid in self._claims]  # not unprepared meanwhile
            self._finished.update(done)
        for uid in done:
            p = holders[uid]
            log.info("DRA: claim %s/%s (%s) is deallocated in the API; its capacity is free "
                     "before the kubelet unprepares it", p.namespace, p.name, uid)
        return bool(done)

    def _deallocated(self, uid: str, p: PreparedClaim) -> bool:
        """No pod can be using the claim: it is gone, its name is another claim's now, or
        it has no allocation. Unreadable: False (it keeps counting)."""
        try:
            obj = self._source.get_claim(p.namespace, p.name)
        except ClaimNotFoundError:
            return True
        except KubeAccessError as exc:
            log.warning("DRA: cannot read prepared claim %s/%s (%s): %s; it keeps its "
                        "capacity", p.namespace, p.name, uid, exc)
            return False
        meta, status = obj.get("metadata"), obj.get("status")
        if not isinstance(meta, Mapping) or not isinstance(status, Mapping | None):
            return False  # not a claim as the API writes one: keep counting it
        return meta.get("uid") != uid or not (status or {}).get("allocation")

    def _write_new(self, claim: ParsedClaim, inv: Inventory) -> tuple[PreparedDevice, ...]:
        runtime = self._runtime(claim)
        host_dir = ""
        cache: str | None = None
        if runtime.enforcement is EnforcementMode.HAMI_CORE:
            host_dir = f"claim_{claim.uid}"
            cache = self._dirs(runtime).create(host_dir)
        devices = {d.device.uuid: d.device for d in inv.devices}
        cap = memory_cap_mib(claim, runtime.enforcement, inv.unit_mib, inv)
        response = self._response(claim, devices, runtime, inv.unit_mib, cache, cap)
        if host_dir:  # the limits are the claim's before any of its processes runs
            seed_region(self._dirs(runtime), host_dir, response.envs)
        spec = claim_cdi_spec(self.driver, claim, devices, response)
        prepared = PreparedClaim(
            namespace=claim.namespace,
            name=claim.name,
            devices=tuple(
                PreparedDevice(
                    requests=d.requests,
                    pool=self.pool,
                    device=d.name,
                    cdi_device_ids=(claim_cdi_device_id(self.driver, claim.uid, d.name),),
                )
                for d in claim.devices
            ),
            spec=spec,
            host_dir=host_dir,
            shares=claim.shares,
        )
        write_atomic(self._spec_path(claim.uid), json_bytes(spec), SPEC_MODE)
        self._record(claim.uid, prepared)
        log.info("DRA: prepared claim %s/%s (%s): %s, enforcement %s", claim.namespace,
                 claim.name, claim.uid, ", ".join(d.name for d in claim.devices),
                 runtime.enforcement.value)
        return prepared.devices

    def _pool_runtime(self) -> RuntimeConfig:
        """The pool's runtime with its mode in force (``auto`` resolved by the agent)."""
        base = self.cfg.runtime
        status = self._enforcement() if self._enforcement is not None else None
        if status is None or status.mode is base.enforcement:
            return base
        return base.model_copy(update={"enforcement": status.mode})

    def _runtime(self, claim: ParsedClaim) -> RuntimeConfig:
        """The pool's runtime in the claim's mode: a tenant's config may only raise the
        mode in force (``enforcement_for``), and only to one this node can enforce."""
        base = self._pool_runtime()
        mode = enforcement_for(claim, base.enforcement)
        if mode is not base.enforcement:  # the pool's own mode is gated by the agent
            status = check_enforcement(base.model_copy(update={"enforcement": mode}))
            if not status.ready:
                raise ClaimError(f"the claim asks {status.describe()}",
                                 ClaimReason.ENFORCEMENT_UNAVAILABLE)
        return base.model_copy(update={
            "enforcement": mode,
            # CDI names cannot be nested in a CDI spec: the device nodes go in directly.
            "pass_device_specs": base.pass_device_specs or uses_cdi(base),
        })

    def _response(self, claim: ParsedClaim, devices: Mapping[str, Device],
                  runtime: RuntimeConfig, unit_mib: int, cache: str | None,
                  cap: int | None = None) -> AllocateSpec:
        entry = LedgerEntry(
            ref=ContainerRef(claim.namespace, claim.name, CLAIM_CONTAINER, claim.uid),
            request=claim.request,
            shares=claim.shares,
            source=EntrySource.NODE_AGENT,
            created_at=0.0,
            updated_at=0.0,
        )
        return build(entry, devices.get, self._naming, runtime, unit_mib,
                     hami_cache_host_dir=cache, memory_cap_mib=cap,
                     memory_resource=self.cfg.resources.memory_resource)

    def _restore(self, uid: str, known: PreparedClaim) -> None:
        """A prepared claim asked again: what it needs on disk is there again."""
        if known.host_dir:
            self._dirs(self.cfg.runtime).create(known.host_dir)
        path = self._spec_path(uid)
        if not path.exists():
            write_atomic(path, json_bytes(known.spec), SPEC_MODE)
            log.info("DRA: wrote the CDI spec of claim %s/%s (%s) again from the checkpoint",
                     known.namespace, known.name, uid)

    def _unprepare_one(self, ref: ClaimRef) -> str:
        if not CLAIM_UID.match(ref.uid):
            return ""  # never prepared: no file or entry can carry that name
        with self._stripe(ref.uid):
            with self._lock:
                known = self._claims.get(ref.uid)
            try:
                with contextlib.suppress(FileNotFoundError):
                    self._spec_path(ref.uid).unlink()
                if known is not None:
                    self._record(ref.uid, None)
                    with self._lock:
                        self._finished.discard(ref.uid)
                    self._release_dir(known)
                    log.info("DRA: unprepared claim %s/%s (%s)", known.namespace, known.name,
                             ref.uid)
            except OSError as exc:
                log.warning("DRA: cannot unprepare claim %s (%s): %s", ref.name, ref.uid, exc)
                return f"claim {ref.namespace}/{ref.name}: {exc}"
        return ""

    def _release_dir(self, known: PreparedClaim) -> None:
        if not known.host_dir:
            return
        dirs = self._dirs(self.cfg.runtime)
        try:
            dirs.trash(known.host_dir)
            dirs.sweep()
        except (OSError, ValueError) as exc:  # the container's files: never fatal
            log.warning("DRA: host dir %s not released: %s", dirs.path(known.host_dir), exc)

    def _dirs(self, runtime: RuntimeConfig) -> HostDirs:
        if self._host_dirs is None:
            self._host_dirs = HostDirs(runtime.hami_core.cache_dir)
            self._host_dirs.ensure_root()
        return self._host_dirs

    def _spec_path(self, uid: str) -> Path:
        return self.cdi_dir / claim_spec_file_name(self.driver, uid)

    # -- checkpoint

    def _record(self, uid: str, prepared: PreparedClaim | None) -> None:
        """Set (None: drop) one claim and write the checkpoint; on a failed write the
        memory stays as the file is."""
        with self._lock:
            before = self._claims.get(uid)
            if prepared is None:
                self._claims.pop(uid, None)
            else:
                self._claims[uid] = prepared
                # Counted as prepared from now on: a reservation beside it would count
                # its shares twice for a claim reserving meanwhile.
                self._reserved.pop(uid, None)
            try:
                self.checkpoint.write(self._claims)
            except OSError:
                if before is None:
                    self._claims.pop(uid, None)
                else:
                    self._claims[uid] = before
                raise
