#!/usr/bin/env bash
# Runs the demo: simulator, watcher and sink on loopback, live progress,
# then a byte-for-byte verification. Extra arguments go to `tailflight demo`
# (see `tailflight demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/env.sh
tailflight_install_build_deps
cargo run --quiet -- demo "$@"
