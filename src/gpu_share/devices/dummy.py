"""The dummy NPU backend: devices from config, health from a JSON fault file.

It drives every demo and CI run, so it behaves like hardware where that matters:
stable uuids across restarts, per-device nodes, NUMA spread, health changes
reported through ``poll_health``.

Fault file: ``{"unhealthy": ["<uuid or index>", ...]}``. A missing file means all
healthy. A malformed file (``FaultFileError``: not JSON, nested too deep, over 1 MiB,
wrong shape) is logged and the last good state kept; fixing the file applies it. The state read at
``start()`` is the baseline (visible through ``devices()``); ``poll_health`` reports
changes from then on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import replace

from gpu_share.config.model import DummyConfig
from gpu_share.devices.base import Device, DeviceNode, HealthEvent, RuntimeNaming
from gpu_share.errors import DeviceBackendError

log = logging.getLogger(__name__)

VISIBLE_DEVICES_ENV = "DUMMY_VISIBLE_DEVICES"
CONTAINER_NODE_PREFIX = "/dev/dummy-npu"
SHARED_NODE_PATH = "/dev/dummy-npuctl"
VOLUME_MOUNT_ROOT = "/var/run/dummy-npu-devices"
FAULT_REASON = "fault-file"
DUMMY_DRIVER_VERSION = "dummy-1.0"  # what ResourceSlices report as driverVersion
# How often poll_health re-checks the file while waiting for a change.
DEFAULT_CHECK_INTERVAL_S = 0.25

# The file lists a few devices; anything much larger is a mistake (or an attack).
MAX_FAULT_FILE_BYTES = 1 << 20
FAULT_FILE_MALFORMED = "FaultFileMalformed"

_FileSig = tuple[int, int, int] | None  # (inode, size, mtime_ns); None = no file


class FaultFileError(DeviceBackendError):
    """The fault file is unreadable or malformed; the last good health state stays."""

    reason = FAULT_FILE_MALFORMED


def dummy_uuid(prefix: str, node_name: str, index: int) -> str:
    """``<prefix>-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``, stable for (prefix, node, index).

    The node name is part of the hash so two nodes never share a uuid.
    """
    digest = hashlib.sha256(f"{prefix}\0{node_name}\0{index}".encode()).hexdigest()
    return f"{prefix}-{digest[0:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def write_faults(path: str, devices: Iterable[str | int]) -> None:
    """Atomically write the fault file listing ``devices`` (uuids or indexes) unhealthy.

    An empty list heals every device. Used by tests and the admin CLI.
    """
    entries = [d if isinstance(d, str) else int(d) for d in devices]
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".faults-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"unhealthy": entries}, fh)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_faults(path: str) -> list[str]:
    """Entries of the fault file as strings; [] when it does not exist.

    Raises ``FaultFileError`` (a ``DeviceBackendError``) when the file cannot be read
    or is malformed -- too large, not JSON, nested too deep for the parser, wrong shape.
    """
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FAULT_FILE_BYTES + 1)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise FaultFileError(f"cannot read: {exc}") from exc
    if len(raw) > MAX_FAULT_FILE_BYTES:
        raise FaultFileError(f"larger than {MAX_FAULT_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
        if not text.strip():
            return []
        data = json.loads(text)
    # RecursionError: a deeply nested array ("[" * 100000) exhausts the parser's stack.
    except (ValueError, RecursionError) as exc:
        raise FaultFileError(f"not valid JSON: {_short(exc)}") from None
    if not isinstance(data, dict) or not isinstance(data.get("unhealthy", []), list):
        raise FaultFileError('expected {"unhealthy": [<uuid or index>, ...]}')
    entries = data.get("unhealthy", [])
    for entry in entries:
        if isinstance(entry, bool) or not isinstance(entry, str | int):
            raise FaultFileError(f"entry {_short(entry)} is neither a uuid nor an index")
    return [str(e) for e in entries]


def _short(value: object) -> str:
    """Bounded text for a log line or message (the file may hold anything)."""
    text = str(value) if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= 100 else text[:100] + "..."


class DummyBackend:
    """``DeviceBackend`` over ``DummyConfig``."""

    name = "dummy"

    def __init__(
        self,
        config: DummyConfig,
        node_name: str = "",
        *,
        check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
    ) -> None:
        self._config = config
        self._node_name = node_name
        self._check_interval_s = check_interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._devices: list[Device] = [self._make_device(i) for i in range(config.device_count)]
        self._unhealthy: set[str] = set()
        self._sig: _FileSig = None
        # Last problem with the fault file (None when it was fine); for status output.
        self.fault_file_error: str | None = None

    def _make_device(self, index: int) -> Device:
        cfg = self._config
        count = max(cfg.device_count, 1)
        return Device(
            uuid=dummy_uuid(cfg.uuid_prefix, self._node_name, index),
            index=index,
            minor=index,
            memory_mib=cfg.memory_mib,
            model=cfg.model,
            # Contiguous blocks, like sockets: devices 0..k-1 on node 0, and so on.
            numa_node=index * cfg.numa_nodes // count,
            nodes=(
                DeviceNode(
                    host_path=cfg.host_device_path,
                    container_path=f"{CONTAINER_NODE_PREFIX}{index}",
                ),
            ),
        )

    # ------------------------------------------------------------------ protocol

    def start(self) -> None:
        self._stop.clear()
        with self._lock:
            self._sig = self._file_sig()
            parsed = self._parse()
            if parsed is not None:
                self._unhealthy = parsed

    def devices(self) -> list[Device]:
        with self._lock:
            return [replace(d, healthy=d.uuid not in self._unhealthy) for d in self._devices]

    def driver_version(self) -> str:
        return DUMMY_DRIVER_VERSION

    def naming(self) -> RuntimeNaming:
        return RuntimeNaming(
            visible_devices_env=VISIBLE_DEVICES_ENV,
            shared_nodes=(
                DeviceNode(
                    host_path=self._config.host_device_path, container_path=SHARED_NODE_PATH
                ),
            ),
            volume_mount_root=VOLUME_MOUNT_ROOT,
        )

    def poll_health(self, timeout_s: float) -> list[HealthEvent]:
        """Check the fault file now and every ``check_interval_s`` until a change or timeout."""
        remaining = max(timeout_s, 0.0)
        # Bounded: at most timeout/interval + 1 checks.
        while True:
            events = self._check()
            if events or remaining <= 0 or self._stop.is_set():
                return events
            step = min(self._check_interval_s, remaining)
            if self._stop.wait(step):
                return []
            remaining -= step

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ fault file

    def _file_sig(self) -> _FileSig:
        try:
            st = os.stat(self._config.fault_file)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning(
                "cannot stat dummy fault file",
                extra={"path": self._config.fault_file, "error": str(exc)},
            )
            return self._sig  # unknown: treat as unchanged
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _parse(self) -> set[str] | None:
        """Unhealthy uuids named by the file, or None when it is malformed."""
        path = self._config.fault_file
        try:
            entries = read_faults(path)
        except FaultFileError as exc:
            self.fault_file_error = f"{path}: {exc}"
            log.warning(
                "dummy fault file is malformed; keeping the last health state",
                extra={"path": path, "error": str(exc)},
            )
            return None
        self.fault_file_error = None
        by_index = {str(d.index): d.uuid for d in self._devices}
        known = {d.uuid for d in self._devices}
        out: set[str] = set()
        for entry in entries:
            uuid = entry if entry in known else by_index.get(entry)
            if uuid is None:
                log.warning(
                    "dummy fault file names an unknown device; ignored",
                    extra={"path": path, "entry": _short(entry)},
                )
                continue
            out.add(uuid)
        return out

    def _check(self) -> list[HealthEvent]:
        with self._lock:
            sig = self._file_sig()
            if sig == self._sig:
                return []
            self._sig = sig
            parsed = self._parse()
            if parsed is None:
                return []
            before, self._unhealthy = self._unhealthy, parsed
        events: list[HealthEvent] = []
        for dev in self._devices:  # index order, so events are deterministic
            if dev.uuid in parsed and dev.uuid not in before:
                events.append(HealthEvent(uuid=dev.uuid, healthy=False, reason=FAULT_REASON))
            elif dev.uuid in before and dev.uuid not in parsed:
                events.append(HealthEvent(uuid=dev.uuid, healthy=True, reason=FAULT_REASON))
        return events
