"""Regenerate the Python stubs of the kubelet protos (``python -m gpu_share.plugin.protogen``).

The ``.proto`` sources live in ``proto/gpu_share/plugin/proto/``; protoc run with
``-I proto`` writes the modules to ``<out>/gpu_share/plugin/proto/`` with imports that
already name ``gpu_share.plugin.proto``, so nothing is edited after generation and the
output is byte-for-byte reproducible with one grpcio-tools version (a test checks it).
Needs grpcio-tools (a test dependency), imported only here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
PROTO_ROOT = REPO_ROOT / "proto"
PACKAGE_DIR = Path("gpu_share", "plugin", "proto")
PROTO_FILES = (
    PACKAGE_DIR / "deviceplugin_v1beta1.proto",
    PACKAGE_DIR / "podresources_v1.proto",
)


def generated_names() -> list[str]:
    """File names protoc writes into the package dir for ``PROTO_FILES``."""
    names: list[str] = []
    for proto in PROTO_FILES:
        stem = proto.stem
        names += [f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"]
    return names


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
    written = [out_root / PACKAGE_DIR / name for name in generated_names()]
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
        help="root to write gpu_share/plugin/proto/ under (default: the repo's src/)",
    )
    ns = parser.parse_args(argv)
    for path in generate(ns.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
