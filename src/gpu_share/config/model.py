"""The versioned agent configuration (``version: v1``).

YAML keys are camelCase (the chart's values use the same names); Python fields are
snake_case. Unknown keys are rejected everywhere (``extra="forbid"``) so a typo names
itself in the error.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

CONFIG_VERSION = "v1"

DEFAULT_IGNORED_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68, 109)

# XIDs after which a device does not come back by itself (needs a reset, a reboot
# or a person): ECC/row-remap failures, fallen off the bus, NVLink, GSP, uncontained
# memory errors. Every other non-ignored XID is treated as transient.
DEFAULT_FATAL_XIDS: tuple[int, ...] = (48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140)


class _Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_assignment=True,
        frozen=False,
    )


class BackendKind(StrEnum):
    NVML = "nvml"
    DUMMY = "dummy"


class EnforcementMode(StrEnum):
    """How a slice's limits reach the workload."""

    NONE = "none"  # time-slicing; limits are informational env only
    MPS = "mps"  # NVIDIA MPS: active thread % and pinned memory limit
    HAMI_CORE = "hami-core"  # HAMi-core libvgpu.so preloaded into the container


class DeviceListStrategy(StrEnum):
    """How the visible device list is handed to the container runtime."""

    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    CDI_ANNOTATIONS = "cdi-annotations"
    CDI_CRI = "cdi-cri"


class PlacementPolicyName(StrEnum):
    BEST_FIT = "best-fit"  # least fragmentation: tightest device that fits
    BINPACK = "binpack"  # most used device that fits
    SPREAD = "spread"  # least used device


class ResourcesConfig(_Strict):
    """Extended resource names: ``<domain>/<memoryName>`` and ``<domain>/<coreName>``."""

    domain: str = Field(default="vendor.com", pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    memory_name: str = Field(default="vcuda-memory", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    core_name: str = Field(default="vcuda-core", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

    @property
    def memory_resource(self) -> str:
        return f"{self.domain}/{self.memory_name}"

    @property
    def core_resource(self) -> str:
        return f"{self.domain}/{self.core_name}"

    @model_validator(mode="after")
    def _distinct(self) -> ResourcesConfig:
        if self.memory_name == self.core_name:
            raise ValueError("resources.memoryName and resources.coreName must differ")
        return self


class KubeletConfig(_Strict):
    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    # Seconds to wait for one PodResources answer before degrading.
    pod_resources_timeout_seconds: float = Field(default=2.0, gt=0, le=30)


class MpsConfig(_Strict):
    pipe_dir: str = "/run/nvidia/mps"
    log_dir: str = "/var/log/nvidia-mps"


class HamiCoreConfig(_Strict):
    library_path: str = "/usr/local/vgpu/libvgpu.so"
    preload_path: str = "/usr/local/vgpu/ld.so.preload"
    cache_dir: str = "/tmp/vgpu"


class RuntimeConfig(_Strict):
    device_list_strategy: list[DeviceListStrategy] = Field(
        default_factory=lambda: [DeviceListStrategy.ENVVAR], min_length=1
    )
    # Add /dev/nvidia* device specs, for runtimes without the NVIDIA hook.
    pass_device_specs: bool = False
    enforcement: EnforcementMode = EnforcementMode.NONE
    # CDI kind used by cdi-annotations / cdi-cri: "<kind>=<device uuid>".
    cdi_kind: str = Field(default="nvidia.com/gpu", pattern=r"^[a-z0-9.-]+/[a-zA-Z0-9._-]+$")
    mps: MpsConfig = Field(default_factory=MpsConfig)
    hami_core: HamiCoreConfig = Field(default_factory=HamiCoreConfig)

    @field_validator("device_list_strategy")
    @classmethod
    def _unique(cls, v: list[DeviceListStrategy]) -> list[DeviceListStrategy]:
        if len(set(v)) != len(v):
            raise ValueError("runtime.deviceListStrategy lists a strategy twice")
        return v


class HealthConfig(_Strict):
    # XIDs that are the application's fault, not the device's.
    ignored_xids: list[int] = Field(default_factory=lambda: list(DEFAULT_IGNORED_XIDS))
    # A device unhealthy through a transient XID comes back after this quiet period
    # if the backend then reports it fine. 0 disables recovery.
    recovery_quiet_seconds: float = Field(default=300.0, ge=0)
    # XIDs that never recover by themselves (see DEFAULT_FATAL_XIDS).
    fatal_xids: list[int] = Field(default_factory=lambda: list(DEFAULT_FATAL_XIDS))
    # How often the backend is polled (dummy fault file, NVML device presence).
    poll_interval_seconds: float = Field(default=5.0, gt=0, le=3600)


class DummyConfig(_Strict):
    device_count: int = Field(default=4, ge=0, le=64)
    memory_mib: int = Field(default=16384, ge=1, alias="memoryMiB")
    model: str = "Dummy NPU"
    # Each dummy device is shown to the container as /dev/dummy-npu<N>, backed by
    # this host path (a harmless character device by default).
    host_device_path: str = "/dev/null"
    # JSON file: {"unhealthy": ["<device id>", ...]}; written by tests to inject faults.
    fault_file: str = "/var/lib/gpu-share/dummy-faults.json"
    numa_nodes: int = Field(default=1, ge=1, le=8)
    uuid_prefix: str = Field(default="NPU", pattern=r"^[A-Za-z][A-Za-z0-9]*$")


class PlacementConfig(_Strict):
    policy: PlacementPolicyName = PlacementPolicyName.BEST_FIT
    # File holding the HMAC key of the scheduler extender's signed decisions (a mounted
    # Secret). Empty: extender decisions are ignored and the node policy always decides.
    decision_key_file: str = ""


class IdentityConfig(_Strict):
    # Ask the API server for pod specs (requests of every container).
    use_api_server: bool = True
    # Without PodResources/API answers: "refuse" fails the call, "single-device"
    # places each resource on one device alone (never over-commits; pairing best effort).
    degraded_mode: Literal["refuse", "single-device"] = "single-device"


class MetricsConfig(_Strict):
    enabled: bool = True
    bind_address: str = "0.0.0.0"
    port: int = Field(default=9400, ge=0, le=65535)


class LoggingConfig(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "text"] = "json"


class PublishConfig(_Strict):
    node_annotation: bool = True
    pod_annotation: bool = True
    events: bool = True


class AgentConfig(_Strict):
    """Root of the config file."""

    version: Literal["v1"] = "v1"
    node_name: str = ""
    backend: BackendKind = BackendKind.NVML
    fail_on_init_error: bool = True
    memory_unit_mib: int = Field(default=1024, ge=1, le=1024 * 1024, alias="memoryUnitMiB")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    kubelet: KubeletConfig = Field(default_factory=KubeletConfig)
    state_dir: str = "/var/lib/gpu-share"
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    dummy: DummyConfig = Field(default_factory=DummyConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    identity: IdentityConfig = Field(default_factory=IdentityConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    publish: PublishConfig = Field(default_factory=PublishConfig)
