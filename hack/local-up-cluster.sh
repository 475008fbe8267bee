#!/usr/bin/env bash
# hack/local-up-cluster.sh - a real single-node Kubernetes on loopback for the
# gpu-share tests and demos (in the spirit of Kubernetes' own
# hack/local-up-cluster.sh).  Run as root.
#
#   hack/local-up-cluster.sh up            build what is missing, start everything,
#                                          wait for the node to be Ready (no-op if up)
#   hack/local-up-cluster.sh down          stop everything, clean mounts, remove state
#   hack/local-up-cluster.sh status        what runs (exit 0 only if everything does)
#   hack/local-up-cluster.sh env           `export` lines (KUBECONFIG, DEVICE_PLUGIN_DIR, ...)
#   hack/local-up-cluster.sh env --json    one JSON object: {"env": {NAME: value, ...},
#                                          "check": {"ok": bool, "reason": why not}}
#   hack/local-up-cluster.sh import-image TAR...   import image tars into the
#                                          cluster's containerd (k8s.io namespace)
#   hack/local-up-cluster.sh restart-kubelet   stop + start the kubelet, wait for Ready
#   hack/local-up-cluster.sh restart-controller-manager   stop + start kube-controller-manager
#                                          (GPU_SHARE_KCM_API_QPS as set now), wait for /healthz
#   hack/local-up-cluster.sh stop-kubelet | start-kubelet   one half of it (failure tests)
#   hack/local-up-cluster.sh stop-apiserver | start-apiserver   take the API server away
#                                          and bring it back (waits for /readyz)
#   hack/local-up-cluster.sh restart-containerd  stop the kubelet and every container,
#                                          start containerd afresh (GPU_SHARE_CONTAINERD picks
#                                          which; images re-imported), start the kubelet
#   hack/local-up-cluster.sh build         only build/cache the binaries and images
#   hack/local-up-cluster.sh logs COMPONENT  tail -f a component log
#
# Settings (environment):
#   GPU_SHARE_CLUSTER_DIR  work dir (default /var/lib/gpu-share-cluster)
#   GPU_SHARE_CACHE        build cache (default $HOME/.cache/gpu-share)
#   GPU_SHARE_NODE_NAME    node name (default gpu-share-node)
#   GPU_SHARE_POD_CIDR     bridge subnet (default 10.88.77.0/24)
#   GPU_SHARE_UP_TIMEOUT   seconds to wait for each component (default 180)
#   GPU_SHARE_CONTAINERD   built (default: containerd 1.7 built from its Go module, with
#                          CDI) or system (Debian's /usr/bin/containerd 1.6, no CDI)
#   GPU_SHARE_FEATURE_GATES  --feature-gates of every component (default
#                          DRAConsumableCapacity=true,DRADeviceTaints=true, for the DRA
#                          mode: consumable capacity, and the taint of a cordoned device)
#   GPU_SHARE_KCM_API_QPS  kube-controller-manager's --kube-api-qps (burst: twice that);
#                          default unset: its own 20 (burst 30). Each controller has its own
#                          client at that rate: the resource claim controller makes a pod's
#                          claim and writes the pod's status, 2 writes a pod
# Config files are rendered from hack/templates/. See docs/local-cluster.md.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TEMPLATES="${HACK_DIR}/templates"
LOG_PREFIX=local-up
# shellcheck source=hack/lib/common.sh
. "${HACK_DIR}/lib/common.sh"

WORK_DIR="${GPU_SHARE_CLUSTER_DIR:-/var/lib/gpu-share-cluster}"
CACHE_DIR="${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}"
export GPU_SHARE_CACHE="${CACHE_DIR}"
NODE_NAME="${GPU_SHARE_NODE_NAME:-gpu-share-node}"
# shellcheck disable=SC2034 # POD_CIDR, like the other settings, is read by render
POD_CIDR="${GPU_SHARE_POD_CIDR:-10.88.77.0/24}"
UP_TIMEOUT="${GPU_SHARE_UP_TIMEOUT:-180}"
# DRA with consumable capacity (KEP-5075, alpha in 1.34) for gpu-share's DRA mode, and
# device taints (KEP-5055, alpha in 1.35: without it the API server drops the NoSchedule
# taint of a cordoned device from the ResourceSlice); the device-plugin mode depends on
# neither. Same gates on every component.
FEATURE_GATES="${GPU_SHARE_FEATURE_GATES:-DRAConsumableCapacity=true,DRADeviceTaints=true}"
KCM_API_QPS="${GPU_SHARE_KCM_API_QPS:-}"
SERVICE_CIDR="10.0.0.0/24"
SERVICE_IP="10.0.0.1"
API_PORT=6443
ETCD_CLIENT_PORT=2379
ETCD_PEER_PORT=2380
KUBELET_PORT=10250
BRIDGE=gsbr0
CNI_BIN_DIR="${CNI_BIN_DIR:-/usr/lib/cni}"
PAUSE_IMAGE="localhost/pause:local"
BUSYBOX_IMAGE="localhost/busybox:local"

