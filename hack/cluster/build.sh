#!/usr/bin/env bash
# Builds (and caches) the binaries hack/local-up-cluster.sh needs.
#
#   hack/cluster/build.sh k8s     kube-apiserver, kube-controller-manager,
#                                 kube-scheduler, kubelet, kubectl and the
#                                 sample-device-plugin from k8s.io/kubernetes
#   hack/cluster/build.sh etcd    etcd + etcdctl from go.etcd.io/etcd modules
#   hack/cluster/build.sh containerd
#                                 containerd, containerd-shim-runc-v2 and ctr from
#                                 the github.com/containerd/containerd module (CDI)
#   hack/cluster/build.sh k8s-136 kube-scheduler alone from k8s.io/kubernetes v1.36
#                                 (hack/k8s-136/go.mod): bench.scale --dra-scheduler 1.36
#                                 runs the DRA path on it; not part of `all`
#   hack/cluster/build.sh all
#
# Outputs go to ${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/<name>-<version>/bin
# and a ".stamp" file is written after a successful build; a stamped cache is
# reused as is.  Nothing is written into the repository.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOG_PREFIX=build
# shellcheck source=hack/lib/common.sh
. "${HACK_DIR}/lib/common.sh"
CACHE_DIR="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}"
# The version is the one hack/k8s/go.mod requires (one place to change it).
K8S_VERSION="${K8S_VERSION:-$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "${HACK_DIR}/k8s/go.mod")}"
# kube-scheduler v1.36 (its DRA allocator; the cluster itself stays on K8S_VERSION).
K8S_136_VERSION="${K8S_136_VERSION:-$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "${HACK_DIR}/k8s-136/go.mod")}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
# 1.7 is the newest line that still reads the version-2 config of
# hack/templates/containerd-config.toml and supports cgroup v1 fully; it has CDI.
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v1.7.35}"

k8s_dir() { echo "${CACHE_DIR}/k8s-${K8S_VERSION}"; }
k8s_136_dir() { echo "${CACHE_DIR}/kube-scheduler-${K8S_136_VERSION}"; }
etcd_dir() { echo "${CACHE_DIR}/etcd-${ETCD_VERSION}"; }
containerd_dir() { echo "${CACHE_DIR}/containerd-${CONTAINERD_VERSION}"; }

go_env() {
  export CGO_ENABLED=0
  # -mod=readonly (the default) on purpose: the build never edits the
  # committed go.mod/go.sum of the wrapper modules.
  export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
  command -v go >/dev/null || die "go not found in PATH"
}

# start_build DIR WHAT : false, saying so, when DIR holds a stamped build of WHAT; else
# Go's environment and an empty DIR/bin.tmp to build into.
start_build() {
  if [[ -f "$1/.stamp" ]]; then
    log "$2 already built in $1"
    return 1
  fi
  go_env
  rm -rf "$1/bin.tmp"
  mkdir -p "$1/bin.tmp" || die "cannot create $1/bin.tmp"
}

# go_build NAME VERSION DIR SRC LDFLAGS PKG... : `go build` of PKG... in the module SRC
# into DIR/bin.tmp (its output in DIR/build.log, a progress line now and then); then
# DIR/bin.tmp becomes DIR/bin, stamped with the seconds the build took.
go_build() {
  local name="$1" version="$2" dir="$3" src="$4" ld="$5" start=$SECONDS
  shift 5
  # shellcheck disable=SC2016 # the inner script expands its own positional parameters
  run_with_progress "building ${name} ${version}" "${dir}/build.log" \
    bash -c 'cd "$0" && exec go build -v -trimpath -ldflags="$1" -o "$2" "${@:3}"' \
    "${src}" "${ld}" "${dir}/bin.tmp/" "$@"
  rm -rf "${dir:?}/bin"
  mv "${dir}/bin.tmp" "${dir}/bin"
  echo "built $(date -u +%FT%TZ) in $(( SECONDS - start ))s" >"${dir}/.stamp"
  log "${name} binaries in ${dir}/bin: $(find "${dir}/bin" -maxdepth 1 -type f -printf '%f ')"
}

