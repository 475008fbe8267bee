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
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpu_share.config.model import EnforcementMode, RuntimeConfig
from gpu_share.devices import nvml_features

CHECKSUM_SUFFIX = ".sha256"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_LIBRARY_BYTES = 256 << 20
_ELF_HEADER = 20  # e_ident (16), e_type (2), e_machine (2)
_ET_DYN = 3
CONNECT_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class EnforcementStatus:
    mode: EnforcementMode
    problems: tuple[str, ...] = ()

    @property
    def ready(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        if self.ready:
            return f"enforcement {self.mode.value!r} ready"
        return f"enforcement {self.mode.value!r} unavailable: " + "; ".join(self.problems)

    def as_doc(self) -> dict[str, object]:
        """What the node annotation says (the CLI and the extender read it)."""
        return {"mode": self.mode.value, "ready": self.ready, "problems": list(self.problems)}


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


def check_nvidia_memory_limits(runtime: RuntimeConfig) -> list[str]:
    hook = runtime.nvidia_memory_limits.hook_path
    problems = []
    if not os.path.isfile(hook) or not os.access(hook, os.X_OK):
        problems.append(f"the NVIDIA container toolkit's hook {hook} is missing or not executable")
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


CHECKS: Mapping[EnforcementMode, Callable[[RuntimeConfig], list[str]]] = {
    EnforcementMode.NONE: lambda runtime: [],
    EnforcementMode.MPS: check_mps,
    EnforcementMode.HAMI_CORE: check_hami_core,
    EnforcementMode.NVIDIA_MEMORY_LIMITS: check_nvidia_memory_limits,
}


def check(runtime: RuntimeConfig) -> EnforcementStatus:
    """Never raises: a check that fails unexpectedly is a problem, not a crash."""
    try:
        problems = CHECKS[runtime.enforcement](runtime)
    except Exception as exc:
        problems = [f"check failed: {type(exc).__name__}: {str(exc)[:200]}"]
    return EnforcementStatus(runtime.enforcement, tuple(p[:300] for p in problems[:8]))
