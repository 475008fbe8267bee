# shellcheck shell=bash
# Sourced by hack scripts: a project virtualenv with gpu-share and its test deps, and the
# lint tool for the shell scripts (Debian's shellcheck package, installed when missing).
ensure_venv() {
  local venv="${GPU_SHARE_VENV:-.venv}"
  if [ ! -x "$venv/bin/python" ]; then
    echo "== creating $venv"
    python3 -m venv "$venv"
  fi
  # shellcheck disable=SC1091
  . "$venv/bin/activate"
  local stamp="$venv/.gpu-share-deps"
  local want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "== installing gpu-share and test dependencies into $venv"
    python -m pip install -q --upgrade pip
    python -m pip install -q -e '.[test]'
    echo "$want" > "$stamp"
  fi
}

ensure_shellcheck() {
  command -v shellcheck >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing shellcheck (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null 2>&1 ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null; }
  fi
  command -v shellcheck >/dev/null || { echo "shellcheck is missing (apt-get install shellcheck)" >&2; return 1; }
}

# Lints every shell script of the repository with shellcheck (run from its root; -x follows
# the `source`d hack/lib files).
shell_lint() {
  ensure_shellcheck || return 1
  shellcheck -x hack/*.sh hack/lib/*.sh hack/cluster/*.sh bench/*.sh bench/agent/*.sh \
    tests/standin/*.sh
}
