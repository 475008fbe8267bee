#!/usr/bin/env bash
# hack/build-kwok.sh - builds (and caches) kwok, which bench/scale and tests/scale use to
# simulate thousands of nodes (and their pods' lifecycles) against the local cluster's
# API server: no kubelet, no device plugin, the node status is written by the bench.
#
# kwok is built from its published Go module (sigs.k8s.io/kwok) through the Go module
# proxy, like the cluster binaries (hack/cluster/build.sh) and promtool.  The binary
# lands in
#   ${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/kwok-<version>/bin/kwok
# and a ".stamp" file is written after a successful build; a stamped cache is reused as
# is (a second run does no network I/O).  Nothing is written into the repository.
#
# Usage:  hack/build-kwok.sh           build (if needed) and print "kwok=<path>"
#         hack/build-kwok.sh --print   print only what is already built (no network)
#         hack/build-kwok.sh dir       print the cache directory of this version
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_PREFIX=build-kwok
# shellcheck source=hack/lib/common.sh
. "${HACK_DIR}/lib/common.sh"
# shellcheck source=hack/lib/gotool.sh
. "${HACK_DIR}/lib/gotool.sh"
CACHE_DIR="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}"
# v0.8.0: its go.mod says go 1.26.0 (the pinned toolchain is 1.26.x) and it is built on
# client-go v0.36, one minor ahead of the local v1.35 API server (inside the supported
# client skew); it has no replace/exclude directives, so `go install pkg@version` works.
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
# A cold build is a few minutes on 2 cores; this bounds a wedged one.
BUILD_TIMEOUT_S="${KWOK_BUILD_TIMEOUT_S:-1500}"

kwok_dir() { echo "${CACHE_DIR}/kwok-${KWOK_VERSION}"; }

build_kwok() {
  local m=sigs.k8s.io/kwok
  # The same version stamp kwok's own release script sets; a static binary (no cgo).
  go_tool_build kwok "$(kwok_dir)" "${m}/cmd/kwok@${KWOK_VERSION}" 0 \
    "-s -w -X ${m}/pkg/consts.Version=${KWOK_VERSION#v}" "${BUILD_TIMEOUT_S}"
}

main() {
  case "${1:-}" in
    dir) kwok_dir ;;
    --print)
      [[ -f "$(kwok_dir)/.stamp" ]] || return 1
      echo "kwok=$(kwok_dir)/bin/kwok"
      ;;
    "")
      build_kwok
      echo "kwok=$(kwok_dir)/bin/kwok"
      ;;
    *) echo "usage: $0 [--print|dir]" >&2; return 2 ;;
  esac
}

main "$@"
