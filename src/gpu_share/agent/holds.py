"""Which of the node's devices take no new slice, and why (running slices always stay):

- the admin's cordons (``sharing/cordon.py``; an unreadable value cordons too);
- every device until the node's cordons were first read (``await``, bounded);
- the devices DRA claims prepared before a switch to device-plugin mode may still hold
  (``agent/dra/leftovers.py``);
- every device while the node cannot enforce its pool's mode (``agent/enforcement.py``).

State only, and what to tell about it; the agent applies ``held`` to its engine under its
lock and reports through the callables it passes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from gpu_share.agent.enforcement import EnforcementStatus
from gpu_share.config.model import EnforcementMode
from gpu_share.sharing.cordon import Cordon, CordonChange

log = logging.getLogger(__name__)

Warn = Callable[[str, str], None]  # a node Warning Event: reason, message
Event = Callable[[str, str], None]  # a node Normal Event: reason, message


class DeviceHolds:
    def __init__(self, mode: EnforcementMode) -> None:
        # Cordons honoured (device uuid -> who/why), the node's latest cordon annotations
        # (kept until the engine exists) and the problems already reported.
        self.cordons: dict[str, Cordon] = {}
        self.annotations: Mapping[str, str] | None = None
        self._problems: frozenset[tuple[str, str]] = frozenset()
        # time.monotonic() until which every device is held while the node's cordons have
        # not been read yet; None: not waiting.
        self.cordons_due: float | None = None
        self.dra_held: frozenset[str] = frozenset()
        # Until the first check, the node cannot enforce its mode.
        self.enforcement = EnforcementStatus(mode, ("not checked yet",))

    def held(self, devices: Iterable[str]) -> list[str]:
        """Of ``devices`` (uuids), those that take no new slice."""
        if not self.enforcement.ready or self.cordons_due is not None:
            return list(devices)
        return sorted(set(self.cordons) | self.dra_held)

    def counts_as_cordoned(self, device: str) -> bool:
        """For the device metrics: cordoned by an admin or held for DRA claims."""
        return device in self.cordons or device in self.dra_held

    def await_cordons(self, timeout_s: float) -> None:
        self.cordons_due = time.monotonic() + timeout_s

    def cordon_wait_over(self) -> bool:
        """True once when the first read did not come in time (the hold then ends)."""
        due = self.cordons_due
        if due is None or time.monotonic() < due:
            return False
        self.cordons_due = None
        return True

    def report_problems(self, problems: Sequence[tuple[str, str, str]], warn: Warn,
                        count: Callable[[str], None]) -> None:
        """Each cordon annotation problem (key, reason, message) once, while it lasts."""
        seen = frozenset((key, reason) for key, reason, _ in problems)
        for key, reason, message in problems:
            if (key, reason) in self._problems:
                continue  # reported when it appeared
            count(reason)
            log.warning("cordon annotation ignored: %s", message,
                        extra={"annotation": key[:120], "reason": reason})
            what = ("ignored" if reason == "UnknownDevice"
                    else "unreadable, its device is cordoned all the same")
            warn("CordonIgnored", f"annotation {key[:120]} {what}: {message}")
        self._problems = seen


def report_cordon_change(change: CordonChange, index: int | None, event: Event) -> None:
    what = f"device {index} ({change.device})"
    if change.cordon is not None:
        message = (f"{what} cordoned {change.cordon.describe()}; running slices stay,"
                   " no new slice lands on it")
        reason = "DeviceCordoned"
    else:
        was = change.before.describe() if change.before is not None else ""
        message = f"{what} uncordoned (was cordoned {was}); new slices may land on it"
        reason = "DeviceUncordoned"
    log.info("%s", message, extra={"device": change.device, "reason": reason})
    event(reason, message)


def report_enforcement(before: EnforcementStatus, status: EnforcementStatus, warn: Warn,
                       event: Event) -> None:
    """A change of whether the node can enforce its mode."""
    if status.ready:
        log.info("%s: new slices may land on this node", status.describe())
        event("EnforcementReady", status.describe())
        return
    log.error("%s: no new slice lands on this node (running ones stay)", status.describe())
    if before.ready or before.problems != status.problems:
        warn("EnforcementUnavailable", status.describe()
             + "; no new slice lands on this node, running ones stay")
