#!/usr/bin/env bash
# Fuzzes the sink's DoPut input path and the watcher's reading of a sink's
# answers: a million cases by default (`ops/fuzz/run.sh --cases 10000` for
# a quick look; `--seed N --case M` runs one case alone; `--replay FILE...`
# replays crashers). Crashers are written to ops/fuzz/corpus, where
# `cargo test --workspace` replays them once fixed.
set -euo pipefail
cd "$(dirname "$0")/../.."
source ops/env.sh
cargo build --workspace --bin tailflight-fuzz
exec "$CARGO_TARGET_DIR/debug/tailflight-fuzz" "$@"
