# shellcheck shell=bash
# hack/lib/gotool.sh - build a Go tool into the cache, once (sourced after common.sh).
#
# go_tool_build NAME DIR PACKAGE@VERSION CGO LDFLAGS TIMEOUT_S
#   `go install PACKAGE@VERSION` (the module's own go.mod and go.sum: every machine gets
#   the same dependency set) into DIR/bin/NAME, with CGO_ENABLED=CGO and -ldflags=LDFLAGS,
#   bounded by TIMEOUT_S. A DIR stamped by an earlier build is reused as is (no network);
#   builds of one DIR take turns under DIR/.lock (parallel test runs share the cache), and
#   the binary must answer --version before DIR/bin and DIR/.stamp are written.

go_tool_built() {  # NAME DIR
  [[ -f "$2/.stamp" && -x "$2/bin/$1" ]]
}

go_tool_build() {
  local name="$1" dir="$2" pkg="$3" cgo="$4" ld="$5" limit="$6" start
  if go_tool_built "${name}" "${dir}"; then
    return 0
  fi
  command -v go >/dev/null || die "go not found in PATH (needed to build ${name})"
  if [[ "${cgo}" == 1 ]] && ! command -v gcc >/dev/null; then
    die "gcc not found (${name} needs cgo: apt-get install gcc)"
  fi
  mkdir -p "${dir}"
  exec 8>"${dir}/.lock"
  if ! flock -n 8; then
    log "waiting for another build of ${name} (${pkg})"
    flock 8
  fi
  if go_tool_built "${name}" "${dir}"; then
    return 0  # the other build finished it
  fi
  rm -rf "${dir}/bin.tmp"
  mkdir -p "${dir}/bin.tmp"
  start=$SECONDS
  CGO_ENABLED="${cgo}" GOFLAGS="${GOFLAGS:-} -buildvcs=false" GOBIN="${dir}/bin.tmp" \
    run_with_progress "building ${name} (${pkg})" "${dir}/build.log" \
    timeout "${limit}" go install -trimpath -ldflags="${ld}" "${pkg}"
  "${dir}/bin.tmp/${name}" --version >/dev/null || die "the built ${name} does not run"
  rm -rf "${dir:?}/bin"
  mv "${dir}/bin.tmp" "${dir}/bin"
  echo "built $(date -u +%FT%TZ) in $((SECONDS - start))s" >"${dir}/.stamp"
  log "${name} in ${dir}/bin ($(cat "${dir}/.stamp"))"
}
