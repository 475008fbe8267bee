# shellcheck shell=bash
# hack/lib/common.sh - what the hack/ and bench/ scripts share: log/die, a background
# command with progress lines, a bounded wait, the local cluster's lock, what importing
# an image into it checks first, and template rendering. Source it after setting
# LOG_PREFIX (the tag of every log line).

# log MSG... : "[prefix HH:MM:SS] MSG" on stderr (stdout stays for a script's results).
log() { echo "[${LOG_PREFIX:-hack} $(date +%H:%M:%S)] $*" >&2; }

# die MSG... : the error on stderr, exit 1.
die() {
  echo "[${LOG_PREFIX:-hack}] ERROR: $*" >&2
  exit 1
}

# run_with_progress DESC LOGFILE CMD... : runs CMD with its output in LOGFILE, printing a
# line every PROGRESS_EVERY seconds (default 30) with the elapsed time and the log's last
# line; on failure prints the log's tail and returns 1.
run_with_progress() {
  local desc="$1" logf="$2"; shift 2
  local start=$SECONDS every="${PROGRESS_EVERY:-30}" pid
  log "${desc} (log: ${logf})"
  "$@" >"${logf}" 2>&1 &
  pid=$!
  while kill -0 "${pid}" 2>/dev/null; do
    for _ in $(seq 1 "${every}"); do kill -0 "${pid}" 2>/dev/null || break; sleep 1; done
    if kill -0 "${pid}" 2>/dev/null; then
      log "  ${desc}: $((SECONDS - start))s ... $(tail -n 1 "${logf}" | cut -c1-100)"
    fi
  done
  if ! wait "${pid}"; then
    log "FAILED: ${desc}; last lines of ${logf}:"
    tail -n 40 "${logf}" >&2
    return 1
  fi
  log "  ${desc}: done in $((SECONDS - start))s"
}

# wait_until TIMEOUT [--while GUARD... --] CMD... : runs CMD (output dropped) every
# second until it succeeds (0). Returns 1 after TIMEOUT seconds, or 2 as soon as the
# optional GUARD command fails (what was being waited for died).
wait_until() {
  local deadline=$((SECONDS + $1)) guard=()
  shift
  if [[ "${1:-}" == --while ]]; then
    shift
    while [[ $# -gt 0 && "$1" != -- ]]; do guard+=("$1"); shift; done
    shift
  fi
  until "$@" >/dev/null 2>&1; do
    if ((${#guard[@]})) && ! "${guard[@]}"; then return 2; fi
    if ((SECONDS > deadline)); then return 1; fi
    sleep 1
  done
}

# The one local cluster is shared by tests, the demo and the benchmarks: every user
# holds this lock (testkit/harness/lock.py takes the same file).
CLUSTER_LOCK="${GPU_SHARE_CLUSTER_LOCK:-/tmp/gpu-share-cluster.lock}"

# take_cluster_lock : holds CLUSTER_LOCK on fd 9 until release_cluster_lock or exit
# (waits, saying so, while someone else holds it).
take_cluster_lock() {
  exec 9>"${CLUSTER_LOCK}"
  if ! flock -n 9; then
    log "waiting for the local cluster (${CLUSTER_LOCK} is held by another user)"
    flock 9
  fi
}

release_cluster_lock() {
  flock -u 9 2>/dev/null || true
  exec 9>&-
}

# cluster_up_for_import : true when the local cluster runs (HACK_DIR: the caller's
# hack/); else says that nothing is imported and returns 1.
cluster_up_for_import() {
  bash "${HACK_DIR}/local-up-cluster.sh" status >/dev/null 2>&1 && return 0
  log "local cluster not up: not importing (run: hack/local-up-cluster.sh up)"
  return 1
}

# cluster_image_target IMAGE : the target digest under which the local cluster's
# containerd lists IMAGE (empty when it holds none); the cluster's env must be loaded.
cluster_image_target() {
  "${CONTAINERD_BIN_DIR}/ctr" --address "${CONTAINERD_ADDRESS}" -n k8s.io images ls "name==$1" 2>/dev/null |
    awk 'NR > 1 {print $3}' | head -1
}

# import_unless_held IMAGE TAR HELD : imports the image tar TAR into the local cluster's
# containerd as IMAGE (HACK_DIR: the caller's hack/), unless the cluster is not up or
# `HELD TAR TARGET` succeeds: TARGET is the digest under which containerd lists IMAGE now
# (empty when none), HELD says whether that is TAR's image (the cluster's env is loaded).
import_unless_held() {
  local image="$1" tar="$2" held="$3" have
  cluster_up_for_import || return 0
  eval "$(bash "${HACK_DIR}/local-up-cluster.sh" env)"
  have="$(cluster_image_target "${image}")"
  if "${held}" "${tar}" "${have}"; then
    log "containerd already holds ${image} (${have:0:19})"
    return 0
  fi
  log "importing ${image} into the cluster's containerd"
  bash "${HACK_DIR}/local-up-cluster.sh" import-image "${tar}"
}

# render TEMPLATE : prints TEMPLATE with every ${NAME} replaced by the value of the shell
# variable NAME (caller's locals included); an unset NAME is an error. Nothing else in
# the template is interpreted.
render() {
  local line out name re='^([^$]*)\$\{([A-Za-z_][A-Za-z0-9_]*)\}(.*)$'
  [[ -f "$1" ]] || die "no template $1"
  while IFS= read -r line || [[ -n "${line}" ]]; do
    out=""
    while [[ "${line}" =~ $re ]]; do
      name="${BASH_REMATCH[2]}"
      [[ -v "${name}" ]] || die "template $1: \${${name}} is not set"
      out+="${BASH_REMATCH[1]}${!name}"
      line="${BASH_REMATCH[3]}"
    done
    printf '%s\n' "${out}${line}"
  done <"$1"
}
