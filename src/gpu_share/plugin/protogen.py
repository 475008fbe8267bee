"""Regenerate the Python stubs of the kubelet protos (``python -m gpu_share.plugin.protogen``).

The ``.proto`` sources live in ``proto/gpu_share/<front-end>/proto/`` (device plugin and
PodResources under ``plugin``, DRA and plugin registration under ``dra``); protoc run
with ``-I proto`` writes each module next to its package, ``<out>/gpu_share/<front-end>/
proto/``, with imports that already name that package, so nothing is edited after
generation and the output is byte-for-byte reproducible with one grpcio-tools version
(a test checks it).
Needs grpcio-tools (a test dependency), imported only here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
PROTO_ROOT = REPO_ROOT / "proto"
PACKAGE_DIR = Path("gpu_share", "plugin", "proto")
DRA_PACKAGE_DIR = Path("gpu_share", "dra", "proto")
PROTO_FILES = (
    PACKAGE_DIR / "deviceplugin_v1beta1.proto",
    PACKAGE_DIR / "podresources_v1.proto",
    DRA_PACKAGE_DIR / "dra_v1.proto",
    DRA_PACKAGE_DIR / "dra_v1beta1.proto",
    DRA_PACKAGE_DIR / "pluginregistration_v1.proto",
)


def generated_paths() -> list[Path]:
    """Paths, relative to the output root, protoc writes for ``PROTO_FILES``."""
    paths: list[Path] = []
    for proto in PROTO_FILES:
        stem = proto.stem
        paths += [
            proto.parent / name
            for name in (f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py")
        ]
    return paths


def generate(out_root: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Run protoc into ``out_root`` (a ``src``-like root); return the written files."""
    # test/dev dependency only; grpcio-tools ships neither stubs nor py.typed
    from grpc_tools import protoc  # type: ignore[import-untyped]

    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *(str(p) for p in PROTO_FILES),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}: {' '.join(args)}")
    written = [out_root / rel for rel in generated_paths()]
    missing = [str(p) for p in written if not p.is_file()]
    if missing:
        raise RuntimeError(f"protoc did not write {missing}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "src",
        help="root to write gpu_share/{plugin,dra}/proto/ under (default: the repo's src/)",
    )
    ns = parser.parse_args(argv)
    for path in generate(ns.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
