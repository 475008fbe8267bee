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
# shellcheck source=hack/lib/gotool.sh
. "${HACK_DIR}/lib/gotool.sh"
CACHE_DIR="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}"
# The release whose apply-cuda-memory-limits hook (NVML's per-cgroup memory limits) the
# tests pin; its go.mod says go 1.26.0, which the pinned Go toolchain (1.26.x) reads.
CDI_HOOK_VERSION="${CDI_HOOK_VERSION:-v1.20.2}"
# A cold build is about 1-3 minutes on 2 cores; this bounds a wedged one.
BUILD_TIMEOUT_S="${CDI_HOOK_BUILD_TIMEOUT_S:-900}"

hook_dir() { echo "${CACHE_DIR}/nvidia-cdi-hook-${CDI_HOOK_VERSION#v}"; }

build_hook() {
  local m=github.com/NVIDIA/nvidia-container-toolkit ld
  # As the toolkit's Makefile links its commands: NVML's symbols stay unresolved in the
  # binary (resolved lazily from the libnvidia-ml.so.1 it dlopens with RTLD_GLOBAL), and
  # the version its --version prints. cgo: go-nvml calls NVML through C stubs.
  ld="-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy'"
  ld+=" -X ${m}/internal/info.version=${CDI_HOOK_VERSION#v}"
  ld+=" -X ${m}/internal/info.gitCommit=module-${CDI_HOOK_VERSION}"
  go_tool_build nvidia-cdi-hook "$(hook_dir)" "${m}/cmd/nvidia-cdi-hook@${CDI_HOOK_VERSION}" \
    1 "${ld}" "${BUILD_TIMEOUT_S}"
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
