#!/usr/bin/env bash
# Runs the whole test suite: unit tests of every crate and the end-to-end,
# crash, lost-state, source-event, bad-input and authentication tests, which
# start sinks, watchers and simulators as separate processes on loopback;
# then the unit tests of the benchmark suite's calculations, and the suite
# itself in --quick mode, so that it cannot rot (it must complete and write
# its results; its figures are not asserted).
set -euo pipefail
cd "$(dirname "$0")/.."
source ops/env.sh
tailflight_install_build_deps
cargo build --workspace --all-targets
# The tests need ~2 GiB of scratch at peak (each removes its folder when it
# passes); say what there is, so a full disk is recognised as such.
df -h "${TMPDIR:-/tmp}" . | sed 's/^/disk: /'
# Two test threads: the machines this runs on have two cores, and the
# end-to-end tests each run several processes.
cargo test --workspace -- --test-threads=2
python3 -m unittest discover -s ops/bench/tests -t ops/bench
ops/bench/run.sh --quick
test -s ops/bench/results/latest-quick.md
