#!/usr/bin/env bash
# hack/gpu-proof.sh - what gpu-share's device discovery, health and enforcement modes do on
# a real NVIDIA GPU, in one step that needs no network there.
#
#   hack/gpu-proof.sh prepare
#       Here (network, gcc): builds HAMi-core's libvgpu.so, gpu-workload and the stand-in
#       driver (hack/build-enforcement.sh, cached) and gathers them, with the Python wheels
#       the NVML probe needs (nvidia-ml-py, pydantic, ...), into .gpu-proof/ (ignored by
#       git; carry it to the GPU machine with the working tree).
#   hack/gpu-proof.sh run [--standin] [--out DIR]
#       On the GPU machine (root, python3 >= 3.11, nvidia-smi, no network needed):
#         1 discovery: nvidia-smi against our NVML backend (hack/nvml-probe.py)
#         2 health: the backend's health poll for a few seconds
#         3 HAMi-core on CUDA: the memory limit (and a control without it), the SM cap
#         4 MPS: a private control daemon, its pinned memory limit and thread percentage
#         5 driver facts for driver-enforced limits (driver major, cgroup v2, dmem)
#         6 the agent's own HAMi-core slices, applied as a runtime would (hack/gpu-delivery.py)
#         7 the driver's per-cgroup memory limit (R615+, cgroup v2): set through NVML on a
#           fresh child cgroup, a workload in it stopped at 4096 MiB; skipped otherwise
#       Writes report.md and results.jsonl (one JSON object per run and per verdict) into
#       DIR (default: $OUT if set, else .gpu-proof/out) and prints the report.
#       Without nvidia-smi, or with --standin, the same steps run against the stand-in
#       driver (tests/standin) and the report's first line says nothing was proven.
#   hack/gpu-proof.sh report RESULTS OUT_DIR
#       Judges a recorded results.jsonl again and writes OUT_DIR/report.md.
# Exit: 0 when every step ran, whatever it found (the report says PASS/FAIL per check);
#       1 when the proof could not run at all (not prepared, no python3, ...); 2 on usage.
# Env:  GPU_PROOF_DIR (default <repo>/.gpu-proof), GPU_PROOF_SPIN (kernel iterations on a
#       real GPU, default 4000), GPU_PROOF_LAUNCH_SECONDS (per throughput run; default 6
#       on a GPU, 3 on the stand-in), GPU_PROOF_PYTHONS (prepare: the Python versions to
#       fetch compiled wheels for, default "3.11 3.12 3.13 3.14"), GPU_PROOF_KEEP=1 keeps
#       the scratch dir, GPU_PROOF_BUDGET_S (default 270): cases that would start after
#       that many seconds are recorded as skipped, and none runs past it.
set -uo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "${HACK_DIR}/.." && pwd)"
LOG_PREFIX=gpu-proof
# shellcheck source=hack/lib/common.sh
. "${HACK_DIR}/lib/common.sh"

PROOF_DIR="${GPU_PROOF_DIR:-${ROOT}/.gpu-proof}"
MAX_PROOF_MIB=48  # the device machine takes 64 MiB of working tree in all
# The probe's Python packages when there is no .venv to read the versions from.
DEFAULT_PINS="nvidia-ml-py==13.615.71 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-extensions==4.16.0 typing-inspection==0.4.5 PyYAML==6.0.4 grpcio==1.85.3 protobuf==7.36.2 tenacity==9.2.1 pydantic-settings==2.16.3 python-dotenv==1.2.4 prometheus-client==0.26.0"
COMPILED_WHEELS="pydantic-core PyYAML grpcio"  # fetched once per Python version
# Made-up devices of the stand-in run.
STANDIN_DEVICES="GPU-5e1f0000-9a11-4c0d-8e00-000000000000=16384;GPU-5e1f0000-9a11-4c0d-8e00-000000000001=16384"

