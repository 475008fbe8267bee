#!/usr/bin/env bash
# hack/build-cdi-hook.sh - builds (and caches) NVIDIA's nvidia-cdi-hook, whose
# createRuntime hook `apply-cuda-memory-limits` the enforcement tests run against the
# stand-in driver (tests/enforcement/test_cdi_memory_limits_hook.py).
#
# nvidia-cdi-hook is built from the NVIDIA container toolkit's Go module
# (github.com/NVIDIA/nvidia-container-toolkit, Apache-2.0) through the Go module proxy,
# like promtool (hack/build-promtool.sh). It needs cgo: go-nvml calls NVML through C
# stubs and dlopens libnvidia-ml.so.1 at run time, so gcc must be installed. The binary
# lands in
#   ${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/nvidia-cdi-hook-<version>/bin/nvidia-cdi-hook
# and a ".stamp" file is written after a successful build; a stamped cache is reused as
# is (a second run does no network I/O). Nothing is written into the repository.
#
# Usage:  hack/build-cdi-hook.sh           build (if needed) and print "nvidia-cdi-hook=<path>"
#         hack/build-cdi-hook.sh --print   print only what is already built (no network)
#         hack/build-cdi-hook.sh dir       print the cache directory of this version
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_PREFIX=build-cdi-hook
# shellcheck source=hack/lib/common.sh
. "${HACK_DIR}/lib/common.sh"
CACHE_DIR="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}"
# The release whose apply-cuda-memory-limits hook (NVML's per-cgroup memory limits) the
# tests pin; its go.mod says go 1.26.0, which the pinned Go toolchain (1.26.x) reads.
CDI_HOOK_VERSION="${CDI_HOOK_VERSION:-v1.20.2}"
# A cold build is about 1-3 minutes on 2 cores; this bounds a wedged one.
BUILD_TIMEOUT_S="${CDI_HOOK_BUILD_TIMEOUT_S:-900}"

hook_dir() { echo "${CACHE_DIR}/nvidia-cdi-hook-${CDI_HOOK_VERSION#v}"; }

build_hook() {
  local dir m=github.com/NVIDIA/nvidia-container-toolkit ld start
  dir="$(hook_dir)"
  if [[ -f "${dir}/.stamp" && -x "${dir}/bin/nvidia-cdi-hook" ]]; then
    return 0
  fi
  command -v go >/dev/null || die "go not found in PATH (needed to build nvidia-cdi-hook)"
  command -v gcc >/dev/null || die "gcc not found (nvidia-cdi-hook needs cgo: apt-get install gcc)"
  mkdir -p "${dir}"
  # One build at a time (parallel test runs share the cache); the winner's stamp ends it.
  exec 8>"${dir}/.lock"
  if ! flock -n 8; then
    log "waiting for another build of nvidia-cdi-hook ${CDI_HOOK_VERSION}"
    flock 8
  fi
  if [[ -f "${dir}/.stamp" && -x "${dir}/bin/nvidia-cdi-hook" ]]; then
    return 0
  fi
  rm -rf "${dir}/bin.tmp"
  mkdir -p "${dir}/bin.tmp"
  # As the toolkit's Makefile links its commands: NVML's symbols stay unresolved in the
  # binary (resolved lazily from the libnvidia-ml.so.1 it dlopens with RTLD_GLOBAL), and
  # the version its --version prints.
  ld="-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy'"
  ld+=" -X ${m}/internal/info.version=${CDI_HOOK_VERSION#v}"
  ld+=" -X ${m}/internal/info.gitCommit=module-${CDI_HOOK_VERSION}"
  start=$SECONDS
  # `go install pkg@version` builds with the module's own go.mod/go.sum (it has no replace
  # or exclude directives), so every machine gets the same dependency set.
  CGO_ENABLED=1 GOFLAGS="${GOFLAGS:-} -buildvcs=false" GOBIN="${dir}/bin.tmp" \
    run_with_progress "building nvidia-cdi-hook (${m} ${CDI_HOOK_VERSION})" \
    "${dir}/build.log" \
    timeout "${BUILD_TIMEOUT_S}" go install -trimpath -ldflags="${ld}" \
    "${m}/cmd/nvidia-cdi-hook@${CDI_HOOK_VERSION}"
  "${dir}/bin.tmp/nvidia-cdi-hook" --version >/dev/null \
    || die "the built nvidia-cdi-hook does not run"
  rm -rf "${dir:?}/bin"
  mv "${dir}/bin.tmp" "${dir}/bin"
  echo "built $(date -u +%FT%TZ) in $((SECONDS - start))s" >"${dir}/.stamp"
  log "nvidia-cdi-hook ${CDI_HOOK_VERSION} in ${dir}/bin ($(cat "${dir}/.stamp"))"
}

main() {
  case "${1:-}" in
    dir) hook_dir ;;
    --print)
      [[ -f "$(hook_dir)/.stamp" && -x "$(hook_dir)/bin/nvidia-cdi-hook" ]] || return 1
      echo "nvidia-cdi-hook=$(hook_dir)/bin/nvidia-cdi-hook"
      ;;
    "")
      build_hook
      echo "nvidia-cdi-hook=$(hook_dir)/bin/nvidia-cdi-hook"
      ;;
    *) echo "usage: $0 [--print|dir]" >&2; return 2 ;;
  esac
}

main "$@"
