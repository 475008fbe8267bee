#!/usr/bin/env bash
# in-kubelet-ns.sh CMD [ARGS...]
#
# Runs CMD in a private mount namespace in which /var/lib/kubelet looks like
# the default kubelet root dir while the local cluster's kubelet uses
# --root-dir=KUBELET_ROOT_DIR (default /var/lib/gpu-share-cluster/kubelet):
#   /var/lib/kubelet                 -> KUBELET_ROOT_DIR (pods, pod-resources/, plugins/, ...)
#   /var/lib/kubelet/device-plugins  -> the host's /var/lib/kubelet/device-plugins
#                                       (the kubelet hard-codes that path)
# so a program that uses the default /var/lib/kubelet/pod-resources/kubelet.sock
# finds the cluster's PodResources socket.
#
# Only this process tree sees the mounts (nothing is mounted on the host; the
# host's /var/lib/kubelet exists while the cluster runs, because the kubelet
# creates /var/lib/kubelet/device-plugins).  CMD is exec'ed, so the pid of
# this script is the pid of CMD.
set -euo pipefail
ROOT="${KUBELET_ROOT_DIR:-${GPU_SHARE_CLUSTER_DIR:-/var/lib/gpu-share-cluster}/kubelet}"
DP_HOST=/var/lib/kubelet/device-plugins
(($#)) || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }
[[ -d "${ROOT}" ]] || { echo "in-kubelet-ns: ${ROOT} does not exist (cluster up?)" >&2; exit 1; }
[[ -d "${DP_HOST}" ]] || { echo "in-kubelet-ns: ${DP_HOST} does not exist (cluster up?)" >&2; exit 1; }
if [[ "${_IN_KUBELET_NS:-}" != 1 ]]; then
  export _IN_KUBELET_NS=1 KUBELET_ROOT_DIR="${ROOT}"
  exec unshare --mount --propagation private "$0" "$@"
fi
unset _IN_KUBELET_NS
# Keep the real device-plugin dir reachable under the root dir first (inside
# this namespace only), then put the root dir (with that submount) in place.
mkdir -p "${ROOT}/device-plugins"
mount --bind "${DP_HOST}" "${ROOT}/device-plugins"
mount --rbind "${ROOT}" /var/lib/kubelet
exec "$@"
