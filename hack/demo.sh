#!/usr/bin/env bash
# The demo (README "Demo"): a real local Kubernetes, the gpu-share image built without
# Docker, the Helm chart installed with the dummy backend (4 fake 16 GiB devices), and a
# few pods asking for device slices. Prints which container got which slice, as the agent
# recorded it (`gpu-share slices`, run in the agent pod) and as the container saw it.
#
#   hack/demo.sh            run the demo (first run builds Kubernetes and the image:
#                           see docs/local-cluster.md and docs/e2e.md)
#   GPU_SHARE_DEMO_MODE=dra hack/demo.sh
#                           the same pool as a DRA driver: it publishes a ResourceSlice
#                           and the pods hold ResourceClaims (from templates) instead
#                           of extended resources
#   hack/demo.sh clean      delete the demo pods and uninstall the chart (cluster stays up)
#
# The local cluster is shared: every use of it holds /tmp/gpu-share-cluster.lock
# (GPU_SHARE_CLUSTER_LOCK); the demo leaves no agent running when it releases it, so the
# chart is uninstalled at the end unless GPU_SHARE_DEMO_KEEP=1 (then `hack/demo.sh clean`).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/venv.sh
LOG_PREFIX=demo
. hack/lib/common.sh

NS=gpu-share-demo
AGENT_NS=gpu-share
RELEASE=gpu-share
VALUES=(-f values-examples/dummy-npu.yaml -f values-examples/local-cluster.yaml)
MODE="${GPU_SHARE_DEMO_MODE:-device-plugin}"
case "${MODE}" in
  device-plugin) ;;
  dra) VALUES+=(--set agentConfig.dra.enabled=true) ;;
  *) die "GPU_SHARE_DEMO_MODE must be device-plugin or dra, not ${MODE}" ;;
esac

step() { echo; echo "== $*"; }

ensure_venv
HELM=$(bash hack/install-tools.sh | sed -n 's/^helm3=//p')
[[ -x "$HELM" ]] || die "helm 3 not found (hack/install-tools.sh)"

uninstall() {
  if "$HELM" status "$RELEASE" -n "$AGENT_NS" >/dev/null 2>&1; then
    "$HELM" uninstall "$RELEASE" -n "$AGENT_NS" --wait --timeout 120s >/dev/null
  fi
  kubectl -n "$AGENT_NS" wait --for=delete pod -l app.kubernetes.io/component=agent \
    --timeout=120s >/dev/null 2>&1 || true
}

if [[ "${1:-}" != clean ]]; then
  # Build before taking the lock: it does not need the cluster.
  step "building the gpu-share image (hack/build-image.sh: buildah, no Docker; cached)"
  TAR=$(bash hack/build-image.sh --no-import | tail -n 1)
fi

take_cluster_lock

step "local cluster (hack/local-up-cluster.sh up; the first run builds Kubernetes)"
bash hack/local-up-cluster.sh up
eval "$(bash hack/local-up-cluster.sh env)"

if [[ "${1:-}" == clean ]]; then
  kubectl delete namespace "$NS" --ignore-not-found --timeout=120s || true
  uninstall
  exit 0
fi

bash hack/build-image.sh --import-tar "$TAR" >/dev/null

step "helm install $RELEASE charts/gpu-share ${VALUES[*]}"
kubectl get namespace "$AGENT_NS" >/dev/null 2>&1 || kubectl create namespace "$AGENT_NS" >/dev/null
kubectl label namespace "$AGENT_NS" --overwrite pod-security.kubernetes.io/enforce=privileged >/dev/null
"$HELM" upgrade --install "$RELEASE" charts/gpu-share -n "$AGENT_NS" "${VALUES[@]}" \
  --wait --timeout 180s >/dev/null
if [[ "${GPU_SHARE_DEMO_KEEP:-0}" != 1 ]]; then
  trap 'echo; echo "== helm uninstall (GPU_SHARE_DEMO_KEEP=1 keeps the agent)"; kubectl delete namespace "$NS" --ignore-not-found --timeout=120s >/dev/null || true; uninstall' EXIT
fi
AGENT=$(kubectl -n "$AGENT_NS" get pods -l app.kubernetes.io/component=agent \
  -o jsonpath='{.items[0].metadata.name}')
echo "agent pod $AGENT_NS/$AGENT (ServiceAccount $(kubectl -n "$AGENT_NS" get pod "$AGENT" \
  -o jsonpath='{.spec.serviceAccountName}'), image $(kubectl -n "$AGENT_NS" get pod "$AGENT" \
  -o jsonpath='{.spec.containers[0].image}'))"

