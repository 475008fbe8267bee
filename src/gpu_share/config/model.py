"""The versioned agent configuration (``version: v1``).

YAML keys are camelCase (the chart's values use the same names); Python fields are
snake_case. Unknown keys are rejected everywhere (``extra="forbid"``) so a typo names
itself in the error.

Types are strict (``strict=True``): ``memoryUnitMiB: true``, ``"4"`` or ``4.0`` are refused
rather than coerced. Environment variables and flags arrive as text; the loader converts
them explicitly before validation. Every check that needs no device lives here, so the
agent and ``gpu-share config validate`` share it; the checks against devices are in
``gpu_share.plugin.sizeguard.check_devices``.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

CONFIG_VERSION = "v1"

DEFAULT_IGNORED_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68, 109)

# XIDs after which a device does not come back by itself (needs a reset, a reboot
# or a person): ECC/row-remap failures, fallen off the bus, NVLink, GSP, uncontained
# memory errors. Every other non-ignored XID is treated as transient.
DEFAULT_FATAL_XIDS: tuple[int, ...] = (48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140)

# memoryUnitMiB bounds: 1 MiB .. 1 TiB (no device is larger; the device check refuses a
# unit larger than a device anyway).
MIN_MEMORY_UNIT_MIB = 1
MAX_MEMORY_UNIT_MIB = 1024 * 1024
# XIDs are small positive numbers (NVIDIA documents them below 200 today).
MAX_XID = 65535
MAX_XID_LIST = 256

# DNS rules (RFC 1123, as Kubernetes applies them) and Kubernetes qualified names.
DNS_SUBDOMAIN_MAX = 253
DNS_LABEL_MAX = 63
QUALIFIED_NAME_MAX = 63
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
QUALIFIED_NAME_PATTERN = r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
# Annotation keys are "gpu-share.<domain>/<name>": their prefix must itself be a DNS
# subdomain, which leaves 243 characters for the domain. (The kubelet's own check,
# "requests.<domain>/<name>" being a qualified name, allows 244.)
ANNOTATION_PREFIX = "gpu-share."
MAX_DOMAIN_LENGTH = DNS_SUBDOMAIN_MAX - len(ANNOTATION_PREFIX)


class ProblemKind(StrEnum):
    """Typed kinds of the problems gpu-share adds to pydantic's own error types."""

    XID_CONFLICT = "xid_conflict"
    INVALID_DOMAIN = "invalid_domain"
    INVALID_DRIVER_NAME = "invalid_driver_name"
    DEVICE_SMALLER_THAN_UNIT = "device_smaller_than_unit"
    DEVICE_LIST_TOO_LARGE = "device_list_too_large"


def _text_only(value: object) -> object:
    # Enum fields validate laxly (a YAML string must become the enum), so refuse
    # anything but text here: bytes (YAML !!binary), numbers, booleans.
    if not isinstance(value, str):
        raise PydanticCustomError("string_type", "Input should be a valid string")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_assignment=True,
        frozen=False,
        strict=True,
    )


class BackendKind(StrEnum):
    NVML = "nvml"
    DUMMY = "dummy"


class EnforcementMode(StrEnum):
    """How a slice's limits reach the workload."""

    NONE = "none"  # time-slicing; limits are informational env only
    MPS = "mps"  # NVIDIA MPS: active thread % and pinned memory limit
    HAMI_CORE = "hami-core"  # HAMi-core libvgpu.so preloaded into the container
    # The driver's per-cgroup memory limit, applied by the NVIDIA container toolkit's
    # CDI hook (nvidia-cdi-hook apply-cuda-memory-limits); memory only.
    NVIDIA_MEMORY_LIMITS = "nvidia-memory-limits"
    # Configured only, never in force: each node takes the strongest mode it can enforce
    # (agent/enforcement.py ``resolve_auto``); none where it can enforce none.
    AUTO = "auto"


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


# Enum fields take their value as text (strict mode would demand enum instances).
Backend = Annotated[BackendKind, Strict(False), BeforeValidator(_text_only)]
Enforcement = Annotated[EnforcementMode, Strict(False), BeforeValidator(_text_only)]
ListStrategy = Annotated[DeviceListStrategy, Strict(False), BeforeValidator(_text_only)]
PolicyName = Annotated[PlacementPolicyName, Strict(False), BeforeValidator(_text_only)]
Xid = Annotated[int, Field(ge=1, le=MAX_XID)]
Seconds = Annotated[float, Field(allow_inf_nan=False)]


