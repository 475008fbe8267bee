#!/usr/bin/env bash
# The agent benchmark: prints the gpu-share vs Go sample-plugin table.
#
#   bench/run-agent-bench.sh            micro-benchmark + cluster benchmark (3 rounds A B)
#   ROUNDS=1 PODS=10 ALLOCATIONS=100 bench/run-agent-bench.sh   a quicker pass
#   SKIP_MICRO=1 / SKIP_CLUSTER=1       run one half only
#
# The cluster half holds /tmp/gpu-share-cluster.lock (shared with the other users of
# the one local cluster) only while it measures; it needs root and a built cluster
# (hack/local-up-cluster.sh up). Results also go to $OUT_DIR (default /tmp/gsb-results).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/venv.sh
LOG_PREFIX=agent-bench
. hack/lib/common.sh
ensure_venv
OUT_DIR=${OUT_DIR:-/tmp/gsb-results}
PEER=${PEER_BIN:-${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share}/bench/peer}
mkdir -p "$OUT_DIR"

echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB;" \
  "load averages: $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ -z "${SKIP_MICRO:-}" ]]; then
  echo "== micro-benchmark (no kubelet)"
  python -m bench.agent.micro --pods "${MICRO_PODS:-250}" --json "$OUT_DIR/micro.json" 2>/dev/null
fi

if [[ -z "${SKIP_CLUSTER:-}" ]]; then
  echo "== building the Go peer (sample device plugin, N devices)"
  bash bench/agent/build-peer.sh "$PEER"
  echo "== waiting for the cluster lock $CLUSTER_LOCK"
  take_cluster_lock
  bash hack/local-up-cluster.sh status >/dev/null || bash hack/local-up-cluster.sh up
  echo "== cluster benchmark (lock held; load averages: $(cut -d' ' -f1-3 /proc/loadavg))"
  python -m bench.agent.cluster --peer "$PEER" --rounds "${ROUNDS:-3}" --pods "${PODS:-50}" \
    --allocations "${ALLOCATIONS:-1000}" --json "$OUT_DIR/cluster.json"
  release_cluster_lock
  echo "== done; load averages: $(cut -d' ' -f1-3 /proc/loadavg)"
fi