node_memory() { kubectl get node "$NODE_NAME" -o jsonpath='{.status.allocatable.vendor\.com/vcuda-memory}'; }
node_slice() {
  kubectl get resourceslices -o jsonpath="{range .items[?(@.spec.nodeName=='$NODE_NAME')]}{.spec.driver} {.spec.devices[*].name}{'\n'}{end}"
}
registered() {
  local m
  if [[ "${MODE}" == dra ]]; then [[ -n "$(node_slice)" ]]; return; fi
  m=$(node_memory); [[ -n "$m" && "$m" != 0 ]]
}
wait_until 60 registered || true
if [[ "${MODE}" == dra ]]; then
  echo "ResourceSlice of $NODE_NAME (driver, devices): $(node_slice)"
else
  echo "node $NODE_NAME allocatable: vendor.com/vcuda-memory=$(node_memory) vendor.com/vcuda-core=$(
    kubectl get node "$NODE_NAME" -o jsonpath='{.status.allocatable.vendor\.com/vcuda-core}')"
fi
registered || { echo "agent did not register:"; kubectl -n "$AGENT_NS" logs "$AGENT" | tail -20; exit 1; }

kubectl delete namespace "$NS" --ignore-not-found --wait=true >/dev/null
kubectl create namespace "$NS" >/dev/null
# What each container prints: what it was handed (env and device nodes).
# shellcheck disable=SC2016 # expanded by the container's shell
SEEN='echo "seen: DUMMY_VISIBLE_DEVICES=$DUMMY_VISIBLE_DEVICES memory=${GPU_SHARE_MEMORY_LIMIT_MIB:-unlimited}MiB cores=${GPU_SHARE_CORE_PERCENT:-shared}% /dev: $(cd /dev && echo dummy-npu[0-9]*)"; sleep 3600'
container() {  # the demo container; $1: its resources (YAML flow mapping)
  cat <<EOF
  containers:
    - name: main
      image: $BUSYBOX_IMAGE
      imagePullPolicy: Never
      command: [sh, -c, $(printf '%s' "$SEEN" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')]
      resources: $1
EOF
}
pod_head() {  # name
  printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: %s}\n' "$1" "$NS"
  printf 'spec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n'
}
pod() {  # name memory cores: extended resources (device-plugin mode)
  local limits="vendor.com/vcuda-memory: $2"
  [[ "$3" != 0 ]] && limits="$limits, vendor.com/vcuda-core: $3"
  pod_head "$1"
  container "{limits: {$limits}}"
  echo ---
}
claim_pod() {  # name memory cores: a ResourceClaim from a template of that shape (DRA)
  local caps="memory: $(( $2 * 1024 ))Mi"
  [[ "$3" != 0 ]] && caps="$caps, cores: \"$3\""
  cat <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: $1, namespace: $NS}
spec:
  spec:
    devices:
      requests:
        - name: slice
          exactly:
            deviceClassName: gpu-share.vendor.com
            count: 1
            capacity: {requests: {$caps}}
---
EOF
  pod_head "$1"
  echo "  resourceClaims: [{name: slice, resourceClaimTemplateName: $1}]"
  container "{claims: [{name: slice}]}"
  echo ---
}
if [[ "${MODE}" == dra ]]; then
  step "creating pods, each with a ResourceClaim (device class gpu-share.vendor.com; capacity memory, cores)"
  make_pod=claim_pod
else
  step "creating pods (vendor.com/vcuda-memory: 4, some with vendor.com/vcuda-core)"
  make_pod=pod
fi
{ $make_pod train-a 4 30; $make_pod train-b 4 30; $make_pod infer-c 4 0; $make_pod infer-d 4 50
  $make_pod infer-e 4 0; } | kubectl apply -f -
kubectl -n "$NS" wait --for=condition=Ready pod --all --timeout=120s

if [[ "${MODE}" == dra ]]; then
  step "claims and the device each was allocated (kubectl get resourceclaims)"
  kubectl -n "$NS" get resourceclaims \
    -o jsonpath='{range .items[*]}{.metadata.name}{"  "}{.status.allocation.devices.results[*].device}{"\n"}{end}'
fi
if [[ "${MODE}" != dra ]]; then
  step "slices recorded by the agent (kubectl exec $AGENT -- gpu-share slices --node $NODE_NAME)"
  slices() { kubectl -n "$AGENT_NS" exec "$AGENT" -c agent -- gpu-share slices --node "$NODE_NAME"; }
  all_recorded() { [[ $(slices | grep -c "^$NS/") -ge 5 ]]; }
  wait_until 10 all_recorded || true
  slices
fi
step "what each container saw (its own environment)"
for p in $(kubectl -n "$NS" get pods -o jsonpath='{.items[*].metadata.name}'); do
  printf '%-10s %s\n' "$p" "$(kubectl -n "$NS" logs "$p" | head -1)"
done
echo
if [[ "${GPU_SHARE_DEMO_KEEP:-0}" == 1 ]]; then
  echo "Clean up: hack/demo.sh clean   (cluster: hack/local-up-cluster.sh down)"
fi