def domain_problem(domain: str) -> str:
    """Why ``domain`` cannot prefix both extended resource names and gpu-share's
    annotation keys; "" when it can."""
    if len(domain) > MAX_DOMAIN_LENGTH:
        return (
            f"is {len(domain)} characters long, at most {MAX_DOMAIN_LENGTH} are allowed "
            f"(annotation keys {ANNOTATION_PREFIX}<domain>/... must be a DNS subdomain of "
            f"at most {DNS_SUBDOMAIN_MAX})"
        )
    problem = dns_subdomain_problem(domain)
    if problem:
        return problem
    if domain == "kubernetes.io" or domain.endswith("kubernetes.io"):
        return "names a Kubernetes native resource prefix (kubernetes.io), not an extended one"
    if domain.startswith("requests."):
        return "must not start with 'requests.' (reserved for quota names)"
    return ""


class ResourcesConfig(_Strict):
    """Extended resource names: ``<domain>/<memoryName>`` and ``<domain>/<coreName>``."""

    # A DNS subdomain (see domain_problem); each name the part after "/" of a Kubernetes
    # qualified name, so "<domain>/<name>" is a valid extended resource name.
    domain: str = "vendor.com"
    memory_name: str = Field(
        default="vcuda-memory", max_length=QUALIFIED_NAME_MAX, pattern=QUALIFIED_NAME_PATTERN
    )
    core_name: str = Field(
        default="vcuda-core", max_length=QUALIFIED_NAME_MAX, pattern=QUALIFIED_NAME_PATTERN
    )

    @property
    def memory_resource(self) -> str:
        return f"{self.domain}/{self.memory_name}"

    @property
    def core_resource(self) -> str:
        return f"{self.domain}/{self.core_name}"

    @field_validator("domain")
    @classmethod
    def _domain(cls, v: str) -> str:
        why = domain_problem(v)
        if why:
            raise PydanticCustomError(ProblemKind.INVALID_DOMAIN.value, "domain " + why)
        return v

    @model_validator(mode="after")
    def _distinct(self) -> ResourcesConfig:
        if self.memory_name == self.core_name:
            raise ValueError("resources.memoryName and resources.coreName must differ")
        return self


class KubeletConfig(_Strict):
    """Where the kubelet's device-plugin and PodResources sockets are."""

    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    # Seconds to wait for one PodResources answer before degrading.
    pod_resources_timeout_seconds: Seconds = Field(default=2.0, gt=0, le=30)


class MpsConfig(_Strict):
    """NVIDIA MPS host dirs (runtime.enforcement: mps)."""

    pipe_dir: str = "/run/nvidia/mps"
    log_dir: str = "/var/log/nvidia-mps"


class HamiCoreConfig(_Strict):
    """HAMi-core host paths (runtime.enforcement: hami-core)."""

    library_path: str = "/usr/local/vgpu/libvgpu.so"
    preload_path: str = "/usr/local/vgpu/ld.so.preload"
    cache_dir: str = "/tmp/vgpu"


class NvidiaMemoryLimitsConfig(_Strict):
    """The NVIDIA container toolkit's hook (runtime.enforcement: nvidia-memory-limits)."""

    # The hook binary on the host (toolkit 1.20.1 or later), as the runtime runs it.
    hook_path: str = Field(default="/usr/bin/nvidia-cdi-hook", pattern=r"^/[^\x00]*$",
                           max_length=4096)
    # Where the hook looks for libnvidia-ml.so.1 ("/": the host's library dirs).
    driver_root: str = Field(default="/", pattern=r"^/[^\x00]*$", max_length=4096)
    # The CDI kind of the hook-only devices our spec defines, one per GPU by UUID.
    cdi_kind: str = Field(default="vendor.com/gpu-memory-limits",
                          pattern=r"^[a-z0-9.-]+/[a-zA-Z0-9._-]+$")
    # Where the agent itself finds the hook to check it (the chart mounts the hook's host
    # directory read-only and sets this); empty: hookPath.
    check_path: str = Field(default="", pattern=r"^(/[^\x00]*)?$", max_length=4096)


