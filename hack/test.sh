#!/usr/bin/env bash
# The project's test command (README "Test"): static checks, then every test level that
# this machine can run. Installs what it needs; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

. hack/lib/venv.sh
ensure_venv

echo "== static checks"
ruff check src tests hack bench
mypy src/gpu_share/sharing src/gpu_share/config src/gpu_share/errors.py
lint-imports

echo "== tools (helm 3.17 and 4.1)"
bash hack/install-tools.sh

echo "== tests"
python -m pytest "$@"
