"""Can this node enforce its pool's mode now? Checked at start and on every health pass;
while it cannot, the agent offers no new slices (agent/node_agent.py: every device held
back as if cordoned; running slices stay), says why (node Event, annotation, metric,
/readyz) and takes them back when it can again.

* ``hami-core``: the library at ``libraryPath`` is a shared object for this machine,
  matches the checksum installed beside it (``<libraryPath>.sha256``, written with the
  library by the chart's installer), and the preload file names it (else every
  container's ``/etc/ld.so.preload`` would load nothing); the cache root is a directory.
* ``mps``: the control daemon answers on ``<pipeDir>/control``.
* ``nvidia-memory-limits``: the toolkit's hook is an executable at ``hookPath``,
  ``/sys/fs/cgroup`` is cgroup v2 (the hook refuses v1), and the driver's NVML exports
  ``nvmlDeviceSetMemoryLimits_v1`` (driver branch R615 and later).
* ``none``: nothing to check.

``auto`` (``resolve_auto``) checks every mode the pool can use and takes the strongest
the node has: driver limits > MPS > HAMi-core > none. Within the agent's life the mode
in force only goes up: a stronger one that becomes ready is taken for new slices; when
the one in force stops being ready the agent holds its devices back, as a pool that
insists on that mode would, until it is back (a restarted agent picks afresh).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import stat
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpu_share.config.model import DeviceListStrategy, EnforcementMode, RuntimeConfig
from gpu_share.devices import nvml_features
from gpu_share.sharing.node.limits import BY_STRENGTH, STRENGTH

CHECKSUM_SUFFIX = ".sha256"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_LIBRARY_BYTES = 256 << 20
_ELF_HEADER = 20  # e_ident (16), e_type (2), e_machine (2)
_ET_DYN = 3
CONNECT_TIMEOUT_S = 1.0


Found = tuple[tuple[EnforcementMode, tuple[str, ...]], ...]
Facts = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class EnforcementStatus:
    mode: EnforcementMode  # the mode in force (AUTO only before the first check)
    problems: tuple[str, ...] = ()
    configured: EnforcementMode | None = None  # None: ``mode``
    found: Found = ()  # auto: what each mode the pool can use lacks on this node
    facts: Facts = ()  # what the checks read (driver and hook versions, ...)

    @property
    def ready(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        name = repr(self.mode.value)
        if self.configured is not None:
            name = f"{self.configured.value!r} in force as {name}"
        if self.ready:
            return f"enforcement {name} ready"
        return f"enforcement {name} unavailable: " + "; ".join(self.problems)

    def as_doc(self) -> dict[str, object]:
        """What the node annotation says (the CLI and the extender read it)."""
        doc: dict[str, object] = {"mode": self.mode.value, "ready": self.ready,
                                  "problems": list(self.problems)}
        if self.configured is not None:
            doc["configured"] = self.configured.value
            doc["found"] = {m.value: list(p) for m, p in self.found}
        if self.facts:
            doc["facts"] = dict(self.facts)
        return doc


def _elf_ident(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(_ELF_HEADER)


def _own_elf() -> bytes:
    """This process's own executable: the library must be of the same class, byte order
    and machine to be loadable by the node's containers (same node, same CPU)."""
    return _elf_ident("/proc/self/exe")


def _same_machine(lib: bytes, own: bytes) -> str | None:
    if len(lib) < _ELF_HEADER or lib[:4] != b"\x7fELF":
        return "is not an ELF file"
    e_type = int.from_bytes(lib[16:18], "little" if lib[5] == 1 else "big")
    if e_type != _ET_DYN:
        return "is not a shared object"
    if len(own) >= _ELF_HEADER and (lib[4:6] != own[4:6] or lib[18:20] != own[18:20]):
        return "is built for another machine"
    return None


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _read_small(path: str, limit: int = 4096) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


