#!/usr/bin/env bash
# hack/build-enforcement.sh - builds (and caches) what the enforcement tests run:
#   * HAMi-core's libvgpu.so from the pinned source tarball (third-party, Apache-2.0),
#     never copied into this repository: unpacked and compiled in the cache;
#   * the stand-in NVIDIA driver (our libcuda.so.1 + libnvidia-ml.so.1, tests/standin/)
#     and the workload program gpu-workload.
# CUDA's cuda.h and NVML's nvml.h come from pinned PyPI wheels (no CUDA toolkit needed).
#
# Cache: ${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/enforcement/
#   headers-<cuda wheel version>/            cuda.h, nvml.h, ...
#   hami-core-<tarball sha256[:12]>-<script hash>/libvgpu.so
#   standin-<sources hash>/{libcuda.so.1,libnvidia-ml.so.1,gpu-workload}
# A ".stamp" marks a finished build; a stamped dir is reused as is.
#
# Usage: hack/build-enforcement.sh            build what is missing, print
#                                             hami_core=<libvgpu.so> standin=<dir>
#        hack/build-enforcement.sh --print    print only what is built (no network)
#        hack/build-enforcement.sh --hami-core DIR
#                                             HAMi-core only (the image's build stage):
#                                             libvgpu.so, libvgpu.so.sha256, LICENSE and
#                                             VERSION installed into DIR
# Env:   GPU_SHARE_HAMI_CORE_TARBALL   another pinned tarball (its top folder holds src/);
#        GPU_SHARE_HAMI_CORE_SHA256    its checksum (default: read from SHA256SUMS beside it)
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HACK_DIR}/.." && pwd)"
LOG_PREFIX=build-enforcement
# shellcheck source=hack/lib/common.sh
. "${HACK_DIR}/lib/common.sh"
CACHE_DIR="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/enforcement"
CUDA_WHEEL_VERSION="12.9.79"
VENDOR_DIR="${ROOT}/../shared/vendor/hami-core"
TARBALL="${GPU_SHARE_HAMI_CORE_TARBALL:-${VENDOR_DIR}/hami-core-8f3a89c.tar.gz}"

tarball_sha256() {
  if [[ -n "${GPU_SHARE_HAMI_CORE_SHA256:-}" ]]; then
    echo "${GPU_SHARE_HAMI_CORE_SHA256}"
    return
  fi
  local sums
  sums="$(dirname "${TARBALL}")/SHA256SUMS"
  [[ -f "${sums}" ]] || die "no checksum for ${TARBALL}: set GPU_SHARE_HAMI_CORE_SHA256"
  awk -v f="$(basename "${TARBALL}")" '$2 == f || $2 == "*" f {print $1}' "${sums}"
}

# One build of a cache dir at a time; the winner's stamp ends the others' wait.
lock_dir() {
  mkdir -p "$1"
  exec 8>"$1/.lock"
  flock 8
}

headers_dir() { echo "${CACHE_DIR}/headers-${CUDA_WHEEL_VERSION}"; }