# The Kubernetes build takes tens of minutes on 2 cores: a progress line a minute.
PROGRESS_EVERY=60
# k8s_ldflags VERSION : -ldflags stamping VERSION into the binaries (what --version and the
# API server's /version clients see).
k8s_ldflags() {
  local version="$1" minor="${1#v1.}" ld="-s -w" p
  minor="${minor%%.*}"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X ${p}.gitVersion=${version}"
    ld+=" -X ${p}.gitMajor=1 -X ${p}.gitMinor=${minor}"
    ld+=" -X ${p}.gitTreeState=clean"
    ld+=" -X ${p}.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  done
  echo "${ld}"
}

build_k8s() {
  local dir; dir="$(k8s_dir)"
  start_build "${dir}" "Kubernetes ${K8S_VERSION}" || return 0
  go_build Kubernetes "${K8S_VERSION}" "${dir}" "${HACK_DIR}/k8s" "$(k8s_ldflags "${K8S_VERSION}")" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/test/images/sample-device-plugin
}

# kube-scheduler alone, from hack/k8s-136 (its modules come from the module proxy the
# first time). Builds of one cache dir take turns under its .lock: parallel test runs may
# ask for it at once.
build_k8s_136() {
  local dir; dir="$(k8s_136_dir)"
  mkdir -p "${dir}"
  exec 8>"${dir}/.lock"
  if ! flock -n 8; then
    log "waiting for another build of kube-scheduler ${K8S_136_VERSION}"
    flock 8
  fi
  start_build "${dir}" "kube-scheduler ${K8S_136_VERSION}" || return 0
  go_build kube-scheduler "${K8S_136_VERSION}" "${dir}" "${HACK_DIR}/k8s-136" \
    "$(k8s_ldflags "${K8S_136_VERSION}")" k8s.io/kubernetes/cmd/kube-scheduler
  "${dir}/bin/kube-scheduler" --version >/dev/null || die "the built kube-scheduler does not run"
}

build_etcd() {
  local dir; dir="$(etcd_dir)"
  start_build "${dir}" "etcd ${ETCD_VERSION}" || return 0
  go_build etcd "${ETCD_VERSION}" "${dir}" "${HACK_DIR}/etcd" "-s -w" \
    . go.etcd.io/etcd/etcdctl/v3
}

# Built inside the published module itself (downloaded into the module cache), so its
# own go.mod/go.sum pick every dependency: `go install pkg@version` refuses this module
# (its go.mod has an exclude directive) and a wrapper module would resolve differently.
# CGO_ENABLED=0 leaves out the btrfs snapshotter (cgo only; disabled in the config), as
# containerd's own static shim build does.
build_containerd() {
  local dir; dir="$(containerd_dir)"
  start_build "${dir}" "containerd ${CONTAINERD_VERSION}" || return 0
  local m=github.com/containerd/containerd src
  src="$(go mod download -json "${m}@${CONTAINERD_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')"
  [[ -n "${src}" && -f "${src}/go.mod" ]] || die "could not download ${m}@${CONTAINERD_VERSION}"
  local ld="-s -w -X ${m}/version.Version=${CONTAINERD_VERSION} -X ${m}/version.Revision=module"
  go_build containerd "${CONTAINERD_VERSION}" "${dir}" "${src}" "${ld}" \
    ./cmd/containerd ./cmd/containerd-shim-runc-v2 ./cmd/ctr
}

case "${1:-all}" in
  k8s) build_k8s ;;
  k8s-136) build_k8s_136 ;;
  etcd) build_etcd ;;
  containerd) build_containerd ;;
  all) build_etcd; build_k8s; build_containerd ;;
  k8s-dir) k8s_dir ;;
  k8s-136-dir) k8s_136_dir ;;
  etcd-dir) etcd_dir ;;
  containerd-dir) containerd_dir ;;
  *) echo "usage: $0 k8s|k8s-136|etcd|containerd|all|k8s-dir|k8s-136-dir|etcd-dir|containerd-dir" >&2; exit 2 ;;
esac
