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
CACHE_DIR="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}"
# v0.8.0: its go.mod says go 1.26.0 (the pinned toolchain is 1.26.x) and it is built on
# client-go v0.36, one minor ahead of the local v1.35 API server (inside the supported
# client skew); it has no replace/exclude directives, so `go install pkg@version` works.
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
# A cold build is a few minutes on 2 cores; this bounds a wedged one.
BUILD_TIMEOUT_S="${KWOK_BUILD_TIMEOUT_S:-1500}"

kwok_dir() { echo "${CACHE_DIR}/kwok-${KWOK_VERSION}"; }

build_kwok() {
  local dir m=sigs.k8s.io/kwok ld start
  dir="$(kwok_dir)"
  if [[ -f "${dir}/.stamp" && -x "${dir}/bin/kwok" ]]; then
    return 0
  fi
  command -v go >/dev/null || die "go not found in PATH (needed to build kwok)"
  mkdir -p "${dir}"
  # One build at a time (parallel test runs share the cache); the winner's stamp ends it.
  exec 8>"${dir}/.lock"
  if ! flock -n 8; then
    log "waiting for another build of kwok ${KWOK_VERSION}"
    flock 8
  fi
  if [[ -f "${dir}/.stamp" && -x "${dir}/bin/kwok" ]]; then
    return 0
  fi
  rm -rf "${dir}/bin.tmp"
  mkdir -p "${dir}/bin.tmp"
  # The same version stamp kwok's own release script sets.
  ld="-s -w -X ${m}/pkg/consts.Version=${KWOK_VERSION#v}"
  start=$SECONDS
  # `go install pkg@version` builds with the module's own go.mod/go.sum, so every machine
  # gets the same dependency set; CGO_ENABLED=0: a static binary, no C toolchain needed.
  CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -buildvcs=false" GOBIN="${dir}/bin.tmp" \
    run_with_progress "building kwok ${KWOK_VERSION} (${m})" "${dir}/build.log" \
    timeout "${BUILD_TIMEOUT_S}" go install -trimpath -ldflags="${ld}" \
    "${m}/cmd/kwok@${KWOK_VERSION}"
  "${dir}/bin.tmp/kwok" --version >/dev/null || die "the built kwok does not run"
  rm -rf "${dir:?}/bin"
  mv "${dir}/bin.tmp" "${dir}/bin"
  echo "built $(date -u +%FT%TZ) in $((SECONDS - start))s" >"${dir}/.stamp"
  log "kwok ${KWOK_VERSION} in ${dir}/bin ($(cat "${dir}/.stamp"))"
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
