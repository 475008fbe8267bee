#!/usr/bin/env bash
# hack/build-image.sh - build the gpu-share image from ./Dockerfile without Docker and
# import it into the local cluster's containerd as localhost/gpu-share:dev.
#
#   hack/build-image.sh            build (if the sources changed) + import (if the cluster runs)
#   hack/build-image.sh --no-import    only build/cache the image tar
#   hack/build-image.sh --print-tar    print the path of the cached image tar (no build)
#   hack/build-image.sh --import-tar TAR   import that (already built) tar only
# The path of the image tar is printed on stdout (progress goes to stderr).
#
# How (no registry is reachable, no Docker daemon):
#   1. base image: `debootstrap --variant=minbase bookworm` + python3, python3-pip,
#      python3-venv, ca-certificates, committed with buildah as
#      localhost/debian-bookworm-python:<recipe hash> and cached as an OCI archive in
#      ${GPU_SHARE_CACHE}/images/debian-bookworm-python-<recipe hash>.tar.
#   2. `buildah bud --isolation chroot --network host --build-arg BASE_IMAGE=<base>` on the
#      Dockerfile (the build stage pip-installs from PyPI; the host's CA bundle is
#      mounted so TLS through an egress proxy works), exported as a docker-archive in
#      ${GPU_SHARE_CACHE}/images/gpu-share-<source hash>.tar. The source hash covers the
#      Dockerfile, .dockerignore, pyproject.toml, README.md, src/ and the base recipe:
#      unchanged sources skip the build.
#   3. `hack/local-up-cluster.sh import-image` when containerd does not already hold that
#      exact image.
# HAMi-core's pinned source (GPU_SHARE_HAMI_CORE_DIR, default ../shared/vendor/hami-core:
# tarball, SHA256SUMS, LICENSE) is staged into .build/hami-core/ (ignored by git) as the
# Dockerfile's HAMI_CORE_SOURCE; the image's hami-core stage compiles libvgpu.so from it.
#
# Settings: GPU_SHARE_CACHE (default ~/.cache/gpu-share), GPU_SHARE_IMAGE
# (default localhost/gpu-share:dev), DEBIAN_MIRROR (default http://deb.debian.org/debian),
# BUILDAH_STORAGE_DRIVER (default vfs: works everywhere, overlay needs kernel support).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_PREFIX=build-image
# shellcheck source=hack/lib/common.sh
. "${HACK_DIR}/lib/common.sh"
REPO_ROOT="$(cd "${HACK_DIR}/.." && pwd)"
CACHE_DIR="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}"
IMAGES_DIR="${CACHE_DIR}/images"
IMAGE="${GPU_SHARE_IMAGE:-localhost/gpu-share:dev}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
STORAGE_DRIVER="${BUILDAH_STORAGE_DRIVER:-vfs}"
BASE_PACKAGES="python3,python3-pip,python3-venv,ca-certificates"
BUILDAH=(buildah --storage-driver "${STORAGE_DRIVER}")

