#!/usr/bin/env bash
# hack/build-scheduler-image.sh - build localhost/kube-scheduler:local from the local
# cluster's cached kube-scheduler binary and import it into the cluster's containerd, for
# the chart's optional second scheduler (scheduler.enabled, docs/extender.md).
#
#   hack/build-scheduler-image.sh               build (if the binary changed) + import
#   hack/build-scheduler-image.sh --no-import   only build/cache the image tar
#   hack/build-scheduler-image.sh --print-tar   print the path of the cached tar (no build)
# The path of the image tar is printed on stdout (progress goes to stderr).
#
# How: the binary is the static (CGO_ENABLED=0) kube-scheduler that hack/cluster/build.sh
# k8s built for the cluster's own version (hack/k8s/go.mod), so the image needs no base:
# one reproducible layer written by hack/cluster/oci.py, like the cluster's pause and
# busybox images (no buildah, no registry). Cached as
# ${GPU_SHARE_CACHE}/images/kube-scheduler-<version>-<hash of binary + oci.py>.tar and
# imported with `hack/local-up-cluster.sh import-image` unless containerd already holds
# that exact manifest.
#
# Settings: GPU_SHARE_CACHE (default ~/.cache/gpu-share), GPU_SHARE_SCHEDULER_IMAGE
# (default localhost/kube-scheduler:local), K8S_VERSION (default: hack/k8s/go.mod).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG_PREFIX=build-scheduler-image
# shellcheck source=hack/lib/common.sh
. "${HACK_DIR}/lib/common.sh"
CACHE_DIR="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}"
IMAGES_DIR="${CACHE_DIR}/images"
IMAGE="${GPU_SHARE_SCHEDULER_IMAGE:-localhost/kube-scheduler:local}"
K8S_VERSION="${K8S_VERSION:-$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "${HACK_DIR}/k8s/go.mod")}"
BIN="${CACHE_DIR}/k8s-${K8S_VERSION}/bin/kube-scheduler"
OCI="${HACK_DIR}/cluster/oci.py"

ensure_binary() {
  [[ -f "${CACHE_DIR}/k8s-${K8S_VERSION}/.stamp" && -x "${BIN}" ]] && return 0
  log "no cached kube-scheduler ${K8S_VERSION}: building the cluster's binaries"
  K8S_VERSION="${K8S_VERSION}" bash "${HACK_DIR}/cluster/build.sh" k8s
}

tar_path() {
  local key
  key="$( (sha256sum "${BIN}" | cut -d' ' -f1; echo "${IMAGE}"; cat "${OCI}") | sha256sum | cut -c1-12)"
  echo "${IMAGES_DIR}/kube-scheduler-${K8S_VERSION}-${key}.tar"
}

build() {
  local tar="$1"
  log "building ${IMAGE} from ${BIN}"
  rm -f "${tar}.tmp"
  # The chart runs `kube-scheduler --config=...`: the binary must be on PATH. It runs as
  # uid 65532 with a read-only root: it writes nothing (self-signed serving cert in memory).
  python3 "${OCI}" build-image --tag "${IMAGE}" \
    --add "${BIN}=/usr/local/bin/kube-scheduler" \
    --env PATH=/usr/local/bin:/usr/bin:/bin \
    --entrypoint /usr/local/bin/kube-scheduler \
    --label "org.opencontainers.image.version=${K8S_VERSION}" \
    -o "${tar}.tmp" >/dev/null
  mv "${tar}.tmp" "${tar}"
  find "${IMAGES_DIR}" -maxdepth 1 -name 'kube-scheduler-*.tar' ! -path "${tar}" -delete
  log "image cached: ${tar} ($(du -m "${tar}" | cut -f1) MiB)"
}

# The manifest digest recorded in an OCI layout tar (what containerd lists as the target).
tar_manifest_digest() {
  tar -xOf "$1" index.json | python3 -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["digest"])'
}

# image_held TAR TARGET : whether TARGET is the manifest digest of TAR.
image_held() {
  [[ "$2" == "$(tar_manifest_digest "$1")" ]]
}

main() {
  local do_import=1
  case "${1:-}" in
    --no-import) do_import=0 ;;
    --print-tar) tar_path; return 0 ;;
    "") ;;
    *) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
  mkdir -p "${IMAGES_DIR}"
  local start=$SECONDS tar
  ensure_binary
  tar="$(tar_path)"
  if [[ -f "${tar}" ]]; then
    log "image up to date: ${tar}"
  else
    build "${tar}"
  fi
  if ((do_import)); then import_unless_held "${IMAGE}" "${tar}" image_held; fi
  log "done in $((SECONDS - start))s"
  echo "${tar}"
}

main "$@"