class RuntimeConfig(_Strict):
    """How devices and slice limits reach the container runtime."""

    device_list_strategy: list[ListStrategy] = Field(
        default_factory=lambda: [DeviceListStrategy.ENVVAR], min_length=1, max_length=8
    )
    # Add /dev/nvidia* device specs, for runtimes without the NVIDIA hook.
    pass_device_specs: bool = False
    enforcement: Enforcement = EnforcementMode.NONE
    # CDI kind used by cdi-annotations / cdi-cri: "<kind>=<device uuid>".
    cdi_kind: str = Field(default="nvidia.com/gpu", pattern=r"^[a-z0-9.-]+/[a-zA-Z0-9._-]+$")
    mps: MpsConfig = Field(default_factory=MpsConfig)
    hami_core: HamiCoreConfig = Field(default_factory=HamiCoreConfig)
    nvidia_memory_limits: NvidiaMemoryLimitsConfig = Field(
        default_factory=NvidiaMemoryLimitsConfig
    )

    @field_validator("device_list_strategy")
    @classmethod
    def _unique(cls, v: list[DeviceListStrategy]) -> list[DeviceListStrategy]:
        if len(set(v)) != len(v):
            raise ValueError("runtime.deviceListStrategy lists a strategy twice")
        return v


class HealthConfig(_Strict):
    """Device health: which XIDs count, recovery and polling."""

    # XIDs that are the application's fault, not the device's.
    # An empty list means the defaults (the NVML backend reads it so).
    ignored_xids: list[Xid] = Field(
        default_factory=lambda: list(DEFAULT_IGNORED_XIDS), max_length=MAX_XID_LIST
    )
    # A device unhealthy through a transient XID comes back after this quiet period
    # if the backend then reports it fine. 0 disables recovery.
    recovery_quiet_seconds: Seconds = Field(default=300.0, ge=0, le=7 * 24 * 3600)
    # XIDs that never recover by themselves (see DEFAULT_FATAL_XIDS); empty: the defaults.
    # validate_default: the overlap check must also run when only ignoredXids is set.
    fatal_xids: list[Xid] = Field(
        default_factory=lambda: list(DEFAULT_FATAL_XIDS),
        max_length=MAX_XID_LIST,
        validate_default=True,
    )
    # How often the backend is polled (dummy fault file, NVML device presence).
    poll_interval_seconds: Seconds = Field(default=5.0, gt=0, le=3600)

    @field_validator("fatal_xids")
    @classmethod
    def _not_ignored(cls, v: list[int], info: ValidationInfo) -> list[int]:
        ignored = info.data.get("ignored_xids")
        if ignored is None:  # invalid itself; reported under its own key
            return v
        # Compare what the backend will use: an empty list stands for the defaults.
        both = sorted(set(v or DEFAULT_FATAL_XIDS) & set(ignored or DEFAULT_IGNORED_XIDS))
        if both:
            raise PydanticCustomError(
                ProblemKind.XID_CONFLICT.value,
                "XIDs listed both as ignored (health.ignoredXids) and as fatal "
                "(health.fatalXids; an empty list means the defaults): {xids}; an XID is "
                "either the application's fault or the device's, not both",
                {"xids": ", ".join(str(x) for x in both[:20])},
            )
        return v


class DummyConfig(_Strict):
    """Fake devices of the dummy backend (backend: dummy)."""

    device_count: int = Field(default=4, ge=0, le=64)
    # At most 16 TiB per device.
    memory_mib: int = Field(default=16384, ge=1, le=16 * 1024 * 1024, alias="memoryMiB")
    model: str = "Dummy NPU"
    # Each dummy device is shown to the container as /dev/dummy-npu<N>, backed by
    # this host path (a harmless character device by default).
    host_device_path: str = "/dev/null"
    # JSON file: {"unhealthy": ["<device id>", ...]}; written by tests to inject faults.
    fault_file: str = "/var/lib/gpu-share/dummy-faults.json"
    numa_nodes: int = Field(default=1, ge=1, le=8)
    # Short enough that "<prefix>-<36 hex and dashes>" stays a valid device id.
    uuid_prefix: str = Field(default="NPU", max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9]*$")


class PlacementConfig(_Strict):
    """How the agent picks a device for a new slice."""

    policy: PolicyName = PlacementPolicyName.BEST_FIT
    # File holding the HMAC key of the scheduler extender's signed decisions (a mounted
    # Secret). Empty: extender decisions are ignored and the node policy always decides.
    decision_key_file: str = ""