def check_hami_core(runtime: RuntimeConfig, own_elf: Callable[[], bytes] = _own_elf) -> list[str]:
    hc = runtime.hami_core
    lib = hc.library_path
    try:
        st = os.stat(lib)
    except OSError as exc:
        return [f"library {lib} missing ({exc.strerror})"]
    if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_LIBRARY_BYTES:
        return [f"library {lib} is not a regular file of a library's size"]
    problems = []
    try:
        wrong = _same_machine(_elf_ident(lib), own_elf())
        if wrong:
            problems.append(f"library {lib} {wrong}")
        want = _read_small(lib + CHECKSUM_SUFFIX, 256).split()
        if not want or not _SHA256.fullmatch(want[0]):
            problems.append(f"checksum file {lib}{CHECKSUM_SUFFIX} holds no sha256")
        elif sha256_of(lib) != want[0]:
            problems.append(f"library {lib} does not match its checksum")
    except OSError as exc:
        problems.append(f"library {lib} or its checksum unreadable ({exc.strerror})")
    problems.extend(_check_preload(hc.preload_path, lib))
    if not os.path.isdir(hc.cache_dir):
        problems.append(f"cache dir {hc.cache_dir} missing")
    return problems


def _check_preload(path: str, lib: str) -> list[str]:
    try:
        lines = {ln.strip() for ln in _read_small(path).splitlines()}
    except OSError as exc:
        return [f"preload file {path} unreadable ({exc.strerror})"]
    return [] if lib in lines else [f"preload file {path} does not name {lib}"]


def check_mps(runtime: RuntimeConfig) -> list[str]:
    """The control daemon listens on ``control`` in the pipe dir (a unix socket, or a
    FIFO whose reader is the daemon: opening it to write without a reader is ENXIO)."""
    path = os.path.join(runtime.mps.pipe_dir, "control")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return [f"MPS control daemon not running: no {path}"]
    try:
        if stat.S_ISSOCK(mode):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(CONNECT_TIMEOUT_S)
                s.connect(path)
        elif stat.S_ISFIFO(mode):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        else:
            return [f"{path} is neither a socket nor a pipe"]
    except OSError as exc:
        return [f"MPS control daemon not answering on {path} ({exc.strerror or exc})"]
    return []


CGROUP_ROOT = "/sys/fs/cgroup"
MOUNTINFO = "/proc/self/mountinfo"


def cgroup_fs_type(root: str = CGROUP_ROOT, mountinfo: str = MOUNTINFO) -> str | None:
    """The file system type mounted at ``root`` (the last mount there wins); None: none."""
    found = None
    with open(mountinfo, encoding="utf-8", errors="replace") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) > 4 and fields[4] == root and right:
                found = right.split()[0]
    return found


DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
DMEM_CAPACITY = "dmem.capacity"  # in the cgroup v2 root: the kernel's device-memory controller
_DRIVER_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+([0-9]+(?:\.[0-9]+)+)")
_HOOK_VERSION = re.compile(r"version ([0-9]+)\.([0-9]+)\.([0-9]+)")
MIN_HOOK = (1, 20, 1)  # the first toolkit with apply-cuda-memory-limits
HOOK_TIMEOUT_S = 2.0
_hook_versions: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> its --version


def driver_version(path: str = DRIVER_VERSION_FILE) -> str:
    """The loaded NVIDIA kernel module's version ("" when none is loaded or unreadable)."""
    try:
        found = _DRIVER_VERSION.search(_read_small(path))
    except OSError:
        return ""
    return found.group(1) if found else ""


