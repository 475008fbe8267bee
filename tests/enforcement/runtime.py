"""What a container runtime does with an Allocate response, for processes on this host:
the response's mounts bound in a private mount namespace (``unshare -m``; ``/etc`` under
a throw-away overlay so ``/etc/ld.so.preload`` can be mounted without touching the
host's), its env set, then the workload exec'd. Device nodes are the runtime's cgroup
business and are not modelled; the stand-in driver presents the devices the response's
visible-devices env names.

Root only (mount namespaces); every run is bounded by a timeout.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_share.plugin.proto import deviceplugin_v1beta1_pb2 as dp

# The preload mount goes last: every process exec'd after it loads libvgpu.so.
_PRELOAD = "/etc/ld.so.preload"


@dataclass(frozen=True)
class Image:
    """The workload image: the stand-in driver's libraries and its device config, as a
    real image would carry the driver libraries the NVIDIA toolkit injects."""

    standin_dir: str
    devices: str  # GPU_SHARE_STANDIN_DEVICES: "uuid=MiB;uuid=MiB"
    state_dir: str  # shared by every "container" of the node, like the real driver

    def env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "LD_LIBRARY_PATH": self.standin_dir,
            "GPU_SHARE_STANDIN_DEVICES": self.devices,
            "GPU_SHARE_STANDIN_STATE_DIR": self.state_dir,
        }

    @property
    def workload(self) -> str:
        return os.path.join(self.standin_dir, "gpu-workload")


@dataclass(frozen=True)
class HostImage:
    """A workload image for the driver this host has (a real GPU's, or the stand-in's when
    the caller's env points at it): the driver's env is passed through as the NVIDIA
    toolkit would inject the driver into a real image."""

    workload: str

    def env(self) -> dict[str, str]:
        keep = ("LD_LIBRARY_PATH", "GPU_SHARE_STANDIN_DEVICES", "GPU_SHARE_STANDIN_STATE_DIR",
                "GPU_SHARE_STANDIN_CONFIG")
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        env.update({k: os.environ[k] for k in keep if k in os.environ})
        return env


def _mount_lines(mounts: Sequence[dp.Mount]) -> list[str]:
    lines = []
    ordered = sorted(mounts, key=lambda m: m.container_path == _PRELOAD)
    for m in ordered:
        src, dst = shlex.quote(m.host_path), shlex.quote(m.container_path)
        make = f"mkdir -p {dst}" if os.path.isdir(m.host_path) else (
            f"mkdir -p $(dirname {dst}) && touch {dst}"
        )
        lines.append(f"[ -e {dst} ] || {{ {make}; }}")
        lines.append(f"mount --bind {src} {dst}")
        if m.read_only:
            lines.append(f"mount -o remount,bind,ro {dst}")
    return lines


def container_script(resp: dp.ContainerAllocateResponse, scratch: Path) -> str:
    """The shell run inside the new mount namespace before the workload."""
    up, work = scratch / "etc-upper", scratch / "etc-work"
    up.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    return "\n".join(
        [
            "set -eu",
            "mount --make-rprivate /",
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={up},workdir={work} /etc",
            *_mount_lines(resp.mounts),
            'exec "$@"',
        ]
    )


@dataclass(frozen=True)
class Run:
    rc: int
    out: dict[str, Any]
    stderr: str


@dataclass
class Container:
    proc: subprocess.Popen[str]
    scratch: Path


def start(
    resp: dp.ContainerAllocateResponse,
    image: Image | HostImage,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    mounts: bool = True,
) -> Container:
    """Start ``argv`` as a container of ``resp``: the image's env, then the response's
    (the runtime adds the device plugin's env to the container's), then ``env`` (what
    the container's own spec or entrypoint sets, e.g. a tenant trying to lift a limit).
    ``mounts`` False: the env alone, no mount namespace (a control run)."""
    scratch = Path(tempfile.mkdtemp(prefix="gs-ctr-", dir="/tmp"))
    script = scratch / "enter.sh"
    script.write_text(container_script(resp, scratch) if mounts else 'exec "$@"')
    full = {**image.env(), **dict(resp.envs), **dict(env or {})}
    enter = ["unshare", "--mount", "--propagation", "private"] if mounts else []
    proc = subprocess.Popen(
        [*enter, "sh", str(script), *argv],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return Container(proc, scratch)


def wait_holding(ctr: Container, timeout_s: float = 60) -> int:
    """Block until the workload of ``ctr`` (started with ``--hold-seconds``) holds its
    allocations; the MiB it holds. Its later output is left for ``finish``."""
    assert ctr.proc.stdout is not None
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(_holding_line(ctr.proc)), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box:
        ctr.proc.kill()
        raise AssertionError(f"the workload did not hold its memory within {timeout_s}s")
    if not box[0].startswith("holding "):
        raise AssertionError(f"the workload ended before holding: {box[0]!r}")
    return int(box[0].split()[1])


def stop(ctr: Container) -> None:
    """Kill a started container that is still holding (its result is not wanted)."""
    ctr.proc.kill()
    ctr.proc.communicate()
    shutil.rmtree(ctr.scratch, ignore_errors=True)


def _holding_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("holding ") or line.startswith("{"):
            return line
    return "<end of output>"


def finish(ctr: Container, timeout_s: float = 60) -> Run:
    """Wait for a started container; its stdout's last JSON line is the workload's."""
    proc = ctr.proc
    try:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"workload ran over {timeout_s}s:\n{err[-4000:]}") from None
    finally:
        shutil.rmtree(ctr.scratch, ignore_errors=True)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        raise AssertionError(f"no JSON from the workload (rc {proc.returncode}):\n{err[-4000:]}")
    return Run(proc.returncode, json.loads(lines[-1]), err)


def run(
    resp: dp.ContainerAllocateResponse,
    image: Image | HostImage,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    mounts: bool = True,
    timeout_s: float = 60,
) -> Run:
    return finish(start(resp, image, argv, env=env, mounts=mounts), timeout_s)
