#!/usr/bin/env bash
# The project's test command (README "Test"): static checks, then every test level that
# this machine can run. Installs what it needs; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

. hack/lib/venv.sh
ensure_venv

# start_scheduler_136_build : `hack/cluster/build.sh k8s-136` in its own process group,
# unless cached; a build still running when this script ends is stopped with it.
start_scheduler_136_build() {
  local dir
  dir="$(bash hack/cluster/build.sh k8s-136-dir)"
  [ -f "${dir}/.stamp" ] && return 0
  mkdir -p "${dir}"
  echo "== kube-scheduler v1.36 (DRA scale tests): building in the background, ${dir}/background.log"
  setsid bash hack/cluster/build.sh k8s-136 >"${dir}/background.log" 2>&1 &
  SCHEDULER_136_BUILD=$!
  trap 'kill -- "-${SCHEDULER_136_BUILD}" 2>/dev/null || true' EXIT
}

echo "== static checks"
ruff check src tests hack bench testkit
mypy src/gpu_share
lint-imports
shell_lint
python hack/module-size.py

echo "== tools (helm 3.17 and 4.1)"
bash hack/install-tools.sh
echo "== promtool (metrics lint, alert rule tests; cached)"
bash hack/build-promtool.sh || echo "promtool not built: its tests skip (fail where GPU_SHARE_REQUIRE_CLUSTER=1)"
bash hack/build-kwok.sh || echo "kwok not built: tests/scale skips (fails where GPU_SHARE_REQUIRE_CLUSTER=1)"

if [ "$(id -u)" = 0 ]; then
  # Build (or reuse from the cache) what the cluster tests need before pytest runs, so a
  # cold build (minutes on 2 cores) is not charged to a test fixture's timeout.
  echo "== local cluster binaries and images (cached under ${GPU_SHARE_CACHE:-$HOME/.cache/gpu-share})"
  bash hack/local-up-cluster.sh build
  # kube-scheduler v1.36, which the DRA scale tests run (tests/scale/kwok.py waits for it
  # under the build's lock): built beside the checks and tests before them (7 min here).
  start_scheduler_136_build
  # Where this machine can run the cluster, its tests must run, not skip.
  if bash hack/local-up-cluster.sh env --json \
      | python -c 'import json, sys; sys.exit(0 if json.load(sys.stdin)["check"]["ok"] else 1)'; then
    export GPU_SHARE_REQUIRE_CLUSTER=1
  fi
fi

# After the cluster build, whose package check installs gcc where it is missing.
echo "== HAMi-core (pinned source) and the stand-in driver (cached)"
bash hack/build-enforcement.sh
# cgo (gcc, as above): NVIDIA's createRuntime hook that the driver-enforced memory limit
# tests run against the stand-in driver.
echo "== nvidia-cdi-hook (NVIDIA container toolkit; cached)"
bash hack/build-cdi-hook.sh \
  || echo "nvidia-cdi-hook not built: its enforcement tests skip (fail where GPU_SHARE_REQUIRE_CLUSTER=1)"

echo "== tests"
python -m pytest "$@"