class IdentityConfig(_Strict):
    """How the agent learns which pod and container a request is for."""

    # Ask the API server for pod specs (requests of every container).
    use_api_server: bool = True
    # Without PodResources/API answers: "refuse" fails the call, "single-device"
    # places each resource on one device alone (never over-commits; pairing best effort).
    degraded_mode: Literal["refuse", "single-device"] = "single-device"


class MetricsConfig(_Strict):
    """The /metrics, /healthz and /readyz server."""

    enabled: bool = True
    bind_address: str = "0.0.0.0"
    port: int = Field(default=9400, ge=0, le=65535)


class LoggingConfig(_Strict):
    """Log level and format."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "text"] = "json"


class PublishConfig(_Strict):
    """What the agent writes to the API server."""

    node_annotation: bool = True
    pod_annotation: bool = True
    events: bool = True


def dns_subdomain_problem(name: str, max_length: int = DNS_SUBDOMAIN_MAX) -> str:
    """Why ``name`` is no DNS subdomain (RFC 1123, lowercase) of at most ``max_length``
    characters; "" when it is one."""
    if not name:
        return "must not be empty"
    if len(name) > max_length:
        return f"is {len(name)} characters long, at most {max_length} are allowed"
    for n, label in enumerate(name.split("."), start=1):
        if len(label) > DNS_LABEL_MAX:
            return f"label {n} is {len(label)} characters long, at most {DNS_LABEL_MAX}"
        if not _DNS_LABEL.match(label):
            return (
                f"label {n} is not a DNS label (lowercase letters, digits and '-', "
                "starting and ending with a letter or digit)"
            )
    return ""


# The transient CDI spec dir of the runtime (sharing/cdi.py DYNAMIC_SPEC_DIR: config sits
# below sharing, so the literal is repeated; a test keeps both equal).
DEFAULT_CDI_DIR = "/var/run/cdi"
DEFAULT_DRA_DRIVER = "gpu-share.vendor.com"
# resource.k8s.io DriverNameMaxLength (the same bound as CSI driver names).
DRA_DRIVER_NAME_MAX = 63


class DraConfig(_Strict):
    """Kubernetes DRA driver mode: the agent serves NodePrepareResources /
    NodeUnprepareResources for ResourceClaims allocated from its ResourceSlice."""

    enabled: bool = False
    # The DRA driver name (ResourceSlice spec.driver, DeviceClass selector, CDI vendor).
    driver_name: str = DEFAULT_DRA_DRIVER
    # Holds the DRA service socket (dra.sock) and the prepared-claims checkpoint.
    plugin_dir: str = f"/var/lib/kubelet/plugins/{DEFAULT_DRA_DRIVER}"
    # Where the kubelet looks for plugin registration sockets.
    registration_dir: str = "/var/lib/kubelet/plugins_registry"
    # Where each prepared claim's CDI spec is written (the runtime's transient dir).
    cdi_dir: str = DEFAULT_CDI_DIR

    @field_validator("driver_name")
    @classmethod
    def _driver(cls, v: str) -> str:
        why = dns_subdomain_problem(v, DRA_DRIVER_NAME_MAX)
        if why:
            raise PydanticCustomError(ProblemKind.INVALID_DRIVER_NAME.value, "driverName " + why)
        return v


class AgentConfig(_Strict):
    """Root of the config file."""

    version: Literal["v1"] = "v1"
    node_name: str = ""
    backend: Backend = BackendKind.NVML
    fail_on_init_error: bool = True
    memory_unit_mib: int = Field(
        default=1024, ge=MIN_MEMORY_UNIT_MIB, le=MAX_MEMORY_UNIT_MIB, alias="memoryUnitMiB"
    )
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
    dra: DraConfig = Field(default_factory=DraConfig)

    @model_validator(mode="after")
    def _hook_needs_cdi(self) -> AgentConfig:
        # The toolkit's hook reaches a device-plugin container only as a CDI device:
        # without one the limit env would be handed out and nothing would apply it.
        rt = self.runtime
        cdi = {DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI}
        if (rt.enforcement is EnforcementMode.NVIDIA_MEMORY_LIMITS and not self.dra.enabled
                and not cdi.intersection(rt.device_list_strategy)):
            raise ValueError(
                "runtime.enforcement nvidia-memory-limits needs a CDI device list strategy "
                "(cdi-annotations or cdi-cri) in runtime.deviceListStrategy: the toolkit's "
                "hook reaches the container only as a CDI device"
            )
        return self