build_headers() {
  local dir tmp whl
  dir="$(headers_dir)"
  [[ -f "${dir}/.stamp" ]] && return 0
  lock_dir "${dir}"
  [[ -f "${dir}/.stamp" ]] && return 0
  tmp="$(mktemp -d)"
  log "fetching cuda.h and nvml.h (PyPI wheels ${CUDA_WHEEL_VERSION})"
  python3 -m pip download -q --no-deps -d "${tmp}" \
    "nvidia-cuda-runtime-cu12==${CUDA_WHEEL_VERSION}" "nvidia-nvml-dev-cu12==${CUDA_WHEEL_VERSION}"
  for whl in "${tmp}"/*.whl; do
    python3 -m zipfile -e "${whl}" "${tmp}/x"
  done
  mkdir -p "${dir}/include"
  cp "${tmp}"/x/nvidia/cuda_runtime/include/*.h "${dir}/include/"
  cp "${tmp}/x/nvidia/nvml_dev/include/nvml.h" "${dir}/include/"
  rm -rf "${tmp}"
  date -u +%FT%TZ >"${dir}/.stamp"
}

hami_dir() {
  local sha
  sha="$(tarball_sha256)"
  echo "${CACHE_DIR}/hami-core-${sha:0:12}-$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-8)"
}

# HAMi-core's CMake build also compiles test/ (needs nvcc); its library is plain C, so
# gcc over src/ does, configured as its own build.sh configures it: a Debug build (every
# symbol exported: with -fvisibility=hidden only dlsym is, and the CUDA hooks it hands
# out are never reached) with DLSYM_HOOK_ENABLE, MULTIPROCESS_LIMIT_ENABLE,
# HOOK_MEMINFO_ENABLE and HOOK_NVML_ENABLE on.
build_hami_core() {
  local dir sha got src top
  dir="$(hami_dir)"
  [[ -f "${dir}/.stamp" && -f "${dir}/libvgpu.so" ]] && return 0
  [[ -f "${TARBALL}" ]] || die "HAMi-core source tarball not found: ${TARBALL}"
  sha="$(tarball_sha256)"
  got="$(sha256sum "${TARBALL}" | cut -d' ' -f1)"
  [[ "${got}" == "${sha}" ]] || die "checksum mismatch for ${TARBALL}: ${got} != ${sha}"
  lock_dir "${dir}"
  [[ -f "${dir}/.stamp" && -f "${dir}/libvgpu.so" ]] && return 0
  rm -rf "${dir}/src" "${dir}/config"
  mkdir -p "${dir}/src" "${dir}/config"
  tar -xzf "${TARBALL}" -C "${dir}/src"
  top="$(find "${dir}/src" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
  src="${top}/src"
  [[ -f "${src}/libvgpu.c" ]] || die "${TARBALL} has no src/libvgpu.c"
  # static_config.h as its CMake writes it for those options.
  sed -E -e 's/^#cmakedefine (DLSYM_HOOK_ENABLE|MULTIPROCESS_LIMIT_ENABLE|HOOK_MEMINFO_ENABLE|HOOK_NVML_ENABLE)$/#define \1/' \
    -e 's|^#cmakedefine (.*)$|/* #undef \1 */|' \
    -e "s|@GIT_HASH@|${sha:0:7}|" -e 's|@GIT_BRANCH@|pinned|' \
    "${src}/static_config.h.in" >"${dir}/config/static_config.h"
  log "compiling HAMi-core's libvgpu.so from $(basename "${TARBALL}")"
  gcc -shared -fPIC -g -D_GNU_SOURCE -w \
    -I"$(headers_dir)/include" -I"${src}" -I"${dir}/config" \
    "${src}/libvgpu.c" "${src}/utils.c" "${src}/log_utils.c" \
    "${src}"/nvml/*.c "${src}"/cuda/*.c "${src}/allocator/allocator.c" \
    "${src}/multiprocess/multiprocess_memory_limit.c" \
    "${src}/multiprocess/multiprocess_utilization_watcher.c" \
    -o "${dir}/libvgpu.so.tmp" -lpthread -ldl -lrt
  mv "${dir}/libvgpu.so.tmp" "${dir}/libvgpu.so"
  sha256sum "${dir}/libvgpu.so" | cut -d' ' -f1 >"${dir}/libvgpu.so.sha256"
  cp "$(dirname "${TARBALL}")/LICENSE" "${dir}/LICENSE"
  echo "HAMi-core $(basename "${TARBALL}") sha256:${sha}" >"${dir}/VERSION"
  echo "source ${sha} built $(date -u +%FT%TZ)" >"${dir}/.stamp"
}

standin_dir() {
  local h
  h="$(cat "${ROOT}"/tests/standin/*.c "${ROOT}"/tests/standin/*.h "${ROOT}/tests/standin/build.sh" \
    | sha256sum | cut -c1-12)"
  echo "${CACHE_DIR}/standin-${h}"
}

build_standin() {
  local dir
  dir="$(standin_dir)"
  [[ -f "${dir}/.stamp" ]] && return 0
  lock_dir "${dir}"
  [[ -f "${dir}/.stamp" ]] && return 0
  log "compiling the stand-in driver and gpu-workload (tests/standin)"
  bash "${ROOT}/tests/standin/build.sh" "${dir}" "$(headers_dir)/include"
  date -u +%FT%TZ >"${dir}/.stamp"
}

main() {
  case "${1:-}" in
    --print)
      [[ -f "$(hami_dir)/.stamp" && -f "$(standin_dir)/.stamp" ]] || return 1
      ;;
    --hami-core)
      local out="${2:?usage: $0 --hami-core DIR}" f
      command -v gcc >/dev/null || die "gcc not found (apt-get install gcc)"
      build_headers
      build_hami_core
      mkdir -p "${out}"
      for f in libvgpu.so libvgpu.so.sha256 LICENSE VERSION; do
        install -m 0644 "$(hami_dir)/${f}" "${out}/${f}"
      done
      echo "hami_core=${out}/libvgpu.so"
      return 0
      ;;
    "")
      command -v gcc >/dev/null || die "gcc not found (apt-get install gcc)"
      build_headers
      build_hami_core
      build_standin
      ;;
    *) echo "usage: $0 [--print]" >&2; return 2 ;;
  esac
  echo "hami_core=$(hami_dir)/libvgpu.so"
  echo "standin=$(standin_dir)"
}

main "$@"
