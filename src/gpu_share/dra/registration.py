"""The plugin-watcher side of DRA registration (``pluginregistration.Registration``).

The kubelet's plugin watcher notices ``<registrationDir>/<driver>-reg.sock``, asks
GetInfo (type DRAPlugin, the driver name, the DRA socket to dial and the API versions
served there) and reports the outcome with NotifyRegistrationStatus. Nothing here
dials the kubelet: registration is the kubelet calling us.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from gpu_share.dra import guard
from gpu_share.dra.guard import Malformed
from gpu_share.dra.proto import pluginregistration_v1_pb2 as reg

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# The kubelet's names for the services: "<version>.DRAPlugin", newest first.
SUPPORTED_VERSIONS: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
SERVICE = reg.DESCRIPTOR.services_by_name["Registration"].full_name
REGISTRATION_FAILED = "DraRegistrationFailed"


def registration_socket_name(driver_name: str) -> str:
    return f"{driver_name}-reg.sock"


@dataclass(frozen=True)
class RegistrationOutcome:
    """What the kubelet last said about our registration."""

    registered: bool
    error: str  # bounded; "" when registered
    at: float  # time.monotonic()


class RegistrationService:
    """Answers the kubelet's plugin watcher for one DRA driver.

    ``on_failure(error)`` is called (on the gRPC thread; it must not block) each time the
    kubelet reports a failed registration, e.g. to put a Warning Event on the node;
    ``on_registered()`` likewise for each successful one (a kubelet that just started
    wipes the node's ResourceSlices, so the driver must check its slice again). An
    exception either raises is logged, never answered to the kubelet.
    """

    def __init__(
        self,
        driver_name: str,
        endpoint: str,
        *,
        supported_versions: Sequence[str] = SUPPORTED_VERSIONS,
        on_failure: Callable[[str], None] | None = None,
        on_registered: Callable[[], None] | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.supported_versions = tuple(supported_versions)
        self._on_failure = on_failure
        self._on_registered = on_registered
        self._cv = threading.Condition()
        self._outcome: RegistrationOutcome | None = None
        self._info_calls = 0

    @property
    def outcome(self) -> RegistrationOutcome | None:
        """The last NotifyRegistrationStatus, None before the first."""
        with self._cv:
            return self._outcome

    @property
    def info_calls(self) -> int:
        with self._cv:
            return self._info_calls

    @property
    def registered(self) -> bool:
        outcome = self.outcome
        return outcome is not None and outcome.registered

    def wait_outcome(self, timeout_s: float, *, after: float = float("-inf")) -> (
        RegistrationOutcome | None
    ):
        """The first outcome reported at or after monotonic time ``after`` (None if none
        came within ``timeout_s``)."""

        def fresh() -> bool:
            return self._outcome is not None and self._outcome.at >= after

        with self._cv:
            self._cv.wait_for(fresh, timeout=timeout_s)
            return self._outcome if fresh() else None

    def info(self) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=list(self.supported_versions),
        )

    def get_info(
        self, request: reg.InfoRequest | Malformed, context: grpc.ServicerContext
    ) -> reg.PluginInfo:
        if isinstance(request, Malformed):
            guard.invalid(context, "GetInfo", request.why)
        with self._cv:
            self._info_calls += 1
        log.info("kubelet asked for the registration info of %s", self.driver_name)
        return self.info()

    def notify_registration_status(
        self, request: reg.RegistrationStatus | Malformed, context: grpc.ServicerContext
    ) -> reg.RegistrationStatusResponse:
        if isinstance(request, Malformed):
            guard.invalid(context, "NotifyRegistrationStatus", request.why)
        error = guard.bounded(request.error) if not request.plugin_registered else ""
        if not request.plugin_registered and not error:
            error = "the kubelet gave no reason"
        outcome = RegistrationOutcome(request.plugin_registered, error, time.monotonic())
        with self._cv:
            self._outcome = outcome
            self._cv.notify_all()
        if outcome.registered:
            log.info("kubelet registered DRA driver %s (endpoint %s)",
                     self.driver_name, self.endpoint)
            if self._on_registered is not None:
                try:
                    self._on_registered()
                except Exception:
                    log.exception("registration hook failed")
            return reg.RegistrationStatusResponse()
        log.error("kubelet refused DRA driver %s: %s", self.driver_name, error)
        if self._on_failure is not None:
            try:
                self._on_failure(error)
            except Exception:
                log.exception("registration failure hook failed")
        return reg.RegistrationStatusResponse()

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        methods: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "GetInfo": guard.unary(self.get_info, guard.parser(reg.InfoRequest, "InfoRequest")),
            "NotifyRegistrationStatus": guard.unary(
                self.notify_registration_status,
                guard.parser(reg.RegistrationStatus, "RegistrationStatus"),
            ),
        }
        return [grpc.method_handlers_generic_handler(SERVICE, methods)]
