#!/usr/bin/env bash
# hack/build-promtool.sh - builds (and caches) promtool, which the observability tests use
# to check /metrics scrapes, the chart's alert rules (check/test rules) and every
# dashboard query.
#
# promtool is built from the Prometheus Go module (github.com/prometheus/prometheus
# v0.3MM.P is Prometheus 3.MM.P) through the Go module proxy, like the cluster binaries
# (hack/cluster/build.sh).  The binary lands in
#   ${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/promtool-<version>/bin/promtool
# and a ".stamp" file is written after a successful build; a stamped cache is reused as
# is (a second run does no network I/O).  Nothing is written into the repository.
#
# Usage:  hack/build-promtool.sh           build (if needed) and print "promtool=<path>"
#         hack/build-promtool.sh --print   print only what is already built (no network)
#         hack/build-promtool.sh dir       print the cache directory of this version
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_PREFIX=build-promtool
# shellcheck source=hack/lib/common.sh
. "${HACK_DIR}/lib/common.sh"
# shellcheck source=hack/lib/gotool.sh
. "${HACK_DIR}/lib/gotool.sh"
CACHE_DIR="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}"
# The newest module whose go.mod (go 1.26.7) the pinned Go toolchain (1.26.x) reads.
PROMETHEUS_MODULE_VERSION="${PROMETHEUS_MODULE_VERSION:-v0.316.0}"
# A cold build is about 3-6 minutes on 2 cores; this bounds a wedged one.
BUILD_TIMEOUT_S="${PROMTOOL_BUILD_TIMEOUT_S:-1500}"

# v0.316.0 -> 3.16.0, the Prometheus release that module version is.
prometheus_version() {
  local v="${PROMETHEUS_MODULE_VERSION#v0.}" minor patch
  minor="${v%%.*}"
  patch="${v#*.}"
  echo "3.$((10#${minor} - 300)).${patch}"
}

promtool_dir() { echo "${CACHE_DIR}/promtool-$(prometheus_version)"; }

build_promtool() {
  local m=github.com/prometheus/prometheus version ld
  version="$(prometheus_version)"
  ld="-s -w -X github.com/prometheus/common/version.Version=${version}"
  ld+=" -X github.com/prometheus/common/version.Revision=module-${PROMETHEUS_MODULE_VERSION}"
  ld+=" -X github.com/prometheus/common/version.Branch=module"
  # A static binary (no cgo).
  go_tool_build promtool "$(promtool_dir)" "${m}/cmd/promtool@${PROMETHEUS_MODULE_VERSION}" 0 \
    "${ld}" "${BUILD_TIMEOUT_S}"
}

main() {
  case "${1:-}" in
    dir) promtool_dir ;;
    --print)
      [[ -f "$(promtool_dir)/.stamp" ]] || return 1
      echo "promtool=$(promtool_dir)/bin/promtool"
      ;;
    "")
      build_promtool
      echo "promtool=$(promtool_dir)/bin/promtool"
      ;;
    *) echo "usage: $0 [--print|dir]" >&2; return 2 ;;
  esac
}

main "$@"