PKI_DIR="${WORK_DIR}/pki"
KUBECONFIG_DIR="${WORK_DIR}/kubeconfig"
ADMIN_KUBECONFIG="${KUBECONFIG_DIR}/admin.kubeconfig"
LOG_DIR="${WORK_DIR}/logs"
RUN_DIR="${WORK_DIR}/run"
CONF_DIR="${WORK_DIR}/config"
KUBELET_ROOT_DIR="${WORK_DIR}/kubelet"
CONTAINERD_DIR="${WORK_DIR}/containerd"
CONTAINERD_SOCK="${CONTAINERD_DIR}/containerd.sock"
CNI_DIR="${WORK_DIR}/cni"
HOSTS_MARK="# gpu-share-local-cluster"
# The kubelet's device manager ignores --root-dir: its registration socket is
# always /var/lib/kubelet/device-plugins/kubelet.sock (pluginapi.KubeletSocket).
DEVICE_PLUGIN_DIR=/var/lib/kubelet/device-plugins

COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet)

K8S_BIN="$("${HACK_DIR}/cluster/build.sh" k8s-dir)/bin"
CONTAINERD_FLAVOUR="${GPU_SHARE_CONTAINERD:-built}"
case "${CONTAINERD_FLAVOUR}" in
  built) CONTAINERD_BIN_DIR="$("${HACK_DIR}/cluster/build.sh" containerd-dir)/bin" ;;
  # Debian's package: containerd, containerd-shim-runc-v2 and ctr in /usr/bin.
  system) CONTAINERD_BIN_DIR="$(dirname "$(command -v containerd || echo /usr/bin/containerd)")" ;;
  *) die "GPU_SHARE_CONTAINERD must be built or system, not '${CONTAINERD_FLAVOUR}'" ;;
esac
CTR="${CONTAINERD_BIN_DIR}/ctr"
ETCD_BIN="$("${HACK_DIR}/cluster/build.sh" etcd-dir)/bin"
KUBECTL="${K8S_BIN}/kubectl"

need_root() {
  [[ "$(id -u)" == 0 ]] || die "must run as root (it starts containerd and the kubelet)"
}

# ---------------------------------------------------------------- processes

pid_of() {
  local f="${RUN_DIR}/$1.pid"
  [[ -f "$f" ]] || return 1
  local pid; pid="$(cat "$f")"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

is_running() { pid_of "$1" >/dev/null; }

# start NAME BINARY ARGS... : runs detached in its own session, logs to
# logs/NAME.log, pid in run/NAME.pid.  A running NAME is left alone.
start() {
  local name="$1"; shift
  if is_running "$name"; then
    log "${name} already running (pid $(pid_of "$name"))"
    return 0
  fi
  mkdir -p "${LOG_DIR}" "${RUN_DIR}"
  echo "=== $(date -u +%FT%TZ) starting: $*" >>"${LOG_DIR}/${name}.log"
  # Inherited descriptors are closed first: a caller's lock (flock 9 in hack/demo.sh, or
  # `flock LOCK cmd`) must not be held by the daemons for as long as the cluster runs.
  (
    for fd in /proc/"${BASHPID}"/fd/*; do
      fd=${fd##*/}
      if [[ "$fd" -gt 2 ]]; then eval "exec ${fd}>&-" 2>/dev/null || true; fi
    done
    exec setsid "$@" </dev/null >>"${LOG_DIR}/${name}.log" 2>&1
  ) &
  echo $! >"${RUN_DIR}/${name}.pid"
  log "started ${name} (pid $!, log ${LOG_DIR}/${name}.log)"
}

# stop NAME : SIGTERM, wait up to 15 s, then SIGKILL.
stop() {
  local name="$1" pid
  if pid="$(pid_of "$name")"; then
    log "stopping ${name} (pid ${pid})"
    kill -TERM "$pid" 2>/dev/null || true
    wait_until 15 gone "$pid" || true
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "${RUN_DIR}/${name}.pid"
}