def hook_version(hook: str) -> str:
    """The first line the hook's ``--version`` prints (cached while the file is the
    same); "" when it cannot run here (the runtime runs it on the host)."""
    try:
        st = os.stat(hook)
    except OSError:
        return ""
    key = (hook, st.st_size, st.st_mtime_ns)
    if key not in _hook_versions:
        try:
            out = subprocess.run([hook, "--version"], capture_output=True, text=True,
                                 timeout=HOOK_TIMEOUT_S, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        _hook_versions.clear()  # one hook per node: keep only the newest
        _hook_versions[key] = (out.splitlines() or [""])[0][:120]
    return _hook_versions[key]


def nvidia_memory_limits_facts(runtime: RuntimeConfig) -> dict[str, str]:
    """What the node has for driver-enforced limits, published with the status."""
    nml = runtime.nvidia_memory_limits
    dmem = os.path.exists(os.path.join(CGROUP_ROOT, DMEM_CAPACITY))
    return {"driverVersion": driver_version(), "dmemController": "yes" if dmem else "no",
            "hookVersion": hook_version(nml.check_path or nml.hook_path)}


def _old_hook(version: str) -> str | None:
    found = _HOOK_VERSION.search(version)
    if found is None or tuple(int(g) for g in found.groups()) >= MIN_HOOK:
        return None
    return (f"the toolkit's hook is {found.group(0)}; apply-cuda-memory-limits needs "
            f"{'.'.join(map(str, MIN_HOOK))} or later")


def check_nvidia_memory_limits(runtime: RuntimeConfig) -> list[str]:
    nml = runtime.nvidia_memory_limits
    hook = nml.check_path or nml.hook_path
    problems = []
    if not os.path.isfile(hook) or not os.access(hook, os.X_OK):
        problems.append(f"the NVIDIA container toolkit's hook {nml.hook_path} is missing or "
                        "not executable")
    elif old := _old_hook(hook_version(hook)):
        problems.append(old)
    try:
        fs = cgroup_fs_type(CGROUP_ROOT, MOUNTINFO)
    except OSError as exc:
        fs, problems = None, [*problems, f"{MOUNTINFO} unreadable ({exc.strerror})"]
    if fs != "cgroup2":
        problems.append(f"{CGROUP_ROOT} is {fs or 'not mounted'}, not cgroup v2 (the hook "
                        "sets limits only on cgroup v2)")
    nvml = nvml_features.missing_call(nvml_features.SET_MEMORY_LIMITS)
    if nvml:
        problems.append(nvml)
    return problems


# What a mode's check also reports (beyond problems) in the node's enforcement annotation.
FACTS: Mapping[EnforcementMode, Callable[[RuntimeConfig], dict[str, str]]] = {
    EnforcementMode.NVIDIA_MEMORY_LIMITS: nvidia_memory_limits_facts,
}

CHECKS: Mapping[EnforcementMode, Callable[[RuntimeConfig], list[str]]] = {
    EnforcementMode.NONE: lambda runtime: [],
    EnforcementMode.MPS: check_mps,
    EnforcementMode.HAMI_CORE: check_hami_core,
    EnforcementMode.NVIDIA_MEMORY_LIMITS: check_nvidia_memory_limits,
}


def _problems(runtime: RuntimeConfig, mode: EnforcementMode) -> tuple[str, ...]:
    """Never raises: a check that fails unexpectedly is a problem, not a crash."""
    try:
        problems = CHECKS[mode](runtime)
    except Exception as exc:
        problems = [f"check failed: {type(exc).__name__}: {str(exc)[:200]}"]
    return tuple(p[:300] for p in problems[:8])


def _facts(runtime: RuntimeConfig, modes: Sequence[EnforcementMode]) -> Facts:
    """Never raises: facts are informational."""
    out: dict[str, str] = {}
    for mode in modes:
        try:
            out.update(FACTS[mode](runtime) if mode in FACTS else {})
        except Exception as exc:
            out[f"{mode.value}Facts"] = f"unreadable: {type(exc).__name__}"
    return tuple(sorted(out.items()))


def check(runtime: RuntimeConfig) -> EnforcementStatus:
    """The configured mode (not ``auto``: that is ``resolve_auto``) as the node has it."""
    mode = runtime.enforcement
    return EnforcementStatus(mode, _problems(runtime, mode), facts=_facts(runtime, [mode]))


def auto_candidates(runtime: RuntimeConfig, dra: bool) -> tuple[EnforcementMode, ...]:
    """The modes an ``auto`` pool can use, strongest first: driver limits reach a
    device-plugin container only as a CDI device (``AgentConfig``'s own rule)."""
    cdi = {DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI}
    usable = dra or bool(cdi.intersection(runtime.device_list_strategy))
    return tuple(m for m in BY_STRENGTH
                 if usable or m is not EnforcementMode.NVIDIA_MEMORY_LIMITS)


def resolve_auto(runtime: RuntimeConfig, candidates: Sequence[EnforcementMode],
                 current: EnforcementStatus | None) -> EnforcementStatus:
    """The mode in force for an ``auto`` pool: the strongest candidate the node has, but
    never below ``current`` (the one in force; None: first check): while that one is not
    ready the status says so and the agent holds its devices back."""
    found = tuple((m, _problems(runtime, m)) for m in candidates
                  if m is not EnforcementMode.NONE)
    best = next((m for m, p in found if not p), EnforcementMode.NONE)
    auto, facts = EnforcementMode.AUTO, _facts(runtime, candidates)
    if current is None or current.mode is auto or STRENGTH[best] >= STRENGTH[current.mode]:
        return EnforcementStatus(best, (), auto, found, facts)
    kept = next((p for m, p in found if m is current.mode), ())
    return EnforcementStatus(current.mode, kept, auto, found, facts)
