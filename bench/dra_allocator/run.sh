#!/usr/bin/env bash
# run.sh [OUT_DIR] [-- FLAGS...]: builds both binaries (build.sh) into OUT_DIR (default
# ~/.cache/gpu-share/bench/dra-allocator), runs v0.35.4 then v0.36.5 under nice with FLAGS
# (e.g. -repeats 15 -cluster-nodes 1000), and prints one markdown table, rows per scenario.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${HOME}/.cache/gpu-share/bench/dra-allocator
if [[ $# -gt 0 && $1 != -- ]]; then out=$1; shift; fi
if [[ $# -gt 0 && $1 == -- ]]; then shift; fi
bash "$here/build.sh" "$out"
rows=$(mktemp /tmp/gsb-dra-rows-XXXXXX)
trap 'rm -f "$rows"' EXIT
nice -n 10 "$out/dra-allocator-v135" "$@" >>"$rows"
nice -n 10 "$out/dra-allocator-v136" "$@" >>"$rows"
echo "| scenario | library | allocated | Allocate median | allocateOne calls/Allocate | calls timed (nodes, est. row) |"
echo "|---|---|---|---|---|---|"
sort -t "$(printf '\t')" -k1,1n -k3,3 -s "$rows" |
  awk -F '\t' '{ printf "| %s | %s | %s | %s | %s | %s |\n", $2, $3, $4, $5, $6, $7 }'