gone() { ! kill -0 "$1" 2>/dev/null; }

# wait_for DESC COMPONENT CMD... : retries CMD until it succeeds; fails with
# the tail of the component's log after UP_TIMEOUT seconds or if it died.
wait_for() {
  local desc="$1" comp="$2" rc=0; shift 2
  wait_until "${UP_TIMEOUT}" --while is_running "$comp" -- "$@" || rc=$?
  if ((rc)); then
    echo "---- last lines of ${LOG_DIR}/${comp}.log" >&2
    tail -n 40 "${LOG_DIR}/${comp}.log" >&2 || true
    ((rc == 2)) && die "${comp} exited while waiting for ${desc}"
    die "timed out after ${UP_TIMEOUT}s waiting for ${desc}"
  fi
  log "${desc}: ok"
}

kubectl_admin() { "${KUBECTL}" --kubeconfig "${ADMIN_KUBECONFIG}" "$@"; }

# ---------------------------------------------------------------- prerequisites

ensure_packages() {
  local missing=()
  if [[ "${CONTAINERD_FLAVOUR}" == system ]]; then
    command -v containerd >/dev/null || missing+=(containerd)
  fi
  command -v runc >/dev/null || missing+=(runc)
  [[ -x "${CNI_BIN_DIR}/bridge" && -x "${CNI_BIN_DIR}/host-local" && -x "${CNI_BIN_DIR}/loopback" ]] ||
    missing+=(containernetworking-plugins)
  [[ -x /bin/busybox ]] && ! file -L /bin/busybox 2>/dev/null | grep -q dynamic || missing+=(busybox-static)
  command -v file >/dev/null || missing+=(file)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v gcc >/dev/null || missing+=(gcc libc6-dev)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v unshare >/dev/null || missing+=(util-linux)
  command -v go >/dev/null || die "Go is required to build Kubernetes and etcd (go not in PATH)"
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

build_all() {
  "${HACK_DIR}/cluster/build.sh" etcd
  "${HACK_DIR}/cluster/build.sh" k8s
  # The default containerd is always built, so switching to it later costs no build.
  "${HACK_DIR}/cluster/build.sh" containerd
  build_images
}

# Images are built from sources/packages on this machine and cached by content.
build_images() {
  local img_dir="${CACHE_DIR}/images" key
  mkdir -p "${img_dir}"
  key="$(cat "${HACK_DIR}/images/pause/pause.c" "${HACK_DIR}/cluster/oci.py" | sha256sum | cut -c1-12)"
  PAUSE_TAR="${img_dir}/pause-${key}.tar"
  if [[ ! -f "${PAUSE_TAR}" ]]; then
    log "building ${PAUSE_IMAGE} from hack/images/pause/pause.c"
    local tmp; tmp="$(mktemp -d)"
    gcc -static -Os -Wall -o "${tmp}/pause" "${HACK_DIR}/images/pause/pause.c"
    strip "${tmp}/pause" 2>/dev/null || true
    python3 "${HACK_DIR}/cluster/oci.py" build-image --tag "${PAUSE_IMAGE}" \
      --add "${tmp}/pause=/pause" --entrypoint /pause -o "${PAUSE_TAR}" >/dev/null
    rm -rf "${tmp}"
  fi
  key="$( (sha256sum /bin/busybox; cat "${HACK_DIR}/cluster/oci.py") | sha256sum | cut -c1-12)"
  BUSYBOX_TAR="${img_dir}/busybox-${key}.tar"
  if [[ ! -f "${BUSYBOX_TAR}" ]]; then
    log "building ${BUSYBOX_IMAGE} from Debian's busybox-static"
    local tmp; tmp="$(mktemp -d)"
    python3 "${HACK_DIR}/cluster/oci.py" busybox-rootfs "${tmp}/rootfs"
    python3 "${HACK_DIR}/cluster/oci.py" build-image --tag "${BUSYBOX_IMAGE}" \
      --rootfs "${tmp}/rootfs" --cmd sh -o "${BUSYBOX_TAR}" >/dev/null
    rm -rf "${tmp}"
  fi
}

# ---------------------------------------------------------------- configuration

# shellcheck disable=SC2034 # user, ca, crt and k are read by render
write_kubeconfig() {
  local file="$1" user="$2" cert="$3" key="$4"
  local ca crt k
  ca="$(base64 -w0 <"${PKI_DIR}/ca.crt")"
  crt="$(base64 -w0 <"${PKI_DIR}/${cert}")"
  k="$(base64 -w0 <"${PKI_DIR}/${key}")"
  umask 077
  render "${TEMPLATES}/kubeconfig.yaml" >"${file}"
  umask 022
}

# shellcheck disable=SC2034 # RUNC_BIN is read by render
write_containerd_config() {
  local RUNC_BIN
  RUNC_BIN="$(command -v runc)"
  render "${TEMPLATES}/containerd-config.toml" >"${CONTAINERD_DIR}/config.toml"
}

write_configs() {
  mkdir -p "${WORK_DIR}" "${LOG_DIR}" "${RUN_DIR}" "${CONF_DIR}" "${KUBECONFIG_DIR}" \
    "${KUBELET_ROOT_DIR}" "${CONTAINERD_DIR}" "${CNI_DIR}/net.d" "${CNI_DIR}/networks"
  "${HACK_DIR}/cluster/pki.sh" "${PKI_DIR}" "${NODE_NAME}" "${SERVICE_IP}"

  write_kubeconfig "${ADMIN_KUBECONFIG}" kubernetes-admin admin.crt admin.key
  write_kubeconfig "${KUBECONFIG_DIR}/kubelet.kubeconfig" "system:node:${NODE_NAME}" kubelet-client.crt kubelet-client.key
  write_kubeconfig "${KUBECONFIG_DIR}/controller-manager.kubeconfig" system:kube-controller-manager controller-manager.crt controller-manager.key
  write_kubeconfig "${KUBECONFIG_DIR}/scheduler.kubeconfig" system:kube-scheduler scheduler.crt scheduler.key

  write_containerd_config
  render "${TEMPLATES}/cni-bridge.conflist" >"${CNI_DIR}/net.d/10-gpu-share.conflist"
  render "${TEMPLATES}/kubelet.yaml" >"${CONF_DIR}/kubelet.yaml"
}

# The apiserver reaches the kubelet through the node's "Hostname" address,
# i.e. the node name; the kubelet serves on 127.0.0.1 only, so the node name
# must resolve to 127.0.0.1.  A tagged /etc/hosts line is added (and removed by
# `down`) unless the name already resolves.
ensure_hosts_entry() {
  if getent hosts "${NODE_NAME}" | grep -q '^127\.0\.0\.1 '; then
    return 0
  fi
  if grep -q "${HOSTS_MARK}" /etc/hosts 2>/dev/null; then
    return 0
  fi
  log "adding '127.0.0.1 ${NODE_NAME}' to /etc/hosts (removed by down)"
  echo "127.0.0.1 ${NODE_NAME} ${HOSTS_MARK}" >>/etc/hosts
}

remove_hosts_entry() {
  if grep -q "${HOSTS_MARK}" /etc/hosts 2>/dev/null; then
    local tmp; tmp="$(grep -v "${HOSTS_MARK}" /etc/hosts)"
    # Rewrite in place (keeps the inode; /etc/hosts may be a bind mount).
    printf '%s\n' "${tmp}" >/etc/hosts
  fi
}

# ---------------------------------------------------------------- components

start_etcd() {
  start etcd "${ETCD_BIN}/etcd" \
    --name=gpu-share-local \
    --data-dir="${WORK_DIR}/etcd" \
    --listen-client-urls="http://127.0.0.1:${ETCD_CLIENT_PORT}" \
    --advertise-client-urls="http://127.0.0.1:${ETCD_CLIENT_PORT}" \
    --listen-peer-urls="http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-advertise-peer-urls="http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-cluster="gpu-share-local=http://127.0.0.1:${ETCD_PEER_PORT}" \
    --listen-metrics-urls="" \
    --quota-backend-bytes=2147483648 \
    --log-level=warn
  wait_for "etcd health" etcd "${ETCD_BIN}/etcdctl" --endpoints="http://127.0.0.1:${ETCD_CLIENT_PORT}" endpoint health
}

start_apiserver() {
  start kube-apiserver "${K8S_BIN}/kube-apiserver" \
    --bind-address=127.0.0.1 \
    --secure-port="${API_PORT}" \
    --advertise-address=127.0.0.1 \
    --endpoint-reconciler-type=none \
    --etcd-servers="http://127.0.0.1:${ETCD_CLIENT_PORT}" \
    --service-cluster-ip-range="${SERVICE_CIDR}" \
    --tls-cert-file="${PKI_DIR}/apiserver.crt" \
    --tls-private-key-file="${PKI_DIR}/apiserver.key" \
    --client-ca-file="${PKI_DIR}/ca.crt" \
    --kubelet-client-certificate="${PKI_DIR}/apiserver-kubelet-client.crt" \
    --kubelet-client-key="${PKI_DIR}/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="${PKI_DIR}/ca.crt" \
    --kubelet-preferred-address-types=Hostname,InternalIP \
    --service-account-issuer="https://kubernetes.default.svc.cluster.local" \
    --service-account-key-file="${PKI_DIR}/sa.pub" \
    --service-account-signing-key-file="${PKI_DIR}/sa.key" \
    --api-audiences="https://kubernetes.default.svc.cluster.local" \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --feature-gates="${FEATURE_GATES}" \
    --allow-privileged=true \
    --profiling=false \
    --v=1
  wait_for "kube-apiserver /readyz" kube-apiserver kubectl_admin get --raw /readyz
}

# start_component NAME KUBECONFIG PORT FLAG... : kube-controller-manager or kube-scheduler
# with its own KUBECONFIG for the API and for delegated authentication/authorization,
# serving on 127.0.0.1:PORT, no leader election; FLAG... are its own.
start_component() {
  local name="$1" kc="$2" port="$3"
  shift 3
  start "${name}" "${K8S_BIN}/${name}" \
    --kubeconfig="${kc}" \
    --authentication-kubeconfig="${kc}" \
    --authorization-kubeconfig="${kc}" \
    --bind-address=127.0.0.1 \
    --secure-port="${port}" \
    --leader-elect=false \
    "$@" \
    --feature-gates="${FEATURE_GATES}" \
    --v=1
}

start_controller_manager() {
  local qps=()
  if [[ -n "${KCM_API_QPS}" ]]; then
    [[ "${KCM_API_QPS}" =~ ^[1-9][0-9]*$ ]] || die "GPU_SHARE_KCM_API_QPS must be a positive integer"
    qps=(--kube-api-qps="${KCM_API_QPS}" --kube-api-burst="$((2 * KCM_API_QPS))")
  fi
  start_component kube-controller-manager "${KUBECONFIG_DIR}/controller-manager.kubeconfig" 10257 \
    "${qps[@]}" \
    --use-service-account-credentials=true \
    --service-account-private-key-file="${PKI_DIR}/sa.key" \
    --root-ca-file="${PKI_DIR}/ca.crt" \
    --cluster-signing-cert-file="${PKI_DIR}/ca.crt" \
    --cluster-signing-key-file="${PKI_DIR}/ca.key" \
    --service-cluster-ip-range="${SERVICE_CIDR}" \
    --allocate-node-cidrs=false
}

start_scheduler() {
  start_component kube-scheduler "${KUBECONFIG_DIR}/scheduler.kubeconfig" 10259
}

ctr_k8s() { "${CTR}" --address "${CONTAINERD_SOCK}" --namespace k8s.io "$@"; }

# The shim is looked up in PATH first (then next to containerd): our bin dir goes first so
# the built containerd never runs Debian's 1.6 shim.
start_containerd() {
  start containerd env "PATH=${CONTAINERD_BIN_DIR}:${PATH}" \
    "${CONTAINERD_BIN_DIR}/containerd" --config "${CONTAINERD_DIR}/config.toml"
  wait_for "containerd socket" containerd "${CTR}" --address "${CONTAINERD_SOCK}" version
  log "containerd: $("${CTR}" --address "${CONTAINERD_SOCK}" version 2>/dev/null |
    awk '/^Server:/ {s=1} s && $1 == "Version:" {print $2; exit}') (${CONTAINERD_FLAVOUR})"
}

