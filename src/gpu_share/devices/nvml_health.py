"""Each NVML device's health, as the backend's events and checks report it.

* XID critical errors and double-bit ECC events from an NVML event set.
  XIDs in ``health.ignoredXids`` are the application's fault and change nothing.
  XIDs in ``health.fatalXids`` (and double-bit ECC) mark the device unhealthy for good
  (until the agent restarts). Any other XID is *transient*: the device comes back
  after ``health.recoveryQuietSeconds`` without further XIDs, if NVML then answers a
  handle lookup by uuid and a memory query for it.
* An event NVML cannot attribute to a device marks every device (as NVIDIA's plugin).
* A device answering NVML_ERROR_GPU_IS_LOST is unhealthy with reason "device-lost".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypedDict

from gpu_share.config.model import DEFAULT_FATAL_XIDS, DEFAULT_IGNORED_XIDS, HealthConfig
from gpu_share.devices.base import HealthEvent
from gpu_share.devices.nvml_api import EventData, NvmlApi, NvmlHandle, as_text

log = logging.getLogger(__name__)

REASON_DEVICE_LOST = "device-lost"
REASON_RECOVERED = "recovered"
REASON_DBE = "ecc-double-bit"


class DeviceHealth(TypedDict):
    healthy: bool
    reason: str
    transient: bool


@dataclass
class DeviceState:
    handle: NvmlHandle
    healthy: bool = True
    reason: str = ""
    transient: bool = False
    last_error_at: float = 0.0
    events_registered: bool = False


class NvmlHealth:
    """The devices' states and what changes them (the backend's health thread calls
    ``on_event``, ``check_presence`` and ``check_recovery``)."""

    def __init__(
        self,
        health: HealthConfig,
        nvml: Callable[[], NvmlApi],
        clock: Callable[[], float],
        lock: threading.Lock,
    ) -> None:
        """``lock``: the backend's, which guards its device list and these states
        together (``states`` is replaced whole at discovery, under it)."""
        self._ignored = frozenset(health.ignored_xids or DEFAULT_IGNORED_XIDS)
        self._fatal = frozenset(health.fatal_xids or DEFAULT_FATAL_XIDS)
        self._quiet_s = health.recovery_quiet_seconds
        self._nvml = nvml
        self._clock = clock
        self._lock = lock
        self.states: dict[str, DeviceState] = {}

    def _uuid_of_event(self, data: EventData) -> str | None:
        n = self._nvml()
        try:
            uuid = as_text(n.nvmlDeviceGetUUID(data.device))
        except (n.NVMLError, TypeError, ValueError):
            return None
        return uuid if uuid in self.states else None

    def on_event(self, data: EventData) -> list[HealthEvent]:
        n = self._nvml()
        etype = int(data.eventType)
        if etype == int(n.nvmlEventTypeXidCriticalError):
            xid = int(data.eventData)
            if xid in self._ignored:
                log.info("ignored application XID", extra={"xid": xid})
                return []
            reason, fatal = f"xid-{xid}", xid in self._fatal
        elif etype == int(n.nvmlEventTypeDoubleBitEccError):
            reason, fatal = REASON_DBE, True
        else:
            return []
        uuid = self._uuid_of_event(data)
        targets = [uuid] if uuid is not None else list(self.states)
        if uuid is None:
            log.warning(
                "NVML event without a known device; marking every device", extra={"reason": reason}
            )
        out = []
        for target in targets:
            event = self._mark_unhealthy(target, reason, transient=not fatal)
            if event is not None:
                out.append(event)
        return out

    def _mark_unhealthy(self, uuid: str, reason: str, *, transient: bool) -> HealthEvent | None:
        transient = transient and self._quiet_s > 0
        with self._lock:
            state = self.states[uuid]
            state.last_error_at = self._clock()  # a new error restarts the quiet period
            if not state.healthy and (state.transient == transient or not state.transient):
                return None  # already unhealthy, and no worse than before
            state.healthy = False
            state.reason = reason
            state.transient = transient
        log.warning(
            "device unhealthy",
            extra={"device": uuid, "reason": reason, "transient": transient},
        )
        return HealthEvent(uuid=uuid, healthy=False, reason=reason, transient=transient)

    def check_presence(self) -> list[HealthEvent]:
        n = self._nvml()
        out: list[HealthEvent] = []
        for uuid, state in self._snapshot():
            if not state.healthy and not state.transient:
                continue  # already unhealthy for good
            try:
                n.nvmlDeviceGetMemoryInfo(state.handle)
            except n.NVMLError as exc:
                if exc.value == n.NVML_ERROR_GPU_IS_LOST:
                    event = self._mark_unhealthy(uuid, REASON_DEVICE_LOST, transient=False)
                    if event is not None:
                        out.append(event)
        return out

    def check_recovery(self) -> list[HealthEvent]:
        if self._quiet_s <= 0:
            return []
        n = self._nvml()
        out: list[HealthEvent] = []
        now = self._clock()
        for uuid, state in self._snapshot():
            if state.healthy or not state.transient:
                continue
            if now - state.last_error_at < self._quiet_s:
                continue
            try:
                handle = n.nvmlDeviceGetHandleByUUID(uuid)
                n.nvmlDeviceGetMemoryInfo(handle)
            except n.NVMLError as exc:
                if exc.value == n.NVML_ERROR_GPU_IS_LOST:
                    event = self._mark_unhealthy(uuid, REASON_DEVICE_LOST, transient=False)
                    if event is not None:
                        out.append(event)
                else:
                    log.info(
                        "device not recovered yet",
                        extra={"device": uuid, "error": str(exc)},
                    )
                continue
            with self._lock:
                if state.healthy or not state.transient or state.last_error_at > now:
                    continue  # changed meanwhile
                state.handle = handle
                state.healthy = True
                state.reason = ""
            log.info("device recovered", extra={"device": uuid})
            out.append(HealthEvent(uuid=uuid, healthy=True, reason=REASON_RECOVERED))
        return out

    def _snapshot(self) -> list[tuple[str, DeviceState]]:
        with self._lock:
            # Live states: only the single health thread mutates them outside the lock.
            return list(self.states.items())

    def detail(self) -> dict[str, DeviceHealth]:
        with self._lock:
            return {
                u: {"healthy": s.healthy, "reason": s.reason, "transient": s.transient}
                for u, s in self.states.items()
            }


def classify_xid(xid: int, ignored: Iterable[int], fatal: Iterable[int]) -> str:
    """'ignored', 'fatal' or 'transient' for one XID (for docs and the probe script)."""
    if xid in set(ignored):
        return "ignored"
    return "fatal" if xid in set(fatal) else "transient"
