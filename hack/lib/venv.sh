# Sourced by hack scripts: a project virtualenv with gpu-share and its test deps.
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