import_images() {
  local tar
  for tar in "$@"; do
    [[ -f "$tar" ]] || die "no such image tar: $tar"
    log "importing $(basename "$tar") into containerd (namespace k8s.io)"
    ctr_k8s images import "$tar" >/dev/null
  done
}

start_kubelet() {
  local p ours
  ours="$(pid_of kubelet || true)"
  for p in $(pgrep -x kubelet || true); do
    [[ "$p" == "$ours" ]] && continue
    die "another kubelet (pid $p) is running; it would share ${DEVICE_PLUGIN_DIR} with ours"
  done
  start kubelet "${K8S_BIN}/kubelet" \
    --config="${CONF_DIR}/kubelet.yaml" \
    --kubeconfig="${KUBECONFIG_DIR}/kubelet.kubeconfig" \
    --root-dir="${KUBELET_ROOT_DIR}" \
    --cert-dir="${PKI_DIR}/kubelet" \
    --hostname-override="${NODE_NAME}" \
    --feature-gates="${FEATURE_GATES}" \
    --v=2
}

node_ready() {
  [[ "$(kubectl_admin get node "${NODE_NAME}" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

default_sa_exists() { kubectl_admin -n default get serviceaccount default; }

all_running() {
  local c
  for c in "${COMPONENTS[@]}"; do is_running "$c" || return 1; done
}

cmd_up() {
  need_root
  local t0=$SECONDS
  if all_running && node_ready; then
    log "cluster already up (node ${NODE_NAME} Ready); nothing to do"
    return 0
  fi
  ensure_packages
  build_all
  write_configs
  ensure_hosts_entry
  echo "${CONTAINERD_FLAVOUR}" >"${RUN_DIR}/containerd.flavour"
  start_etcd
  start_apiserver
  start_controller_manager
  start_scheduler
  start_containerd
  import_images "${PAUSE_TAR}" "${BUSYBOX_TAR}"
  start_kubelet
  wait_for "node ${NODE_NAME} Ready" kubelet node_ready
  wait_for "default service account" kube-controller-manager default_sa_exists
  log "cluster up in $((SECONDS - t0)) s. Use: eval \"\$(${BASH_SOURCE[0]} env)\"; kubectl get nodes"
}

# ---------------------------------------------------------------- teardown

# Pids of the containerd shims that belong to our containerd.
our_shims() {
  local p
  for p in $(pgrep -f 'containerd-shim' 2>/dev/null || true); do
    if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "${CONTAINERD_SOCK}"; then
      echo "$p"
    fi
  done
}

children_of() { pgrep -P "$1" 2>/dev/null || true; }

cleanup_containers() {
  local shims=() shim child ns inodes=() f
  mapfile -t shims < <(our_shims)
  # Remember the network namespaces of our pods before their processes die.
  for shim in "${shims[@]}"; do
    for child in $(children_of "$shim"); do
      ns="$(stat -L -c %i "/proc/${child}/ns/net" 2>/dev/null || true)"
      [[ -n "$ns" ]] && inodes+=("$ns")
    done
  done
  if ((${#shims[@]})); then
    log "killing ${#shims[@]} containerd shim(s) and their containers"
    for shim in "${shims[@]}"; do
      for child in $(children_of "$shim"); do kill -KILL "$child" 2>/dev/null || true; done
    done
    sleep 1
    for shim in "${shims[@]}"; do kill -KILL "$shim" 2>/dev/null || true; done
  fi
  if [[ -d /run/netns ]] && ((${#inodes[@]})); then
    for f in /run/netns/*; do
      [[ -e "$f" ]] || continue
      ns="$(stat -c %i "$f" 2>/dev/null || true)"
      if printf '%s\n' "${inodes[@]}" | grep -qx -- "$ns"; then
        umount "$f" 2>/dev/null || umount -l "$f" 2>/dev/null || true
        rm -f "$f"
      fi
    done
  fi
}

unmount_work_dir() { unmount_below "${WORK_DIR}"; }

# unmount_below DIR : every mount point below DIR, deepest first.
unmount_below() {
  local mounts m
  # Deepest first; mountinfo field 5 is the mount point (octal-escaped).
  mounts="$(awk -v d="$1/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r)"
  for m in ${mounts}; do
    m="$(printf '%b' "${m//\\/\\0}")"
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
}

# The kubelet always links container logs into /var/log/containers; drop the
# links that point into our pod log dir.
remove_log_links() {
  local l
  for l in /var/log/containers/*.log; do
    [[ -L "$l" ]] || continue
    case "$(readlink "$l")" in "${WORK_DIR}/pod-logs/"*) rm -f "$l" ;; esac
  done
}

remove_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -d "${h}kubepods" ]] || continue
    find "${h}kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

cmd_down() {
  need_root
  stop kubelet
  stop kube-scheduler
  stop kube-controller-manager
  cleanup_containers
  stop containerd
  stop kube-apiserver
  stop etcd
  unmount_work_dir
  ip link del "${BRIDGE}" 2>/dev/null || true
  remove_cgroups
  remove_log_links
  remove_hosts_entry
  rm -f "${DEVICE_PLUGIN_DIR}/kubelet.sock" "${DEVICE_PLUGIN_DIR}/kubelet_internal_checkpoint"
  rmdir "${DEVICE_PLUGIN_DIR}" /var/lib/kubelet 2>/dev/null || true
  if [[ -d "${WORK_DIR}" ]]; then
    log "removing ${WORK_DIR}"
    rm -rf "${WORK_DIR}" 2>/dev/null || { unmount_work_dir; rm -rf "${WORK_DIR}"; }
  fi
  log "cluster down"
}

cmd_status() {
  local c rc=0 pid
  for c in "${COMPONENTS[@]}"; do
    if pid="$(pid_of "$c")"; then
      printf '%-24s running (pid %s)  log %s\n' "$c" "$pid" "${LOG_DIR}/${c}.log"
    else
      printf '%-24s not running\n' "$c"
      rc=1
    fi
  done
  if is_running kube-apiserver && [[ -f "${ADMIN_KUBECONFIG}" ]]; then
    kubectl_admin get nodes -o wide 2>&1 || rc=1
    node_ready || rc=1
  fi
  return "$rc"
}

# The environment of the cluster, one "NAME=value" per line (PATH excluded).
env_pairs() {
  cat <<EOF
GPU_SHARE_CLUSTER_DIR=${WORK_DIR}
KUBECONFIG=${ADMIN_KUBECONFIG}
K8S_BIN_DIR=${K8S_BIN}
KUBECTL=${KUBECTL}
NODE_NAME=${NODE_NAME}
KUBELET_ROOT_DIR=${KUBELET_ROOT_DIR}
DEVICE_PLUGIN_DIR=${DEVICE_PLUGIN_DIR}
POD_RESOURCES_SOCKET=${KUBELET_ROOT_DIR}/pod-resources/kubelet.sock
CONTAINER_RUNTIME_ENDPOINT=unix://${CONTAINERD_SOCK}
CONTAINERD_ADDRESS=${CONTAINERD_SOCK}
CONTAINERD_BIN_DIR=${CONTAINERD_BIN_DIR}
CONTAINERD_FLAVOUR=${CONTAINERD_FLAVOUR}
KUBELET_METRICS_URL=https://127.0.0.1:${KUBELET_PORT}/metrics
CLUSTER_CA_CERT=${PKI_DIR}/ca.crt
CLUSTER_ADMIN_CERT=${PKI_DIR}/admin.crt
CLUSTER_ADMIN_KEY=${PKI_DIR}/admin.key
CLUSTER_APISERVER_HOST=127.0.0.1
CLUSTER_APISERVER_PORT=${API_PORT}
SAMPLE_DEVICE_PLUGIN=${K8S_BIN}/sample-device-plugin
CLUSTER_LOG_DIR=${LOG_DIR}
BUSYBOX_IMAGE=${BUSYBOX_IMAGE}
PAUSE_IMAGE=${PAUSE_IMAGE}
EOF
}

# Why this machine cannot run the cluster; prints nothing when it can. The one
# definition: tests read it through `env --json`.
environment_problem() {
  if [[ "$(uname -s)" != Linux ]]; then
    echo "not Linux"
  elif [[ "$(id -u)" != 0 ]]; then
    echo "not root (the local cluster starts containerd and the kubelet)"
  elif [[ ! -d /sys/fs/cgroup/memory && -f /sys/fs/cgroup/cgroup.controllers ]]; then
    # The kubelet config (cgroupfs driver, cgroupRoot /) and `down`'s cleanup of
    # /sys/fs/cgroup/*/kubepods are written and tested for the v1 hierarchy only.
    echo "cgroup v2 only host: this cluster (kubelet on containerd 1.7, cgroupfs) is set up for cgroup v1"
  elif [[ ! -d /sys/fs/cgroup/memory ]]; then
    echo "no cgroup v1 memory controller under /sys/fs/cgroup"
  elif ! command -v go >/dev/null; then
    echo "no Go toolchain (needed to build Kubernetes and etcd)"
  elif [[ "${CONTAINERD_FLAVOUR}" == system ]] && ! command -v containerd >/dev/null &&
    ! command -v apt-get >/dev/null; then
    echo "containerd is not installed and apt-get is not available to install it"
  fi
}

json_string() {
  local s="$1"
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  printf '"%s"' "${s}"
}

cmd_env() {
  local name value sep="" problem
  if [[ "${1:-}" != --json ]]; then
    while IFS='=' read -r name value; do
      echo "export ${name}=\"${value}\""
      [[ "${name}" == KUBECTL ]] && echo "export PATH=\"${K8S_BIN}:\${PATH}\""
    done < <(env_pairs)
    return 0
  fi
  problem="$(environment_problem)"
  printf '{"env": {'
  while IFS='=' read -r name value; do
    printf '%s%s: %s' "${sep}" "$(json_string "${name}")" "$(json_string "${value}")"
    sep=", "
  done < <(env_pairs)
  if [[ -z "${problem}" ]]; then
    printf '}, "check": {"ok": true, "reason": null}}\n'
  else
    printf '}, "check": {"ok": false, "reason": %s}}\n' "$(json_string "${problem}")"
  fi
}

# Stops the kubelet and starts it again (as a node reboot of the kubelet would), waiting
# for the node to be Ready again: device plugins must re-register with the new kubelet.
cmd_restart_kubelet() {
  need_root
  is_running containerd || die "the local cluster is not up (run: $0 up)"
  stop kubelet
  start_kubelet
  wait_for "node ${NODE_NAME} Ready" kubelet node_ready
}

kcm_healthy() { curl -ksf https://127.0.0.1:10257/healthz >/dev/null; }

# The same flags, with GPU_SHARE_KCM_API_QPS as set now (bench.scale raises it for a run
# and restarts it again without afterwards).
cmd_restart_controller_manager() {
  need_root
  is_running kube-apiserver || die "the local cluster is not up (run: $0 up)"
  stop kube-controller-manager
  start_controller_manager
  wait_for "kube-controller-manager /healthz" kube-controller-manager kcm_healthy
}

# Halves of a restart, for the failure stories: the caller does something in between
# (kills the agent: a node reboot; or admits pods while the API server is gone).
cmd_stop_kubelet() {
  need_root
  is_running containerd || die "the local cluster is not up (run: $0 up)"
  stop kubelet
}

cmd_start_kubelet() {
  need_root
  is_running containerd || die "the local cluster is not up (run: $0 up)"
  start_kubelet
  wait_for "node ${NODE_NAME} Ready" kubelet node_ready
}

# Everything else keeps running: the kubelet, controllers and the agent see connection
# refused until start-apiserver (same flags, same etcd, so no state is lost).
cmd_stop_apiserver() {
  need_root
  is_running etcd || die "the local cluster is not up (run: $0 up)"
  stop kube-apiserver
}

cmd_start_apiserver() {
  need_root
  is_running etcd || die "the local cluster is not up (run: $0 up)"
  start_apiserver
}

# Switches the node's runtime (GPU_SHARE_CONTAINERD) under a running control plane: pods
# keep their API objects and the new kubelet recreates their containers. containerd's
# root (images, snapshots; 1.6 and 1.7 share its metadata schema) is kept, its state
# (tasks of the killed containers) starts empty.
cmd_restart_containerd() {
  need_root
  is_running containerd || die "the local cluster is not up (run: $0 up)"
  stop kubelet
  cleanup_containers
  stop containerd
  unmount_below "${CONTAINERD_DIR}"
  rm -rf "${CONTAINERD_DIR}/state" "${CONTAINERD_DIR}/runc"
  ensure_packages
  "${HACK_DIR}/cluster/build.sh" containerd
  build_images
  write_containerd_config
  echo "${CONTAINERD_FLAVOUR}" >"${RUN_DIR}/containerd.flavour"
  start_containerd
  import_images "${PAUSE_TAR}" "${BUSYBOX_TAR}"
  start_kubelet
  wait_for "node ${NODE_NAME} Ready" kubelet node_ready
}

cmd_import_image() {
  need_root
  (($#)) || die "usage: $0 import-image TAR..."
  is_running containerd || die "containerd of the local cluster is not running (run: $0 up)"
  import_images "$@"
}

main() {
case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) shift; cmd_env "$@" ;;
  import-image) shift; cmd_import_image "$@" ;;
  restart-kubelet) cmd_restart_kubelet ;;
  restart-controller-manager) cmd_restart_controller_manager ;;
  restart-containerd) cmd_restart_containerd ;;
  stop-kubelet) cmd_stop_kubelet ;;
  start-kubelet) cmd_start_kubelet ;;
  stop-apiserver) cmd_stop_apiserver ;;
  start-apiserver) cmd_start_apiserver ;;
  build) ensure_packages; build_all; log "images: ${PAUSE_TAR} ${BUSYBOX_TAR}" ;;
  logs) shift; exec tail -n 100 -f "${LOG_DIR}/${1:?component}.log" ;;
  *)
    sed -n '2,42p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
}

# Allow `source hack/local-up-cluster.sh` (for debugging) without running main.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
