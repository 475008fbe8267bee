#!/usr/bin/env bash
# build.sh OUT_DIR: builds OUT_DIR/dra-allocator-v135 (k8s.io/dynamic-resource-allocation
# v0.35.4, offline, against hack/k8s/go.mod like bench/agent/build-peer.sh) and
# OUT_DIR/dra-allocator-v136 (v0.36.5, against bench/dra_allocator/v136/go.mod; may need the
# module proxy the first time). Module files are copied to scratch dirs; nothing in the
# repository is modified. A binary newer than its inputs is not rebuilt.
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mkdir -p "$out"

build() { # build NAME MODDIR GOPROXY
  local bin=$out/$1 moddir=$2 proxy=$3 work
  if [[ -x "$bin" && "$bin" -nt "$here/main.go" && "$bin" -nt "$moddir/go.mod" && "$bin" -nt "$moddir/go.sum" ]]; then
    return 0
  fi
  work=$(mktemp -d /tmp/gsb-dra-XXXXXX)
  cp "$moddir/go.mod" "$moddir/go.sum" "$work/"
  mkdir "$work/dra_allocator"
  cp "$here/main.go" "$work/dra_allocator/"
  if ! (cd "$work" && CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" GOPROXY=$proxy \
    go build -trimpath -ldflags="-s -w" -o "$bin.tmp" ./dra_allocator); then
    rm -rf "$work"
    return 1
  fi
  rm -rf "$work"
  mv "$bin.tmp" "$bin"
}

build dra-allocator-v135 "$repo/hack/k8s" off
build dra-allocator-v136 "$here/v136" "${GOPROXY:-$(go env GOPROXY)}"
