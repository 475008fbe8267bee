#!/usr/bin/env bash
# tests/standin/build.sh OUTDIR INCLUDE_DIR
# Builds the stand-in NVIDIA driver (libcuda.so.1, libnvidia-ml.so.1) and gpu-workload
# into OUTDIR. INCLUDE_DIR holds CUDA's cuda.h and NVML's nvml.h.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 OUTDIR INCLUDE_DIR" >&2
  exit 2
fi
out="$1"
inc="$2"
src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for h in cuda.h nvml.h; do
  [[ -f "${inc}/${h}" ]] || { echo "$0: ${inc}/${h} not found" >&2; exit 1; }
done
mkdir -p "${out}"

tmp="$(mktemp -d "${out}/.build.XXXXXX")"  # same file system: the renames below are atomic
trap 'rm -rf "${tmp}"' EXIT

# Export only the API (cu*, nvml*); -Bsymbolic keeps the libraries' calls to their own
# functions from being interposed by a preloaded library.
echo '{ global: cu*; local: *; };' >"${tmp}/cuda.map"
echo '{ global: nvml*; local: *; };' >"${tmp}/nvml.map"
cflags=(-O2 -g -Wall -Wextra -std=gnu11 -I"${inc}")
lib=(-shared -fPIC "-Wl,-Bsymbolic" "-Wl,--no-undefined" -pthread)

gcc "${cflags[@]}" "${lib[@]}" -Wl,-soname,libcuda.so.1 \
  -Wl,--version-script="${tmp}/cuda.map" -o "${tmp}/libcuda.so.1" \
  "${src}/cuda.c" "${src}/cuda_mem.c" "${src}/cuda_exec.c" "${src}/devices.c" "${src}/state.c"
gcc "${cflags[@]}" "${lib[@]}" -Wl,-soname,libnvidia-ml.so.1 \
  -Wl,--version-script="${tmp}/nvml.map" -o "${tmp}/libnvidia-ml.so.1" \
  "${src}/nvml.c" "${src}/devices.c" "${src}/state.c"
gcc "${cflags[@]}" -o "${tmp}/gpu-workload" "${src}/workload.c" -ldl

# Replace each artifact whole: a running process may have the old one mapped.
for f in libcuda.so.1 libnvidia-ml.so.1 gpu-workload; do
  mv -f "${tmp}/${f}" "${out}/${f}"
done
