"""``gpu-share install-hami-core``: put the image's HAMi-core on the node (the chart's
init container of hami-core pools), where the pool's config says:

* ``runtime.hamiCore.libraryPath``: libvgpu.so, and ``<libraryPath>.sha256`` (what the
  agent's enforcement check compares it with);
* ``runtime.hamiCore.preloadPath``: the file mounted as each container's
  ``/etc/ld.so.preload``, naming the library;
* ``hami-core.LICENSE`` and ``hami-core.VERSION`` beside the library.

Each file is replaced whole (temp file + rename): a container that mapped the old library
keeps it. The source's checksum is checked before anything is written; an identical
library already in place is left as it is.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gpu_share.agent.enforcement import CHECKSUM_SUFFIX, sha256_of
from gpu_share.agent.files import write_atomic
from gpu_share.config.loader import config_from_namespace
from gpu_share.config.model import EnforcementMode
from gpu_share.errors import GpuShareError

DEFAULT_SOURCE = "/opt/gpu-share/hami-core"
LIBRARY = "libvgpu.so"


class InstallError(GpuShareError):
    reason = "HamiCoreInstallFailed"


def _verified_source(source: Path) -> tuple[bytes, str]:
    lib = source / LIBRARY
    try:
        want = (source / (LIBRARY + CHECKSUM_SUFFIX)).read_text().split()[0]
        data = lib.read_bytes()
    except (OSError, IndexError) as exc:
        raise InstallError(f"no HAMi-core build in {source}: {exc}") from exc
    got = sha256_of(str(lib))
    if got != want:
        raise InstallError(f"{lib} does not match its checksum ({got} != {want})")
    return data, got


def install(source: Path, library: Path, preload: Path) -> list[str]:
    """Install; returns what was done, one line each."""
    data, digest = _verified_source(source)
    done = []
    current = sha256_of(str(library)) if library.is_file() else None
    if current == digest:
        done.append(f"{library} already holds {digest[:12]}")
    else:
        write_atomic(library, data, 0o644)
        done.append(f"{library} installed ({len(data)} bytes, sha256 {digest[:12]})")
    write_atomic(Path(f"{library}{CHECKSUM_SUFFIX}"), f"{digest}  {LIBRARY}\n".encode(), 0o644)
    for name in ("LICENSE", "VERSION"):
        with_name = source / name
        if with_name.is_file():
            write_atomic(library.parent / f"hami-core.{name}", with_name.read_bytes(), 0o644)
    write_atomic(preload, f"{library}\n".encode(), 0o644)
    done.append(f"{preload} names {library}")
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-share install-hami-core", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the pool's agent config file")
    parser.add_argument("--source", default=DEFAULT_SOURCE,
                        help=f"the image's HAMi-core build (default {DEFAULT_SOURCE})")
    args = parser.parse_args(argv)
    try:
        cfg = config_from_namespace(argparse.Namespace(config=args.config), environ={})
        if cfg.runtime.enforcement not in (EnforcementMode.HAMI_CORE, EnforcementMode.AUTO):
            print(f"pool enforcement is {cfg.runtime.enforcement.value!r}: nothing to install")
            return 0
        hc = cfg.runtime.hami_core
        for line in install(Path(args.source), Path(hc.library_path), Path(hc.preload_path)):
            print(line)
    except (GpuShareError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    os.sync()
    return 0
