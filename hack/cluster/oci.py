#!/usr/bin/env python3
"""Build container images without a registry or a container build tool.

Writes a single-layer OCI image layout as a tar archive (oci-layout,
index.json, blobs/sha256/...) that ``ctr -n k8s.io images import`` accepts.
The layer is an uncompressed, reproducible tar (owner root, fixed mtime).

CLI::

    oci.py build-image --tag localhost/busybox:local --rootfs DIR \
        [--add SRC=DEST ...] [--entrypoint ARG ...] [--cmd ARG ...] \
        [--env K=V ...] [--workdir DIR] [--user U] -o image.tar
    oci.py busybox-rootfs DIR       # populate DIR from Debian's busybox-static
    oci.py inspect image.tar        # print the image name and config

Library: ``build_image(out, tag, rootfs_dirs=..., files=..., entrypoint=...)``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Sequence

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
FIXED_MTIME = 0


def _normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = FIXED_MTIME
    return info


def _walk_sorted(root: str) -> Iterable[tuple[str, str]]:
    """Yield (absolute path, archive name) for everything under root, sorted."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        entries = sorted(dirnames + filenames)
        for name in entries:
            full = os.path.join(dirpath, name)
            arc = name if rel_dir == "." else os.path.join(rel_dir, name)
            yield full, arc


