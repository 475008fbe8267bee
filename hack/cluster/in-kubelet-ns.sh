#!/usr/bin/env bash
# in-kubelet-ns.sh CMD [ARGS...]
#
# Runs CMD in a private mount namespace in which /var/lib/kubelet is the local
# cluster's kubelet root dir (KUBELET_ROOT_DIR, default
# /var/lib/gpu-share-cluster/kubelet).  For device plugins that hard-code the
# default kubelet paths, e.g. Kubernetes' sample-device-plugin, which always
# registers at /var/lib/kubelet/device-plugins/kubelet.sock.
#
# Only this process tree sees the mounts: /var/lib is covered by an empty
# tmpfs inside the namespace (nothing is created on the host), and
# /var/lib/kubelet is bind-mounted from KUBELET_ROOT_DIR.  CMD is exec'ed, so
# the pid of this script is the pid of CMD.
set -euo pipefail
ROOT="${KUBELET_ROOT_DIR:-${GPU_SHARE_CLUSTER_DIR:-/var/lib/gpu-share-cluster}/kubelet}"
(($#)) || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }
[[ -d "${ROOT}" ]] || { echo "in-kubelet-ns: ${ROOT} does not exist (cluster up?)" >&2; exit 1; }
if [[ "${_IN_KUBELET_NS:-}" != 1 ]]; then
  export _IN_KUBELET_NS=1 KUBELET_ROOT_DIR="${ROOT}"
  exec unshare --mount --propagation private "$0" "$@"
fi
mount -t tmpfs -o mode=0755 gpu-share-varlib /var/lib
mkdir -p /var/lib/kubelet
mount --bind "${ROOT}" /var/lib/kubelet
unset _IN_KUBELET_NS
exec "$@"
