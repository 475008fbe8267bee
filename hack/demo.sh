#!/usr/bin/env bash
# The demo (README "Demo"): a real local Kubernetes, the gpu-share agent on the dummy
# backend registered with its kubelet, and a few pods asking for device slices. Prints
# which container got which slice, as the agent recorded it and as the container saw it.
#
#   hack/demo.sh            run the demo (first run builds Kubernetes: see docs/local-cluster.md)
#   hack/demo.sh clean      delete the demo pods and stop the agent (cluster stays up)
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/venv.sh

NS=gpu-share-demo
RUN_DIR=${GPU_SHARE_DEMO_DIR:-/var/lib/gpu-share-cluster/demo}

stop_agent() {
  if [[ -f "$RUN_DIR/agent.pid" ]]; then
    local pid
    pid=$(cat "$RUN_DIR/agent.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    rm -f "$RUN_DIR/agent.pid"
  fi
}

ensure_venv
bash hack/local-up-cluster.sh up
eval "$(bash hack/local-up-cluster.sh env)"

if [[ "${1:-}" == clean ]]; then
  kubectl delete namespace "$NS" --ignore-not-found --wait=false
  stop_agent
  exit 0
fi

echo "== starting gpu-share-plugin (dummy backend: 2 devices x 16 GiB) on node $NODE_NAME"
stop_agent
mkdir -p "$RUN_DIR"
GPU_SHARE_DUMMY__DEVICE_COUNT=2 GPU_SHARE_DUMMY__MEMORY_MIB=16384 \
GPU_SHARE_DUMMY__FAULT_FILE="$RUN_DIR/faults.json" \
  nohup gpu-share-plugin --backend dummy --node-name "$NODE_NAME" \
    --device-plugin-dir "$DEVICE_PLUGIN_DIR" --pod-resources-socket "$POD_RESOURCES_SOCKET" \
    --state-dir "$RUN_DIR/state" --metrics-port 19400 --log-format text \
    >"$RUN_DIR/agent.log" 2>&1 &
echo $! >"$RUN_DIR/agent.pid"

for _ in $(seq 1 60); do
  mem=$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.allocatable.vendor\.com/vcuda-memory}')
  [[ -n "$mem" && "$mem" != 0 ]] && break
  sleep 1
done
echo "node $NODE_NAME allocatable: vendor.com/vcuda-memory=$mem vendor.com/vcuda-core=$(
  kubectl get node "$NODE_NAME" -o jsonpath='{.status.allocatable.vendor\.com/vcuda-core}')"
[[ -n "$mem" && "$mem" != 0 ]] || { echo "agent did not register; log: $RUN_DIR/agent.log"; tail -20 "$RUN_DIR/agent.log"; exit 1; }

kubectl delete namespace "$NS" --ignore-not-found --wait=true >/dev/null
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
pod() {  # name memory cores
  local cores=""
  [[ "$3" != 0 ]] && cores="vendor.com/vcuda-core: $3"
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: $NS}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: $BUSYBOX_IMAGE
      imagePullPolicy: Never
      command: [sh, -c, 'echo "seen: DUMMY_VISIBLE_DEVICES=\$DUMMY_VISIBLE_DEVICES memory=\${GPU_SHARE_MEMORY_LIMIT_MIB:-unlimited}MiB cores=\${GPU_SHARE_CORE_PERCENT:-shared}%"; sleep 3600']
      resources:
        limits:
          vendor.com/vcuda-memory: $2
          $cores
---
EOF
}
echo "== creating pods"
{ pod train-a 4 30; pod train-b 4 30; pod infer-c 4 0; pod infer-d 4 50; pod infer-e 4 0; } \
  | kubectl apply -f -
kubectl -n "$NS" wait --for=condition=Ready pod --all --timeout=120s

echo
echo "== slices recorded by the agent (pod annotation gpu-share.vendor.com/assignment)"
for _ in $(seq 1 20); do
  out=$(gpu-share slices --node "$NODE_NAME" --kubeconfig "$KUBECONFIG")
  [[ $(grep -c "^$NS/" <<<"$out") -ge 5 ]] && break
  sleep 0.5
done
echo "$out"
echo
echo "== what each container saw (its own environment)"
for p in $(kubectl -n "$NS" get pods -o jsonpath='{.items[*].metadata.name}'); do
  printf '%-10s %s\n' "$p" "$(kubectl -n "$NS" logs "$p" | head -1)"
done
echo
echo "Clean up: hack/demo.sh clean   (cluster: hack/local-up-cluster.sh down)"