usage() {
  sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# ---------------------------------------------------------------------------- prepare

# The probe's packages as the repo's .venv has them (name==version, one per line).
pins() {
  local py="${ROOT}/.venv/bin/python"
  if [[ ! -x "${py}" ]]; then
    tr ' ' '\n' <<<"${DEFAULT_PINS}"
    return
  fi
  "${py}" - <<'PY'
import importlib.metadata as md
for name in ("nvidia-ml-py", "pydantic", "pydantic-core", "annotated-types",
             "typing-extensions", "typing-inspection", "PyYAML", "grpcio", "protobuf",
             "tenacity", "pydantic-settings", "python-dotenv", "prometheus-client"):
    print(f"{name}=={md.version(name)}")
PY
}

fetch_wheels() {
  local dir="$1" want py v tmp pin name pure=() compiled=()
  want="$(pins)" || die "cannot read the probe's package versions from ${ROOT}/.venv"
  want+=$'\n'"pythons=${GPU_PROOF_PYTHONS:-3.11 3.12 3.13 3.14}"
  if [[ -f "${dir}/PINS" ]] && [[ "$(cat "${dir}/PINS")" == "${want}" ]]; then
    log "wheels: up to date ($(find "${dir}" -name '*.whl' | wc -l) files)"
    return 0
  fi
  py=python3
  [[ -x "${ROOT}/.venv/bin/python" ]] && py="${ROOT}/.venv/bin/python"
  tmp="$(mktemp -d)"
  while read -r pin; do
    [[ "${pin}" == *==* ]] || continue
    name="${pin%%==*}"
    if [[ " ${COMPILED_WHEELS} " == *" ${name} "* ]]; then compiled+=("${pin}"); else pure+=("${pin}"); fi
  done <<<"${want}"
  log "wheels: downloading ${pure[*]}"
  timeout 300 "${py}" -m pip download -q --no-deps --only-binary=:all: -d "${tmp}" "${pure[@]}" \
    || die "pip download ${pure[*]} failed"
  for v in ${GPU_PROOF_PYTHONS:-3.11 3.12 3.13 3.14}; do
    log "wheels: downloading ${compiled[*]} for CPython ${v}"
    timeout 300 "${py}" -m pip download -q --no-deps --only-binary=:all: --implementation cp \
      --python-version "${v}" --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "${tmp}" "${compiled[@]}" || die "pip download ${compiled[*]} (CPython ${v}) failed"
  done
  rm -rf "${dir}"
  mkdir -p "${dir}"
  mv "${tmp}"/*.whl "${dir}/"
  rm -rf "${tmp}"
  printf '%s\n' "${want}" >"${dir}/PINS"
}

prepare() {
  local built hami standin hdir lic size
  [[ $# -eq 0 ]] || usage
  built="$(bash "${HACK_DIR}/build-enforcement.sh")" || die "hack/build-enforcement.sh failed"
  hami="$(sed -n 's/^hami_core=//p' <<<"${built}")"
  standin="$(sed -n 's/^standin=//p' <<<"${built}")"
  [[ -f "${hami}" && -x "${standin}/gpu-workload" ]] || die "build-enforcement printed no artifacts"
  hdir="$(dirname "${hami}")"
  mkdir -p "${PROOF_DIR}/hami-core" "${PROOF_DIR}/bin" "${PROOF_DIR}/standin"
  install -m 0755 "${hami}" "${PROOF_DIR}/hami-core/libvgpu.so"
  sha256sum "${hami}" | cut -d' ' -f1 >"${PROOF_DIR}/hami-core/libvgpu.so.sha256"
  if [[ -f "${hdir}/libvgpu.so.sha256" ]] &&
    [[ "$(cat "${hdir}/libvgpu.so.sha256")" != "$(cat "${PROOF_DIR}/hami-core/libvgpu.so.sha256")" ]]; then
    die "${hami} does not match its recorded checksum"
  fi
  lic="${hdir}/LICENSE"
  [[ -f "${lic}" ]] || lic="${ROOT}/../shared/vendor/hami-core/LICENSE"
  [[ -f "${lic}" ]] || die "HAMi-core's LICENSE not found"
  install -m 0644 "${lic}" "${PROOF_DIR}/hami-core/LICENSE"
  [[ -f "${hdir}/VERSION" ]] && install -m 0644 "${hdir}/VERSION" "${PROOF_DIR}/hami-core/VERSION"
  install -m 0755 "${standin}/gpu-workload" "${PROOF_DIR}/bin/gpu-workload"
  install -m 0755 "${standin}/libcuda.so.1" "${standin}/libnvidia-ml.so.1" "${PROOF_DIR}/standin/"
  fetch_wheels "${PROOF_DIR}/wheels"
  {
    echo "prepared $(date -u +%FT%TZ) on $(uname -m), glibc $(ldd --version 2>/dev/null | head -n 1 | awk '{print $NF}')"
    echo "repo commit $(git -C "${ROOT}" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "${ROOT}" diff --quiet HEAD -- tests/standin 2>/dev/null || echo ' (tests/standin modified)')"
    echo "hami-core source: $(cat "${hdir}/VERSION" 2>/dev/null || basename "${hdir}")"
    echo "needs glibc >= $( { objdump -T "${PROOF_DIR}/hami-core/libvgpu.so" "${PROOF_DIR}/bin/gpu-workload" 2>/dev/null || true; } \
      | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1 | sed 's/GLIBC_//')"
    (cd "${PROOF_DIR}" && find hami-core bin standin wheels -type f ! -name PINS | sort | xargs sha256sum)
  } >"${PROOF_DIR}/MANIFEST"
  size="$(du -sm --exclude=out "${PROOF_DIR}" | cut -f1)"
  ((size <= MAX_PROOF_MIB)) || die "${PROOF_DIR} is ${size} MiB, over ${MAX_PROOF_MIB} MiB"
  du -sh --exclude=out "${PROOF_DIR}"/* >&2
  log "prepared ${PROOF_DIR} (${size} MiB; carry it with the working tree, then: hack/gpu-proof.sh run)"
  echo "proof_dir=${PROOF_DIR}"
}

# ---------------------------------------------------------------------------- run

WORK=""
MPS_PIPE=""
RESULTS=""
CGROUP_MADE=""

cleanup() {
  if [[ -n "${MPS_PIPE}" ]]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY="${MPS_PIPE}" timeout -k 5 20 nvidia-cuda-mps-control \
      >/dev/null 2>&1 || true
    MPS_PIPE=""
  fi
  if [[ -n "${CGROUP_MADE}" ]]; then
    "${PY}" "${HELPER}" nvml-limits --op clear --cgroup "${CGROUP_MADE}" >/dev/null 2>&1 || true
    rmdir "${CGROUP_MADE}" 2>/dev/null || true
    CGROUP_MADE=""
  fi
  if [[ -n "${WORK}" && "${GPU_PROOF_KEEP:-0}" != 1 ]]; then
    rm -rf "${WORK}"
  elif [[ -n "${WORK}" ]]; then
    log "scratch kept: ${WORK}"
  fi
}

# A python3 new enough for gpu_share (3.11: enum.StrEnum).
find_python() {
  local p
  for p in python3 python3.14 python3.13 python3.12 python3.11; do
    command -v "${p}" >/dev/null 2>&1 || continue
    if "${p}" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "${p}"
      return 0
    fi
  done
  command -v python3 >/dev/null 2>&1 && { echo python3; return 0; }
  return 1
}

now() { date +%s.%N; }

# run_case STEP CASE KIND TIMEOUT [VAR=VALUE ...] -- CMD [ARG ...]
# Runs CMD with the assignments in its env under `timeout`, stdin closed, and appends one
# JSON record (rc, seconds, output parsed by KIND: workload|probe|json|text) to RESULTS.
# TIMEOUT shrinks to what is left of the run's budget; with under 5 s left the case is
# recorded as skipped.
run_case() {
  local step="$1" case="$2" kind="$3" limit="$4" rc=0 t0 t1 base left
  shift 4
  local envs=()
  while [[ $# -gt 0 && "$1" != -- ]]; do envs+=("$1"); shift; done
  shift
  left=$((DEADLINE - SECONDS))
  if ((left < 5)); then
    log "${step}/${case}: skipped, the run's budget (${BUDGET_S}s) is spent"
    note "${step}" "${case}" "skipped=not run: the run's time budget (${BUDGET_S} s) was spent"
    return 124
  fi
  ((limit <= left)) || limit="${left}"
  base="${WORK}/logs/${step}.${case}"
  log "${step}/${case}: $(basename "$1") (at most ${limit}s)"
  t0="$(now)"
  timeout -k 5 "${limit}" env "${envs[@]}" "$@" >"${base}.out" 2>"${base}.err" </dev/null || rc=$?
  t1="$(now)"
  "${PY}" "${HELPER}" record --step "${step}" --case "${case}" --kind "${kind}" --rc "${rc}" \
    --t0 "${t0}" --t1 "${t1}" --limit "${limit}" --stdout "${base}.out" --stderr "${base}.err" \
    -- "${envs[@]}" -- "$@" >>"${RESULTS}" || log "could not record ${step}/${case}"
  return "${rc}"
}

# note STEP CASE KEY=VALUE ... : a record of facts (no command).
note() {
  local step="$1" case="$2"
  shift 2
  "${PY}" "${HELPER}" note --step "${step}" --case "${case}" -- "$@" >>"${RESULTS}" \
    || log "could not record ${step}/${case}"
}

step_discovery() {
  if [[ "${MODE}" == real ]]; then
    run_case discovery nvidia-smi text 20 -- nvidia-smi \
      --query-gpu=index,uuid,name,memory.total,driver_version --format=csv,noheader,nounits
    run_case discovery nvidia-smi-header text 20 -- nvidia-smi
  else
    note discovery expected "devices=${STANDIN_DEVICES}"
  fi
  run_case discovery driver-versions json 20 PYTHONPATH="${WORK}/site" -- \
    "${PY}" -S "${HELPER}" versions
  # One probe run: its devices are step 1, its health poll step 2.
  run_case discovery probe probe 45 PYTHONPATH="${ROOT}/src:${WORK}/site" -- \
    "${PY}" -S "${ROOT}/hack/nvml-probe.py" --seconds "${HEALTH_SECONDS}"
}

hami_env() {  # CASE: the env of a HAMi-core process with a fresh cache in a fresh dir
  local d="${WORK}/hami/$1"
  mkdir -p "${d}"
  printf '%s\n' "LD_PRELOAD=${LIBVGPU}" "CUDA_DEVICE_MEMORY_SHARED_CACHE=${d}/vgpu.cache" \
    "CUDA_DEVICE_MEMORY_LIMIT_0=4096m"
}

step_hami() {
  local got want envs=() c
  got="$(sha256sum "${LIBVGPU}" | cut -d' ' -f1)"
  want="$(cat "${PROOF_DIR}/hami-core/libvgpu.so.sha256")"
  # HAMi-core's node-wide lock dir, as the agent mounts it (this HAMi-core never takes it).
  [[ -e /tmp/vgpulock ]] || mkdir -p /tmp/vgpulock 2>/dev/null || true
  note hami-memory library "path=${LIBVGPU}" "sha256=${got}" "sha256_expected=${want}"
  mapfile -t envs < <(hami_env limit-4096m)
  run_case hami-memory limit-4096m workload 60 "${envs[@]}" -- \
    "${WORKLOAD}" --chunk-mib 256 --target-mib 8192
  run_case hami-memory control-no-preload workload 60 -- \
    "${WORKLOAD}" --chunk-mib 256 --target-mib 8192
  local sm=("${WORKLOAD}" --chunk-mib 64 --target-mib 64 --launch-seconds "${LAUNCH_SECONDS}"
    --spin "${SPIN}") tl=$((${LAUNCH_SECONDS%.*} + 30))
  run_case hami-sm baseline workload "${tl}" -- "${sm[@]}"
  for c in 100 60 30; do
    mapfile -t envs < <(hami_env "sm-${c}")
    run_case hami-sm "sm-${c}" workload "${tl}" "${envs[@]}" CUDA_DEVICE_SM_LIMIT="${c}" -- "${sm[@]}"
  done
  run_case hami-sm baseline-after workload "${tl}" -- "${sm[@]}"
}

step_mps() {
  if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    note mps skipped "reason=MPS not tested: nvidia-cuda-mps-control not installed"
    return
  fi
  if [[ "${MODE}" != real ]]; then
    note mps skipped "reason=MPS not tested: the stand-in driver has no MPS"
    return
  fi
  local pipe="${WORK}/mps/pipe" logs="${WORK}/mps/log" menv
  mkdir -p "${pipe}" "${logs}"
  menv=(CUDA_MPS_PIPE_DIRECTORY="${pipe}" CUDA_MPS_LOG_DIRECTORY="${logs}")
  MPS_PIPE="${pipe}"  # from here on the EXIT trap sends quit
  if ! run_case mps daemon-start text 20 "${menv[@]}" -- nvidia-cuda-mps-control -d; then
    note mps daemon-log "control_log=$(tail -c 2000 "${logs}/control.log" 2>/dev/null)"
    return
  fi
  sleep 1
  run_case mps control workload 60 "${menv[@]}" -- \
    "${WORKLOAD}" --chunk-mib 256 --target-mib 8192 --hold-seconds 1
  run_case mps mem-4096M workload 60 "${menv[@]}" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M -- \
    "${WORKLOAD}" --chunk-mib 256 --target-mib 8192
  local sm=("${WORKLOAD}" --chunk-mib 64 --target-mib 64 --launch-seconds "${LAUNCH_SECONDS}"
    --spin "${SPIN}") tl=$((${LAUNCH_SECONDS%.*} + 30))
  run_case mps atp-default workload "${tl}" "${menv[@]}" -- "${sm[@]}"
  run_case mps atp-30 workload "${tl}" "${menv[@]}" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 -- "${sm[@]}"
  run_case mps server-list text 20 "${menv[@]}" -- \
    bash -c 'echo get_server_list | nvidia-cuda-mps-control'
  run_case mps quit text 20 "${menv[@]}" -- bash -c 'echo quit | nvidia-cuda-mps-control'
  MPS_PIPE=""
  sleep 1
  note mps logs "control_log=$(tail -c 3000 "${logs}/control.log" 2>/dev/null)" \
    "server_log=$(tail -c 3000 "${logs}/server.log" 2>/dev/null)"
}

step_driver() {
  local fs version=""
  fs="$(timeout 10 stat -fc %T /sys/fs/cgroup 2>&1)"
  if [[ "${MODE}" == real ]]; then
    version="$(timeout 30 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -n 1)"
  fi
  local dmem=absent cap=""
  if [[ -e /sys/fs/cgroup/dmem.capacity ]]; then
    dmem=present
    cap="$(timeout 10 head -c 2000 /sys/fs/cgroup/dmem.capacity 2>&1)"
  fi
  # The per-cgroup memory-limit calls (driver R615+): whether this libnvidia-ml exports them.
  local limits_api
  limits_api="$(timeout 20 python3 -c '
import ctypes
lib = ctypes.CDLL("libnvidia-ml.so.1")
print(" ".join(f"{n}={hasattr(lib, n)}" for n in
               ("nvmlDeviceSetMemoryLimits_v1", "nvmlDeviceGetMemoryLimits_v1")))' 2>&1 | tail -n 1)"
  note driver facts "driver_version=${version}" "cgroup_fs=${fs}" "dmem_capacity=${dmem}" \
    "dmem_capacity_text=${cap}" "kernel=$(uname -r)" "nvml_memory_limits=${limits_api}"
}

# The driver's own per-cgroup memory limit, where the driver and the node have it: set
# through NVML for a fresh child cgroup (as the toolkit's hook does for a container), a
# workload moved into it, a control beside it; the limit cleared and the cgroup removed.
step_driver_limits() {
  local fs cg
  fs="$(timeout 10 stat -fc %T /sys/fs/cgroup 2>&1)"
  if [[ "${fs}" != cgroup2fs ]]; then
    note driver-limits skipped "reason=not tested: /sys/fs/cgroup is ${fs}; the driver's per-cgroup limits need cgroup v2"
    return
  fi
  if ! timeout 20 "${PY}" "${HELPER}" nvml-limits --op has >/dev/null 2>&1; then
    note driver-limits skipped "reason=not tested: this libnvidia-ml.so.1 has no nvmlDeviceSetMemoryLimits_v1 (driver branch R615 or later)"
    return
  fi
  cg="/sys/fs/cgroup/gpu-proof-$$"
  if ! mkdir "${cg}" 2>/dev/null; then
    note driver-limits skipped "reason=not tested: could not create ${cg}"
    return
  fi
  CGROUP_MADE="${cg}"  # from here on the EXIT trap clears the limit and removes it
  run_case driver-limits set json 20 --     "${PY}" "${HELPER}" nvml-limits --op set --cgroup "${cg}" --mib 4096
  # shellcheck disable=SC2016 # the inner shell expands $$ and $0
  run_case driver-limits limit-4096 workload 60 --     sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "${cg}"     "${WORKLOAD}" --chunk-mib 256 --target-mib 8192
  run_case driver-limits control workload 60 -- "${WORKLOAD}" --chunk-mib 256 --target-mib 8192
  run_case driver-limits clear json 20 --     "${PY}" "${HELPER}" nvml-limits --op clear --cgroup "${cg}"
  rmdir "${cg}" 2>/dev/null || log "could not remove ${cg}"
  CGROUP_MADE=""
}

# The agent's own delivery (hack/gpu-delivery.py): its records go straight to RESULTS.
step_delivery() {
  local left=$((DEADLINE - SECONDS)) limit=150 rc=0 log="${WORK}/logs/delivery.err"
  if ((left < 30)); then
    note delivery run "skipped=not run: the run's time budget (${BUDGET_S} s) was spent"
    return 0
  fi
  ((limit <= left)) || limit="${left}"
  log "delivery: the agent's Allocate applied as a runtime would (at most ${limit}s)"
  timeout -k 5 "${limit}" env PYTHONPATH="${ROOT}/src:${ROOT}:${WORK}/site" \
    "${PY}" -S "${ROOT}/hack/gpu-delivery.py" --libvgpu "${LIBVGPU}" --workload "${WORKLOAD}" \
    --spin "${SPIN}" --launch-seconds "${LAUNCH_SECONDS}" >>"${RESULTS}" 2>"${log}" \
    </dev/null || rc=$?
  note delivery run "rc=${rc}" "stderr_tail=$(tail -c 1500 "${log}")"
}

run_proof() {
  local standin=0 out="${OUT:-}" w
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --standin) standin=1 ;;
      --out) [[ $# -ge 2 ]] || usage; out="$2"; shift ;;
      --out=*) out="${1#--out=}" ;;
      *) usage ;;
    esac
    shift
  done
  [[ -n "${out}" ]] || out="${PROOF_DIR}/out"
  PY="$(find_python)" || die "no python3 on this machine"
  LIBVGPU="${PROOF_DIR}/hami-core/libvgpu.so"
  WORKLOAD="${PROOF_DIR}/bin/gpu-workload"
  for w in "${LIBVGPU}" "${WORKLOAD}" "${PROOF_DIR}/standin/libcuda.so.1"; do
    [[ -f "${w}" ]] || die "${w} missing: run 'hack/gpu-proof.sh prepare' first (where it can build) and carry .gpu-proof"
  done
  compgen -G "${PROOF_DIR}/wheels/*.whl" >/dev/null || die "no wheels in ${PROOF_DIR}/wheels: run prepare"
  MODE=real
  AUTO=""
  if ((standin)); then
    MODE=standin
  elif ! command -v nvidia-smi >/dev/null 2>&1; then
    MODE=standin
    AUTO="nvidia-smi not found: running against the stand-in driver"
    log "${AUTO}"
  fi
  mkdir -p "${out}" || die "cannot create ${out}"
  out="$(cd "${out}" && pwd)"
  WORK="$(mktemp -d /tmp/gpu-proof.XXXXXX)" || die "mktemp failed"
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  mkdir -p "${WORK}/logs" "${WORK}/site"
  HELPER="${WORK}/proof.py"
  write_helper >"${HELPER}"
  RESULTS="${out}/results.jsonl"
  : >"${RESULTS}" || die "cannot write ${RESULTS}"
  rm -f "${out}/report.md"
  for w in "${PROOF_DIR}"/wheels/*.whl; do
    timeout 60 "${PY}" -m zipfile -e "${w}" "${WORK}/site" || die "cannot unpack ${w}"
  done

  unset LD_PRELOAD CUDA_VISIBLE_DEVICES CUDA_DEVICE_MEMORY_LIMIT_0 CUDA_DEVICE_SM_LIMIT \
    CUDA_DEVICE_MEMORY_SHARED_CACHE CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  if [[ "${MODE}" == standin ]]; then
    export LD_LIBRARY_PATH="${PROOF_DIR}/standin"
    export GPU_SHARE_STANDIN_DEVICES="${STANDIN_DEVICES}"
    export GPU_SHARE_STANDIN_STATE_DIR="${WORK}/standin-state"
    mkdir -p "${GPU_SHARE_STANDIN_STATE_DIR}"
    SPIN="${GPU_PROOF_SPIN:-4000}"
    LAUNCH_SECONDS="${GPU_PROOF_LAUNCH_SECONDS:-3}"
  else
    unset GPU_SHARE_STANDIN_DEVICES GPU_SHARE_STANDIN_CONFIG GPU_SHARE_STANDIN_STATE_DIR
    SPIN="${GPU_PROOF_SPIN:-4000}"
    LAUNCH_SECONDS="${GPU_PROOF_LAUNCH_SECONDS:-6}"
  fi
  HEALTH_SECONDS=5
  BUDGET_S="${GPU_PROOF_BUDGET_S:-270}"
  DEADLINE=$((SECONDS + BUDGET_S))
  note run setup "mode=${MODE}" "auto=${AUTO}" "python=$("${PY}" -V 2>&1)" "host=$(uname -n)" \
    "arch=$(uname -m)" "glibc=$(ldd --version 2>/dev/null | head -n 1 | awk '{print $NF}')" \
    "spin=${SPIN}" "launch_seconds=${LAUNCH_SECONDS}" "health_seconds=${HEALTH_SECONDS}" \
    "manifest=$(head -n 4 "${PROOF_DIR}/MANIFEST" 2>/dev/null)" "started=$(date -u +%FT%TZ)"

  step_discovery
  step_hami
  step_mps
  step_driver
  step_delivery
  step_driver_limits

  "${PY}" "${HELPER}" report --results "${RESULTS}" --report "${out}/report.md" \
    || die "could not write the report"
  cat "${out}/report.md"
  log "report: ${out}/report.md, raw records: ${RESULTS}"
}

# report_again RESULTS OUT_DIR: judge a recorded run's results.jsonl again (the judges as
# this script has them now) and write OUT_DIR/report.md.
report_again() {
  [[ $# -eq 2 && -f "$1" ]] || usage
  PY="$(find_python)" || die "no python3 on this machine"
  WORK="$(mktemp -d /tmp/gpu-proof.XXXXXX)" || die "mktemp failed"
  trap cleanup EXIT
  write_helper >"${WORK}/proof.py"
  mkdir -p "$2" || die "cannot create $2"
  "${PY}" "${WORK}/proof.py" report --results "$1" --report "$2/report.md" \
    || die "could not write the report"
  cat "$2/report.md"
}

# The run's Python side: records each run as JSON, reads driver versions, judges and
# writes the report. Standard library only (it runs before any wheel is trusted).
write_helper() {
  cat <<'PY'
"""gpu-proof helper: record | note | versions | report."""
from __future__ import annotations

import ctypes
import json
import sys
from datetime import datetime, timezone

OOM = "CUDA_ERROR_OUT_OF_MEMORY"
LIMIT_MIB = 4096
CONTROL_MIB = 8192
CHUNK_MIB = 256
SM_TOLERANCE = 0.15  # launches/s at a cap, as a share of the baseline, +- this
STANDIN_BANNER = "NOTHING PROVEN ON HARDWARE: stand-in driver"


def read(path, limit=200_000):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()[-limit:]
    except OSError:
        return ""


def json_docs(text):
    """Every JSON value in text, in order (pretty-printed or one per line)."""
    dec, i, out = json.JSONDecoder(), 0, []
    while i < len(text):
        j = text.find("{", i)
        if j < 0:
            break
        try:
            doc, end = dec.raw_decode(text, j)
        except ValueError:
            i = j + 1
            continue
        out.append(doc)
        i = end
    return out


class Args:
    """helper CMD [--key value ...] [-- ITEM ... [-- ITEM ...]]: options, then up to two
    groups (record: the env assignments, then the command; note: key=value facts)."""

    def __init__(self, argv):
        self.cmd, rest, self.opts = argv[0], argv[1:], {}
        i = 0
        while i + 1 < len(rest) and rest[i] != "--":
            self.opts[rest[i].lstrip("-").replace("-", "_")] = rest[i + 1]
            i += 2
        rest = rest[i + 1:] if i < len(rest) else []
        k = rest.index("--") if "--" in rest else len(rest)
        self.first, self.second = rest[:k], rest[k + 1:]

    def __getattr__(self, name):
        try:
            v = self.opts[name]
        except KeyError:
            raise AttributeError(name) from None
        if name in ("rc",):
            return int(v)
        if name in ("t0", "t1", "limit"):
            return float(v)
        return v


def cmd_record(a):
    envs, argv = a.first, a.second
    out, err = read(a.stdout), read(a.stderr)
    rec = {"step": a.step, "case": a.case, "rc": a.rc, "timed_out": a.rc in (124, 137),
           "seconds": round(a.t1 - a.t0, 3), "limit_s": a.limit,
           "env": dict(e.split("=", 1) for e in envs if "=" in e), "argv": argv}
    if a.kind == "workload":
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        try:
            rec["result"] = json.loads(lines[-1]) if lines else None
        except ValueError:
            rec["result"] = None
            rec["stdout_tail"] = out[-2000:]
    elif a.kind == "probe":
        docs = json_docs(out)
        rec["result"] = {
            "report": next((d for d in docs if "devices" in d), None),
            "events": [d for d in docs if "uuid" in d and "healthy" in d],
            "health": next((d["health"] for d in docs if "health" in d), None),
        }
    elif a.kind == "json":
        docs = json_docs(out)
        rec["result"] = docs[-1] if docs else None
    else:
        rec["text"] = out[-6000:]
    rec["stderr_tail"] = err[-1500:]
    print(json.dumps(rec))


def cmd_note(a):
    facts = dict(kv.split("=", 1) for kv in a.first if "=" in kv)
    print(json.dumps({"step": a.step, "case": a.case, "note": facts}))


def cmd_versions(_a):
    """The CUDA driver API version (cuDriverGetVersion) and NVML's driver versions."""
    got = {}
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        rc = cuda.cuDriverGetVersion(ctypes.byref(v))
        got["cuda_driver_version"] = v.value if rc == 0 else None
        got["cuda_driver_rc"] = rc
    except OSError as exc:
        got["cuda_error"] = str(exc)
    try:
        import pynvml  # from the carried nvidia-ml-py wheel

        pynvml.nvmlInit()
        try:
            d = pynvml.nvmlSystemGetDriverVersion()
            got["nvml_driver_version"] = d.decode() if isinstance(d, bytes) else d
            got["nvml_cuda_driver_version"] = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        got["nvml_error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(got))


class _SetLimits(ctypes.Structure):  # nvmlSetMemoryLimits_v1_t (NVML R615+)
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong),
                ("hardLimit", ctypes.c_ulonglong)]


def cmd_nvml_limits(a):
    """has: exit 0 when libnvidia-ml.so.1 exports the call. set/clear: the limits of GPU 0
    for the cgroup --cgroup (soft = hard = --mib MiB; clear: soft 0, hard the maximum)."""
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    if a.op == "has":
        sys.exit(0 if hasattr(lib, "nvmlDeviceSetMemoryLimits_v1") else 1)
    dev = ctypes.c_void_p()
    rc = lib.nvmlInit_v2()
    rc = rc or lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev))
    if a.op == "set":
        soft = hard = int(a.mib) << 20
    else:
        soft, hard = 0, 0xFFFFFFFFFFFFFFFF
    lim = _SetLimits(a.cgroup.encode(), soft, hard)
    rc = rc or lib.nvmlDeviceSetMemoryLimits_v1(dev, ctypes.byref(lim))
    print(json.dumps({"op": a.op, "cgroup": a.cgroup, "soft": soft, "hard": hard, "rc": rc}))
    sys.exit(0 if rc == 0 else 1)


# ------------------------------------------------------------------------ judging

def cuda_text(v):
    return f"{v // 1000}.{(v % 1000) // 10}" if isinstance(v, int) and v > 0 else "unknown"


class Report:
    def __init__(self, records):
        self.records = records
        self.rows = []  # (number, check, verdict, figures)
        self.sections = []
        self.verdicts = []

    def rec(self, step, case):
        for r in self.records:
            if r.get("step") == step and r.get("case") == case:
                return r
        return None

    def verdict(self, num, check, step, verdict, figures, **extra):
        self.rows.append((num, check, verdict, figures))
        self.verdicts.append({"verdict": verdict, "step": step, "check": check,
                              "figures": figures, **extra})

    def section(self, title, lines):
        self.sections.append((title, lines))


def ran(r):
    """Why a run gives no result, or None when it ran."""
    if r is None:
        return "did not run"
    if "note" in r:
        return r["note"].get("skipped", "did not run")
    if r.get("timed_out"):
        return f"timed out after {r.get('limit_s')} s"
    if "result" in r and r["result"] is None:
        return f"no output (rc {r.get('rc')}): {tail(r)}"
    return None


def tail(r, n=300):
    t = (r or {}).get("stderr_tail", "").strip().splitlines()
    return " / ".join(t[-4:])[-n:] if t else "no stderr"


def wl_line(r):
    w = (r or {}).get("result") or {}
    if w.get("init_error"):
        return f"init failed: {w['init_error']}"
    s = f"{w.get('allocated_mib')} MiB in {w.get('chunks')} chunks"
    s += f", then {w.get('refused_error')}" if w.get("refused") else ", none refused"
    s += f"; cuMemGetInfo total {w.get('meminfo_total_mib')} MiB"
    if w.get("launches"):
        s += f"; {w['launches']} launches, {w.get('launches_per_s')}/s"
    if w.get("launch_error"):
        s += f"; launch error {w['launch_error']}"
    return s


def discovery(rep, mode):
    probe = rep.rec("discovery", "probe")
    vers = (rep.rec("discovery", "driver-versions") or {}).get("result") or {}
    lines = []
    expected = []
    if mode == "real":
        smi = rep.rec("discovery", "nvidia-smi")
        if smi is None or smi.get("rc") != 0:
            why = ran(smi) or f"rc {smi.get('rc')}: {tail(smi)}"
            lines.append(f"nvidia-smi failed: {why}")
        else:
            for row in smi.get("text", "").strip().splitlines():
                f = [x.strip() for x in row.split(",")]
                if len(f) >= 5:
                    try:
                        mem = int(float(f[3]))
                    except ValueError:
                        mem = None
                    expected.append({"index": f[0], "uuid": f[1], "name": f[2],
                                     "memory_mib": mem, "driver": f[4]})
            lines.append("nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version:")
            lines += [f"    {row}" for row in smi.get("text", "").strip().splitlines()]
        source = "nvidia-smi"
    else:
        table = (rep.rec("discovery", "expected") or {}).get("note", {}).get("devices", "")
        for i, entry in enumerate(e for e in table.split(";") if e):
            uuid, mem = entry.split("=", 1)
            expected.append({"index": str(i), "uuid": uuid, "name": "(stand-in)",
                             "memory_mib": int(mem.split(":")[0]), "driver": "stand-in"})
        lines.append(f"stand-in devices configured (GPU_SHARE_STANDIN_DEVICES): {table}")
        source = "the stand-in's configuration"
    seen = []
    why = ran(probe)
    report = ((probe or {}).get("result") or {}).get("report")
    if why is None and probe.get("rc") != 0:
        why = f"probe exited {probe.get('rc')}: {tail(probe)}"
    if why is None and report is None:
        why = f"probe printed no device report: {tail(probe)}"
    if report:
        seen = report.get("devices", [])
        lines.append("our NVML backend (hack/nvml-probe.py):")
        for d in seen:
            lines.append(f"    index {d.get('index')}, {d.get('uuid')}, {d.get('model')}, "
                         f"{d.get('memory_mib')} MiB, minor {d.get('minor')}, "
                         f"bus {d.get('pci_bus_id') or '-'}, numa {d.get('numa_node')}")
        for n in report.get("notes", []):
            lines.append(f"    note: {n}")
    cuda = vers.get("cuda_driver_version")
    lines.append(f"CUDA driver API version (cuDriverGetVersion): {cuda_text(cuda)} ({cuda}); "
                 f"NVML driver version: {vers.get('nvml_driver_version', 'unknown')}, "
                 f"NVML CUDA version: {cuda_text(vers.get('nvml_cuda_driver_version'))}")
    for k in ("cuda_error", "nvml_error"):
        if vers.get(k):
            lines.append(f"{k}: {vers[k]}")
    exp = sorted((e["uuid"], e["memory_mib"]) for e in expected)
    got = sorted((d.get("uuid"), d.get("memory_mib")) for d in seen)
    if why:
        verdict, fig = "FAIL", f"the probe did not run: {why}"
    elif not expected:
        verdict, fig = "FAIL", f"{source} listed no GPU"
    elif exp == got:
        verdict = "PASS"
        fig = (f"{len(got)} GPU(s), same UUIDs and memory as {source}: "
               + ", ".join(f"{u} {m} MiB" for u, m in got))
    else:
        verdict = "FAIL"
        fig = f"{source}: {exp}; our NVML backend: {got}"
    fig += f"; CUDA driver {cuda_text(cuda)}"
    rep.verdict("1", "Discovery", "discovery", verdict, fig,
                expected=exp, seen=got, cuda_driver_version=cuda)
    rep.section("1. Discovery", lines)
    # 2. health, from the same probe run
    res = (probe or {}).get("result") or {}
    events, health = res.get("events", []), res.get("health")
    secs = (rep.rec("run", "setup") or {}).get("note", {}).get("health_seconds", "?")
    hl = [f"health poll for {secs} s (the probe's poll_health loop): {len(events)} event(s)"]
    hl += [f"    event: {json.dumps(e)}" for e in events]
    if health is not None:
        hl.append(f"health detail at the end: {json.dumps(health)}")
    hl.append("XID injection is not possible here: this shows only that a healthy, idle GPU "
              "raises no event and that the event registration runs against this driver "
              "(see the notes above for event types it could not register); the reaction "
              "to an XID is covered only by the unit tests against a fake NVML.")
    if why:
        hv, hf = "FAIL", f"the probe did not run: {why}"
    elif events:
        hv, hf = "FAIL", f"{len(events)} health event(s) on an idle GPU: {events[:3]}"
    else:
        hv, hf = "PASS", f"no health event in {secs} s (expected none; XIDs cannot be injected)"
    rep.verdict("2", "Health", "health", hv, hf, events=len(events))
    rep.section("2. Health", hl)


def context_mib(w, limit=LIMIT_MIB):
    """What the limited process had in use before its first chunk (its CUDA context): both
    HAMi-core and MPS count it against the limit, so cuMemGetInfo's free starts below it."""
    free = w.get("meminfo_free_mib_before")
    return None if free is None else max(0, limit - free)


def driver_context_mib(c):
    """The same without a limit, as the driver's own cuMemGetInfo tells it."""
    total, free = c.get("meminfo_total_mib"), c.get("meminfo_free_mib_before")
    return None if total is None or free is None else total - free


def limit_edge_problems(w, who, limit=LIMIT_MIB):
    """The limit holds at its edge: context + chunks fit within it and one chunk more did not."""
    got, ctx = w.get("allocated_mib") or 0, context_mib(w, limit)
    if not w.get("refused") or w.get("refused_error") != OOM:
        return [f"{who}: allocated {got} MiB and was not refused with {OOM}"]
    if ctx is None:
        return [f"{who}: no cuMemGetInfo reading before the first chunk"]
    if not got + ctx <= limit < got + ctx + CHUNK_MIB:
        return [f"{who}: refused at {got} MiB + {ctx} MiB context, not at the edge of the "
                f"{limit} MiB limit ({CHUNK_MIB} MiB chunks)"]
    return []


DELIVERY_RUNS = (  # case, what it is, the memory limit it must stop at (None: a control)
    ("a-memory", "4-unit slice (1 GiB units), 30 cores", 4096),
    ("a-tenant-override", "the same, the workload sets LD_PRELOAD= and a 16g limit", 4096),
    ("a-env-only", "the same env without the response's mounts (control)", None),
    ("b-memory", "a second pod's 2-unit slice on the same GPU", 2048),
)


def delivery_run_problems(r, limit):
    w = (r or {}).get("result") or {}
    if r is None or r.get("error") or not w:
        return [f"no result: {(r or {}).get('error') or 'did not run'}"[:300]]
    if limit is None:
        ok = w.get("allocated_mib") == CONTROL_MIB and not w.get("refused")
        return [] if ok else [f"control took {w.get('allocated_mib')} MiB, not {CONTROL_MIB}"]
    return limit_edge_problems(w, "", limit)


def delivery_slice_problems(rep):
    a = rep.rec("delivery", "slice-a") or {}
    env, mounts = a.get("env") or {}, a.get("mounts") or []
    problems = []
    if env.get("CUDA_DEVICE_MEMORY_LIMIT_0") != "4096m" or env.get("CUDA_DEVICE_SM_LIMIT") != "30":
        problems.append(f"slice a's env: {env}")
    if not any(m.split(" -> ")[1].startswith("/etc/ld.so.preload") for m in mounts if " -> " in m):
        problems.append("slice a has no /etc/ld.so.preload mount")
    return problems


def delivery_sm(rep):
    """The slice's 30-core cap against the same process without the mounts."""
    capped = rate(rep.rec("delivery", "a-speed"))
    base = rate(rep.rec("delivery", "a-speed-env-only"))
    if not capped or not base:
        return None, ["the SM-cap runs gave no launch rate"]
    share = capped / base
    bad = not 0.30 - SM_TOLERANCE <= share <= 0.30 + SM_TOLERANCE
    return share, [f"30-core slice ran at {share:.2f} of the uncapped rate"] if bad else []


def delivery(rep):
    run = (rep.rec("delivery", "run") or {}).get("note", {})
    agent, err = rep.rec("delivery", "agent"), rep.rec("delivery", "error")
    lines = [f"agent: {', '.join((agent or {}).get('devices', [])) or 'did not start'}; "
             f"resources {(agent or {}).get('resources')}"]
    problems = [] if agent else [f"the agent did not serve: {run.get('skipped') or run.get('stderr_tail', '')[-300:]}"]
    if err:
        problems.append(f"broke: {err.get('error')}")
        lines.append(f"traceback: `{err.get('traceback', '')[-600:]}`")
    for name in ("slice-a", "slice-b"):
        s = rep.rec("delivery", name) or {}
        lines.append(f"{name} Allocate env: `{json.dumps(s.get('env'))}`")
        lines += [f"  mount `{m}`" for m in s.get("mounts") or []]
    figs = []
    if agent:
        problems += delivery_slice_problems(rep)
    for case, what, limit in DELIVERY_RUNS:
        r = rep.rec("delivery", case)
        w = (r or {}).get("result") or {}
        got = delivery_run_problems(r, limit)
        problems += [f"{case}: {p.strip(': ')}" for p in got]
        ctx = context_mib(w, limit) if limit else None
        lines.append(f"{case} ({what}): {wl_line(r) if w else (r or {}).get('error', 'did not run')}"
                     + (f"; {ctx} MiB in use at start" if ctx is not None else ""))
        figs.append(f"{case} {w.get('allocated_mib')} MiB"
                    + (f" + {ctx} context" if ctx else ""))
    share, sm = delivery_sm(rep)
    problems += sm
    if share is not None:
        figs.append(f"30-core cap {share:.2f} of the uncapped rate")
        lines.append(f"a-speed: {wl_line(rep.rec('delivery', 'a-speed'))}; env-only: "
                     f"{wl_line(rep.rec('delivery', 'a-speed-env-only'))}")
    fig = "; ".join(figs)
    if problems:
        fig = "; ".join(problems) + " | " + fig
    rep.verdict("6", "Agent delivery (HAMi-core)", "delivery", "FAIL" if problems else "PASS",
                fig)
    rep.section("6. Agent delivery", lines)


def hami_memory(rep):
    lib = (rep.rec("hami-memory", "library") or {}).get("note", {})
    lim, ctl = rep.rec("hami-memory", "limit-4096m"), rep.rec("hami-memory", "control-no-preload")
    lines = [f"libvgpu.so sha256 {lib.get('sha256')} "
             f"({'matches' if lib.get('sha256') == lib.get('sha256_expected') else 'DOES NOT MATCH'}"
             " the prepared checksum)",
             "env: LD_PRELOAD=libvgpu.so CUDA_DEVICE_MEMORY_LIMIT_0=4096m "
             "CUDA_DEVICE_MEMORY_SHARED_CACHE=<fresh file in a fresh dir>; "
             "gpu-workload --chunk-mib 256 --target-mib 8192",
             f"with HAMi-core: {wl_line(lim) if ran(lim) is None else ran(lim)}",
             f"control without HAMi-core: {wl_line(ctl) if ran(ctl) is None else ran(ctl)}"]
    w = (lim or {}).get("result") or {}
    c = (ctl or {}).get("result") or {}
    problems = []
    if ran(lim):
        problems.append(f"HAMi-core run: {ran(lim)}")
    elif w.get("init_error"):
        problems.append(f"HAMi-core run: init failed {w['init_error']}: {tail(lim)}")
    else:
        problems += limit_edge_problems(w, "HAMi-core")
    if ran(ctl):
        problems.append(f"control run: {ran(ctl)}")
    elif c.get("allocated_mib") != CONTROL_MIB or c.get("init_error"):
        problems.append(f"control without HAMi-core: {wl_line(ctl)}")
    fig = (f"{w.get('allocated_mib')} MiB allocated under CUDA_DEVICE_MEMORY_LIMIT_0=4096m "
           f"+ {context_mib(w)} MiB in use at start (the context), next "
           f"256 MiB chunk {w.get('refused_error') if w.get('refused') else 'not refused'}; "
           f"cuMemGetInfo total {w.get('meminfo_total_mib')} MiB; control without HAMi-core "
           f"{c.get('allocated_mib')} MiB (cuMemGetInfo total {c.get('meminfo_total_mib')} MiB, "
           f"{driver_context_mib(c)} MiB in use at start)")
    verdict = "FAIL" if problems else "PASS"
    if problems:
        fig = "; ".join(problems) + " | " + fig
    rep.verdict("3a", "HAMi-core memory limit", "hami-memory", verdict, fig,
                allocated_mib=w.get("allocated_mib"), refused_error=w.get("refused_error"),
                control_allocated_mib=c.get("allocated_mib"))
    rep.section("3a. HAMi-core memory limit", lines)


def rate(r):
    w = (r or {}).get("result") or {}
    if ran(r) or w.get("init_error") or w.get("launch_error") or not w.get("launches"):
        return None
    return float(w.get("launches_per_s") or 0)


def throughput(rep, step, num, check, cases, base_cases, expect):
    """Launches/s of each case against the mean of the baseline runs."""
    bases = [rate(rep.rec(step, b)) for b in base_cases]
    bases = [b for b in bases if b]
    base = sum(bases) / len(bases) if bases else None
    lines = ["| run | env | launches | seconds | launches/s | share of baseline | expected |",
             "|---|---|---|---|---|---|---|"]
    problems, figs = [], []
    for case in base_cases + cases:
        r = rep.rec(step, case)
        w = (r or {}).get("result") or {}
        env = " ".join(f"{k}={v}" for k, v in (r or {}).get("env", {}).items()
                       if k.startswith(("CUDA_DEVICE_SM", "CUDA_MPS_ACTIVE"))) or "-"
        x = rate(r)
        share = f"{x / base:.2f}" if x is not None and base else "-"
        want = expect.get(case)
        lines.append(f"| {case} | {env} | {w.get('launches', '-')} | "
                     f"{w.get('launch_seconds', '-')} | {w.get('launches_per_s', '-')} | "
                     f"{share} | {want[2] if want else 'baseline'} |")
        if x is None:
            why = ran(r) or w.get("init_error") or w.get("launch_error") or "no launches"
            problems.append(f"{case}: {why}")
            if r and (r.get("stderr_tail") or "").strip():
                lines.append(f"|  | stderr: {tail(r, 200)} | | | | | |")
            continue
        if want and base:
            lo, hi, _ = want
            figs.append(f"{case} {x / base:.2f}")
            if not lo <= x / base <= hi:
                problems.append(f"{case} ran at {x / base:.2f} of the baseline")
    if base is None:
        problems.insert(0, "no baseline")
    fig = (f"baseline {base:.1f} launches/s; " if base else "") + ", ".join(figs)
    verdict = "FAIL" if problems else "PASS"
    if problems:
        fig = "; ".join(problems) + " | " + fig
    rep.verdict(num, check, step, verdict, fig, baseline_per_s=base)
    return lines


def hami_sm(rep):
    setup = (rep.rec("run", "setup") or {}).get("note", {})
    expect = {f"sm-{c}": (max(0.0, c / 100 - SM_TOLERANCE), c / 100 + SM_TOLERANCE, f"{c / 100:.2f}")
              for c in (30, 60)}
    expect["sm-100"] = (1 - SM_TOLERANCE, 10.0, ">= 0.85")
    lines = [f"gpu-workload --chunk-mib 64 --target-mib 64 --launch-seconds "
             f"{setup.get('launch_seconds')} --spin {setup.get('spin')} (16384 blocks of 256 "
             "threads, each spinning; every launch synchronized); HAMi-core runs with "
             "CUDA_DEVICE_MEMORY_LIMIT_0=4096m, CUDA_DEVICE_SM_LIMIT=<cap> and a fresh cache "
             "each; baseline = mean of the runs without HAMi-core before and after", ""]
    lines += throughput(rep, "hami-sm", "3b", "HAMi-core SM cap", ["sm-100", "sm-60", "sm-30"],
                        ["baseline", "baseline-after"], expect)
    rep.section("3b. HAMi-core SM cap (CUDA_DEVICE_SM_LIMIT)", lines)


def mps(rep):
    sk = rep.rec("mps", "skipped")
    if sk:
        rep.verdict("4", "MPS", "mps", "SKIP", sk["note"]["reason"])
        rep.section("4. MPS", [sk["note"]["reason"]])
        return
    start = rep.rec("mps", "daemon-start")
    lines = []
    if start is None or start.get("rc") != 0:
        log = (rep.rec("mps", "daemon-log") or {}).get("note", {}).get("control_log", "")
        why = ran(start) or f"rc {start.get('rc')}: {tail(start)}"
        rep.verdict("4", "MPS", "mps", "FAIL", f"nvidia-cuda-mps-control -d failed: {why}")
        rep.section("4. MPS", [f"control daemon did not start: {why}", f"control.log: {log}"])
        return
    ctl, mem = rep.rec("mps", "control"), rep.rec("mps", "mem-4096M")
    servers = (rep.rec("mps", "server-list") or {}).get("text", "").split()
    lines += [f"control daemon started with private CUDA_MPS_PIPE_DIRECTORY and "
              f"CUDA_MPS_LOG_DIRECTORY; servers listed after the clients: {servers or 'none'}",
              f"under MPS, no limit: {wl_line(ctl) if ran(ctl) is None else ran(ctl)}",
              f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M: "
              f"{wl_line(mem) if ran(mem) is None else ran(mem)}"]
    w, c = (mem or {}).get("result") or {}, (ctl or {}).get("result") or {}
    problems = []
    if not servers:
        problems.append("no MPS server was listed: the clients may not have used MPS")
    if ran(mem) or w.get("init_error"):
        problems.append(f"pinned-limit run: {ran(mem) or w.get('init_error')}")
    else:
        problems += limit_edge_problems(w, "MPS pinned limit")
    if ran(ctl) or c.get("allocated_mib") != CONTROL_MIB:
        problems.append(f"control under MPS: {ran(ctl) or wl_line(ctl)}")
    fig = (f"pinned limit 4096M: {w.get('allocated_mib')} MiB + {context_mib(w)} MiB in use "
           f"at start (the context), "
           f"{'then ' + str(w.get('refused_error')) if w.get('refused') else 'none refused'}; "
           f"control {c.get('allocated_mib')} MiB")
    rep.verdict("4a", "MPS pinned memory limit", "mps", "FAIL" if problems else "PASS",
                ("; ".join(problems) + " | " if problems else "") + fig,
                allocated_mib=w.get("allocated_mib"))
    lines.append("")
    lines += throughput(rep, "mps", "4b", "MPS active thread percentage", ["atp-30"],
                        ["atp-default"], {"atp-30": (0.15, 0.45, "0.30")})
    logs = (rep.rec("mps", "logs") or {}).get("note", {})
    quit_ = rep.rec("mps", "quit")
    lines.append("")
    lines.append(f"quit: rc {quit_.get('rc') if quit_ else 'not sent by the step (the exit trap sends it)'}")
    for k in ("control_log", "server_log"):
        if logs.get(k):
            lines.append(f"{k} (tail):")
            lines += [f"    {ln}" for ln in logs[k].strip().splitlines()[-12:]]
    rep.section("4. MPS", lines)


def driver(rep, mode):
    f = (rep.rec("driver", "facts") or {}).get("note", {})
    vers = (rep.rec("discovery", "driver-versions") or {}).get("result") or {}
    version = f.get("driver_version") or vers.get("nvml_driver_version") or "unknown"
    major = version.split(".")[0] if version[:1].isdigit() else "unknown"
    v2 = f.get("cgroup_fs") == "cgroup2fs"
    fig = (f"driver {version} (major {major}); /sys/fs/cgroup is {f.get('cgroup_fs')} "
           f"(cgroup v2: {'yes' if v2 else 'no'}); /sys/fs/cgroup/dmem.capacity "
           f"{f.get('dmem_capacity')}; kernel {f.get('kernel')}; libnvidia-ml.so.1 exports "
           f"{f.get('nvml_memory_limits') or 'unknown'}")
    if mode != "real":
        fig += " (stand-in: the driver facts are not a GPU driver's)"
    rep.verdict("5", "Driver-enforced limits (facts only)", "driver", "INFO", fig,
                driver_major=major, cgroup_v2=v2, dmem_capacity=f.get("dmem_capacity"))
    lines = [fig]
    if f.get("dmem_capacity_text"):
        lines.append(f"dmem.capacity: {f['dmem_capacity_text']}")
    rep.section("5. Driver-enforced limits", lines)


def driver_limits(rep):
    sk = rep.rec("driver-limits", "skipped")
    if sk:
        rep.verdict("7", "Driver-enforced memory limit", "driver-limits", "SKIP",
                    sk["note"]["reason"])
        rep.section("7. Driver-enforced memory limit", [sk["note"]["reason"]])
        return
    st, lim, ctl = (rep.rec("driver-limits", c) for c in ("set", "limit-4096", "control"))
    w, c = (lim or {}).get("result") or {}, (ctl or {}).get("result") or {}
    problems = []
    if ran(st) or st.get("rc") != 0:
        problems.append(f"nvmlDeviceSetMemoryLimits_v1: {ran(st) or st.get('result')}")
    if ran(lim) or w.get("init_error"):
        problems.append(f"limited run: {ran(lim) or w.get('init_error')}")
    elif w.get("meminfo_total_mib") == LIMIT_MIB:
        problems += limit_edge_problems(w, "driver limit")
    else:  # cuMemGetInfo does not show the partition: the context as the control saw it
        ctx = driver_context_mib(c) or 0
        got = w.get("allocated_mib") or 0
        if w.get("refused_error") != OOM or not got + ctx <= LIMIT_MIB < got + ctx + CHUNK_MIB:
            problems.append(f"driver limit: {got} MiB + {ctx} MiB context, "
                            f"{w.get('refused_error') or 'not refused'}")
    if ran(ctl) or c.get("allocated_mib") != CONTROL_MIB:
        problems.append(f"control: {ran(ctl) or wl_line(ctl)}")
    fig = (f"cgroup limit 4096 MiB: {wl_line(lim) if ran(lim) is None else ran(lim)}; "
           f"control {c.get('allocated_mib')} MiB")
    rep.verdict("7", "Driver-enforced memory limit", "driver-limits",
                "FAIL" if problems else "PASS",
                ("; ".join(problems) + " | " if problems else "") + fig,
                allocated_mib=w.get("allocated_mib"))
    clear = rep.rec("driver-limits", "clear")
    rep.section("7. Driver-enforced memory limit", [
        f"set: {(st or {}).get('result')}", f"limited: {wl_line(lim)}",
        f"control beside it: {wl_line(ctl)}", f"cleared: {(clear or {}).get('result')}"])


def cmd_report(a):
    with open(a.results, encoding="utf-8") as fh:
        records = [json.loads(ln) for ln in fh if ln.strip()]
    setup = next((r["note"] for r in records if r.get("step") == "run"), {})
    mode = setup.get("mode", "standin")
    rep = Report(records)
    for part in (lambda: discovery(rep, mode), lambda: hami_memory(rep), lambda: hami_sm(rep),
                 lambda: mps(rep), lambda: driver(rep, mode), lambda: delivery(rep),
                 lambda: driver_limits(rep)):
        try:
            part()
        except Exception as exc:  # noqa: BLE001 - a broken judge is a FAIL, not a crash
            rep.verdict("?", "report", "report", "FAIL", f"judging failed: {exc!r}")
    smi = [r for r in records if r.get("case") == "nvidia-smi" and r.get("rc") == 0]
    gpu = smi[0]["text"].strip().splitlines()[0].split(",")[2].strip() if smi and smi[0].get("text", "").strip() else None
    out = []
    if mode != "real":
        out.append(STANDIN_BANNER)
        out.append("")
        out.append("# gpu-share GPU proof (stand-in driver)")
        out.append("")
        out.append("Every step below ran against tests/standin (our libcuda.so.1 and "
                   "libnvidia-ml.so.1), not against NVIDIA's driver: it shows that the proof "
                   "runs and what it checks, nothing about a GPU."
                   + (f" ({setup['auto']}.)" if setup.get("auto") else ""))
    else:
        out.append(f"# gpu-share GPU proof on {gpu or 'an NVIDIA GPU'}")
    out.append("")
    out.append(f"Run {setup.get('started')} on {setup.get('host')} ({setup.get('arch')}, glibc "
               f"{setup.get('glibc')}, {setup.get('python')}); report written "
               f"{datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}.")
    if setup.get("manifest"):
        out.append("Prepared: " + "; ".join(setup["manifest"].splitlines()) + ".")
    out.append("")
    out.append("| # | check | result | figures |")
    out.append("|---|---|---|---|")
    for num, check, verdict, fig in rep.rows:
        out.append(f"| {num} | {check} | {verdict} | {' '.join(fig.replace('|', '/').split())} |")
    out.append("")
    out.append("Steps 3 and 4 set the limit env (and LD_PRELOAD) by hand on one process and "
               "start their own MPS daemon. Step 6 is the agent's own delivery of HAMi-core "
               "slices: the agent serving this machine's GPUs through its NVML backend, its "
               "Allocate responses applied to the workload as a container runtime would (the "
               "mounts, /etc/ld.so.preload among them, in a private mount namespace, then the "
               "env); the node's MPS daemon as the agent uses it is not reproduced.")
    for title, lines in rep.sections:
        out.append("")
        out.append(f"## {title}")
        out.append("")
        table = bool(lines) and lines[0].startswith("|")
        for ln in lines:
            out.append(ln if (table or ln.startswith("|") or not ln) else f"- {ln}" if not ln.startswith("    ") else f"  `{ln.strip()}`")
    out.append("")
    out.append("Raw records: results.jsonl (one JSON object per run, then one per verdict).")
    with open(a.report, "w", encoding="utf-8") as fh:
        fh.write("\n".join(out) + "\n")
    with open(a.results, "a", encoding="utf-8") as fh:
        for v in rep.verdicts:
            fh.write(json.dumps(v) + "\n")


def main(argv):
    a = Args(argv)
    {"record": cmd_record, "note": cmd_note, "versions": cmd_versions,
     "nvml-limits": cmd_nvml_limits, "report": cmd_report}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
PY
}

main() {
  case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    run) shift; run_proof "$@" ;;
    report) shift; report_again "$@" ;;
    -h | --help | "") usage ;;
    *) usage ;;
  esac
}

main "$@"