def _parent_dirs(arcname: str) -> list[str]:
    parts = arcname.strip("/").split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def build_layer(rootfs_dirs: Sequence[str] = (), files: Sequence[tuple[str, str]] = ()) -> bytes:
    """Return an uncompressed layer tar built from directories and single files.

    ``files`` are (source path, destination path inside the image) pairs; the
    file mode of the source is kept.  Later entries win over earlier ones.
    """
    entries: dict[str, tuple[str, str]] = {}  # arcname -> (kind, source)
    for root in rootfs_dirs:
        if not os.path.isdir(root):
            raise SystemExit(f"oci: rootfs {root!r} is not a directory")
        for full, arc in _walk_sorted(root):
            entries[arc] = ("path", full)
    for src, dest in files:
        arc = dest.strip("/")
        if not arc:
            raise SystemExit(f"oci: bad destination {dest!r}")
        for parent in _parent_dirs(arc):
            entries.setdefault(parent, ("dir", ""))
        entries[arc] = ("path", src)

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for arc in sorted(entries):
            kind, src = entries[arc]
            if kind == "dir":
                info = tarfile.TarInfo(arc)
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(_normalize(info))
                continue
            info = tar.gettarinfo(src, arcname=arc)
            _normalize(info)
            if info.isreg():
                with open(src, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build_image(
    out: str,
    tag: str,
    rootfs_dirs: Sequence[str] = (),
    files: Sequence[tuple[str, str]] = (),
    entrypoint: Sequence[str] | None = None,
    cmd: Sequence[str] | None = None,
    env: Sequence[str] = (),
    workdir: str | None = None,
    user: str | None = None,
    labels: dict[str, str] | None = None,
    arch: str | None = None,
) -> str:
    """Write an OCI image layout tar to ``out``; return the manifest digest."""
    if ":" not in tag.rsplit("/", 1)[-1]:
        tag = tag + ":latest"
    arch = arch or {"x86_64": "amd64", "aarch64": "arm64"}.get(
        os.uname().machine, os.uname().machine
    )
    layer = build_layer(rootfs_dirs, files)
    layer_digest, _ = _blob(layer)

    config: dict = {
        "Env": list(env) or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    }
    if entrypoint:
        config["Entrypoint"] = list(entrypoint)
    if cmd:
        config["Cmd"] = list(cmd)
    if workdir:
        config["WorkingDir"] = workdir
    if user:
        config["User"] = user
    if labels:
        config["Labels"] = dict(labels)
    image_config = {
        "architecture": arch,
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "hack/cluster/oci.py"}],
    }
    config_digest, config_bytes = _blob(_canonical(image_config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": layer_digest, "size": len(layer)}],
    }
    manifest_digest, manifest_bytes = _blob(_canonical(manifest))
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": arch, "os": "linux"},
                "annotations": {
                    # containerd uses this as the full image name on import.
                    "io.containerd.image.name": tag,
                    "org.opencontainers.image.ref.name": tag.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    blobs = [
        (config_digest, config_bytes),
        (layer_digest, layer),
        (manifest_digest, manifest_bytes),
    ]

    tmp = out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(_normalize(info), io.BytesIO(data))

        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(_normalize(info))
        for digest, data in blobs:
            add("blobs/sha256/" + digest.split(":", 1)[1], data)
        add("oci-layout", _canonical({"imageLayoutVersion": "1.0.0"}))
        add("index.json", _canonical(index))
    os.replace(tmp, out)
    return manifest_digest


def busybox_rootfs(dest: str, busybox: str = "/bin/busybox") -> None:
    """Populate ``dest`` with a static busybox and a symlink per applet."""
    if not os.path.exists(busybox):
        raise SystemExit(f"oci: {busybox} not found (apt-get install busybox-static)")
    probe = (
        subprocess.run(["file", "-L", busybox], capture_output=True, text=True)
        if shutil.which("file")
        else None
    )
    if probe is not None and "dynamically linked" in probe.stdout:
        raise SystemExit(f"oci: {busybox} is dynamically linked; install busybox-static")
    for d in (
        "bin",
        "etc",
        "tmp",
        "proc",
        "sys",
        "dev",
        "root",
        "var",
        "usr/bin",
        "usr/sbin",
        "sbin",
    ):
        os.makedirs(os.path.join(dest, d), exist_ok=True)
    os.chmod(os.path.join(dest, "tmp"), 0o1777)
    target = os.path.join(dest, "bin", "busybox")
    shutil.copy2(busybox, target)
    os.chmod(target, 0o755)
    applets = subprocess.run(
        [busybox, "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    for applet in applets:
        link = os.path.join(dest, "bin", applet)
        if applet != "busybox" and not os.path.lexists(link):
            os.symlink("busybox", link)
    with open(os.path.join(dest, "etc", "passwd"), "w") as fh:
        fh.write("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    with open(os.path.join(dest, "etc", "group"), "w") as fh:
        fh.write("root:x:0:\nnogroup:x:65534:\n")


def inspect(path: str) -> dict:
    with tarfile.open(path) as tar:
        index = json.load(tar.extractfile("index.json"))
        desc = index["manifests"][0]
        manifest = json.load(tar.extractfile("blobs/sha256/" + desc["digest"].split(":", 1)[1]))
        config = json.load(
            tar.extractfile("blobs/sha256/" + manifest["config"]["digest"].split(":", 1)[1])
        )
    return {
        "name": desc.get("annotations", {}).get("io.containerd.image.name"),
        "digest": desc["digest"],
        "config": config.get("config", {}),
        "architecture": config.get("architecture"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build-image", help="write an OCI image layout tar")
    b.add_argument("--tag", required=True, help="full image name, e.g. localhost/busybox:local")
    b.add_argument(
        "--rootfs", action="append", default=[], help="directory copied to / (repeatable)"
    )
    b.add_argument(
        "--add", action="append", default=[], metavar="SRC=DEST", help="single file (repeatable)"
    )
    b.add_argument("--entrypoint", nargs="+", default=None)
    b.add_argument("--cmd", nargs="+", default=None)
    b.add_argument("--env", action="append", default=[], metavar="K=V")
    b.add_argument("--workdir")
    b.add_argument("--user")
    b.add_argument("--label", action="append", default=[], metavar="K=V")
    b.add_argument("-o", "--output", required=True)

    r = sub.add_parser("busybox-rootfs", help="populate a rootfs dir from busybox-static")
    r.add_argument("dest")
    r.add_argument("--busybox", default="/bin/busybox")

    i = sub.add_parser("inspect", help="print name/config of an image tar")
    i.add_argument("tar")

    args = ap.parse_args(argv)
    if args.command == "build-image":
        files = []
        for spec in args.add:
            src, sep, dest = spec.partition("=")
            if not sep:
                ap.error(f"--add expects SRC=DEST, got {spec!r}")
            files.append((src, dest))
        labels = dict(lab.split("=", 1) for lab in args.label)
        digest = build_image(
            args.output,
            args.tag,
            args.rootfs,
            files,
            args.entrypoint,
            args.cmd,
            args.env,
            args.workdir,
            args.user,
            labels,
        )
        print(f"{args.output}: {args.tag} {digest}")
    elif args.command == "busybox-rootfs":
        busybox_rootfs(args.dest, args.busybox)
    elif args.command == "inspect":
        print(json.dumps(inspect(args.tar), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
