#!/usr/bin/env bash
# Regenerate src/gpu_share/{plugin,dra}/proto/*_pb2*.py from proto/ (needs grpcio-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m gpu_share.plugin.protogen "$@"
