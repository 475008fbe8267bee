#!/usr/bin/env bash
# build-peer.sh OUT: builds bench/agent/peer (the Go baseline) into OUT, offline, against
# the same k8s.io/kubernetes module graph as the local cluster (hack/k8s/go.mod).
# The module files are copied to a scratch dir so hack/k8s is never modified.
set -euo pipefail
out=${1:?usage: build-peer.sh OUT}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
if [[ -x "$out" && "$out" -nt "$here/peer/main.go" && "$out" -nt "$repo/hack/k8s/go.mod" ]]; then
  exit 0
fi
work=$(mktemp -d /tmp/gsb-peer-XXXXXX)
trap 'rm -rf "$work"' EXIT
cp "$repo/hack/k8s/go.mod" "$repo/hack/k8s/go.sum" "$work/"
mkdir "$work/peer"
cp "$here/peer/main.go" "$work/peer/"
mkdir -p "$(dirname "$out")"
(cd "$work" && CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" GOPROXY=off \
  go build -trimpath -ldflags="-s -w" -o "$out.tmp" ./peer)
mv "$out.tmp" "$out"