# The base image's recipe: everything that decides its content. Changing any line here
# (packages, suite, post-steps) gives a new hash, hence a new base image.
base_recipe() {
  cat <<EOF
debootstrap --variant=minbase --include=${BASE_PACKAGES} bookworm
rm /usr/lib/python3.11/EXTERNALLY-MANAGED
ln -s pip3 /usr/bin/pip (if missing)
apt clean, rm /var/lib/apt/lists/*
config: env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
EOF
}
BASE_HASH="$(base_recipe | sha256sum | cut -c1-12)"
BASE_IMAGE="localhost/debian-bookworm-python:${BASE_HASH}"
BASE_TAR="${IMAGES_DIR}/debian-bookworm-python-${BASE_HASH}.tar"

HAMI_CORE_DIR="${GPU_SHARE_HAMI_CORE_DIR:-${REPO_ROOT}/../shared/vendor/hami-core}"

# The pinned HAMi-core source into the build context (checked against its SHA256SUMS).
stage_hami_core() {
  local dst="${REPO_ROOT}/.build/hami-core"
  [[ -f "${HAMI_CORE_DIR}/SHA256SUMS" ]] || die "no HAMi-core source at ${HAMI_CORE_DIR}"
  (cd "${HAMI_CORE_DIR}" && sha256sum --quiet -c SHA256SUMS) ||
    die "HAMi-core tarball in ${HAMI_CORE_DIR} does not match its SHA256SUMS"
  rm -rf "${dst}"
  mkdir -p "${dst}"
  cp "${HAMI_CORE_DIR}"/*.tar.gz "${HAMI_CORE_DIR}/SHA256SUMS" "${HAMI_CORE_DIR}/LICENSE" "${dst}/"
}

# Hash of the image's inputs: the files the Dockerfile copies (see .dockerignore), the
# Dockerfile itself and the base recipe.
source_hash() {
  (
    cd "${REPO_ROOT}"
    echo "base ${BASE_HASH}"
    find Dockerfile .dockerignore pyproject.toml README.md src .build/hami-core \
      hack/build-enforcement.sh hack/lib/common.sh -type f \
      ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 |
      LC_ALL=C sort -z | xargs -0 sha256sum
  ) | sha256sum | cut -c1-12
}

ensure_tools() {
  local missing=()
  command -v buildah >/dev/null || missing+=(buildah)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  if ((${#missing[@]})); then
    [[ "$(id -u)" == 0 ]] || die "missing ${missing[*]} (apt-get install -y ${missing[*]} as root)"
    log "installing ${missing[*]} (apt-get)"
    apt-get install -y "${missing[@]}" >/dev/null 2>&1 ||
      { apt-get update >/dev/null && apt-get install -y "${missing[@]}" >/dev/null; }
  fi
}

has_image() { "${BUILDAH[@]}" inspect --type image "$1" >/dev/null 2>&1; }

ensure_base() {
  if has_image "${BASE_IMAGE}"; then
    return 0
  fi
  if [[ -f "${BASE_TAR}" ]]; then
    log "base image ${BASE_IMAGE}: loading cached ${BASE_TAR}"
    local id
    id="$("${BUILDAH[@]}" pull --quiet "oci-archive:${BASE_TAR}" | tail -n 1)"
    "${BUILDAH[@]}" tag "${id}" "${BASE_IMAGE}"
    has_image "${BASE_IMAGE}" || die "cached base tar did not load as ${BASE_IMAGE}"
    return 0
  fi
  [[ "$(id -u)" == 0 ]] || die "debootstrap needs root"
  log "base image ${BASE_IMAGE}: debootstrap bookworm minbase + python3 (a few minutes)"
  local work rootfs
  work="$(mktemp -d "${IMAGES_DIR}/.base-XXXXXX")"
  rootfs="${work}/rootfs"
  run_with_progress debootstrap "${IMAGES_DIR}/debian-bookworm-python-${BASE_HASH}.log" \
    debootstrap --variant=minbase --include="${BASE_PACKAGES}" bookworm "${rootfs}" "${MIRROR}"
  rm -f "${rootfs}/usr/lib/python3.11/EXTERNALLY-MANAGED"
  [[ -e "${rootfs}/usr/bin/pip" ]] || ln -s pip3 "${rootfs}/usr/bin/pip"
  rm -rf "${rootfs:?}"/var/cache/apt/archives/*.deb "${rootfs:?}"/var/lib/apt/lists/* \
    "${rootfs:?}"/var/log/* "${rootfs:?}"/tmp/* "${rootfs:?}"/dev/*
  log "  packing the rootfs"
  tar -C "${rootfs}" --numeric-owner -cf "${work}/rootfs.tar" .
  local ctr
  ctr="$("${BUILDAH[@]}" from scratch)"
  "${BUILDAH[@]}" add "${ctr}" "${work}/rootfs.tar" / >/dev/null
  "${BUILDAH[@]}" config \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/bash \
    --label "gpu-share.vendor.com/base-recipe=${BASE_HASH}" "${ctr}"
  "${BUILDAH[@]}" commit --quiet "${ctr}" "${BASE_IMAGE}" >/dev/null
  "${BUILDAH[@]}" rm "${ctr}" >/dev/null
  rm -f "${BASE_TAR}.tmp"
  "${BUILDAH[@]}" push --quiet "${BASE_IMAGE}" "oci-archive:${BASE_TAR}.tmp:${BASE_IMAGE}"
  mv "${BASE_TAR}.tmp" "${BASE_TAR}"
  rm -rf "${work}"
  log "base image cached: ${BASE_TAR} ($(du -m "${BASE_TAR}" | cut -f1) MiB)"
}

build_image() {
  local tar="$1"
  ensure_base
  log "buildah bud ${IMAGE} (build stage pip-installs the wheels from PyPI)"
  local revision
  revision="$(git -C "${REPO_ROOT}" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  run_with_progress "buildah bud" "${tar%.tar}.log" \
    "${BUILDAH[@]}" bud --isolation chroot --network host --layers=false \
    --volume /etc/ssl/certs:/etc/ssl/certs:ro \
    --build-arg "BASE_IMAGE=${BASE_IMAGE}" --build-arg "REVISION=${revision}" \
    -f "${REPO_ROOT}/Dockerfile" -t "${IMAGE}" "${REPO_ROOT}"
  rm -f "${tar}.tmp"
  "${BUILDAH[@]}" push --quiet "${IMAGE}" "docker-archive:${tar}.tmp:${IMAGE}"
  mv "${tar}.tmp" "${tar}"
  # Keep only this tar of the gpu-share image: older ones are dead weight.
  find "${IMAGES_DIR}" -maxdepth 1 -name 'gpu-share-*.tar' ! -path "${tar}" -delete
  find "${IMAGES_DIR}" -maxdepth 1 -name 'gpu-share-*.log' ! -path "${tar%.tar}.log" -delete
  # Dangling intermediate images (the build stage) would pile up in vfs storage.
  "${BUILDAH[@]}" rmi --prune >/dev/null 2>&1 || true
  log "image cached: ${tar} ($(du -m "${tar}" | cut -f1) MiB)"
}

# The image ID (config digest) recorded in a docker-archive tar.
tar_image_id() {
  tar -xOf "$1" manifest.json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Config"].split("/")[-1].removesuffix(".json"))'
}

# image_held TAR TARGET : whether containerd's content TARGET names the image ID of TAR.
image_held() {
  local want
  want="sha256:$(tar_image_id "$1")"
  [[ -n "$2" ]] && "${CONTAINERD_BIN_DIR}/ctr" --address "${CONTAINERD_ADDRESS}" -n k8s.io content get "$2" 2>/dev/null |
    grep -q "${want}"
}

main() {
  local do_import=1
  case "${1:-}" in
    --no-import) do_import=0 ;;
    --print-tar) stage_hami_core; echo "${IMAGES_DIR}/gpu-share-$(source_hash).tar"; return 0 ;;
    --import-tar)
      import_unless_held "${IMAGE}" "${2:?usage: $0 --import-tar TAR}" image_held
      echo "$2"
      return 0
      ;;
    "") ;;
    *) sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
  mkdir -p "${IMAGES_DIR}"
  stage_hami_core
  local start=$SECONDS hash tar
  hash="$(source_hash)"
  tar="${IMAGES_DIR}/gpu-share-${hash}.tar"
  if [[ -f "${tar}" ]]; then
    log "image up to date (sources ${hash}): ${tar}"
  else
    ensure_tools
    log "building ${IMAGE} (sources ${hash}, base ${BASE_IMAGE})"
    build_image "${tar}"
  fi
  if ((do_import)); then import_unless_held "${IMAGE}" "${tar}" image_held; fi
  log "done in $((SECONDS - start))s"
  echo "${tar}"
}

main "$@"
