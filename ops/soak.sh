#!/usr/bin/env bash
# The soak: simulator -> watcher -> sink for many cycles, each one
# killing (-9) the sink, the watcher or both at a random moment, or cutting
# the network for a few seconds; at the end verify (byte-identical) and audit
# (manifest vs files) must be clean. Peak RSS and open descriptors of the
# sink and the watcher are sampled throughout; a markdown summary says
# whether they grew.
#
#   ops/soak.sh                                # 100 cycles, ~15-20 minutes
#   ops/soak.sh --cycles 20 --seed 42          # repeat a run's random choices
#   ops/soak.sh --duration 30m --workdir /scratch/soak
#   ops/soak.sh --quick --cycles 4             # the short run CI does (tests/soak.rs)
#   ops/soak.sh --help                         # every option
#
# As root the sink runs in a network namespace of its own reached through a
# veth pair, and a cut takes the link down; otherwise everything is on
# loopback and a cut is a SIGSTOP freeze of the sink (the run says so).
# Exits 0 only if every cycle recovered and verify and audit are clean.
#
# The logic lives in ops/soak/soak.py (Python 3 standard library); this
# script builds the binary and hands over to it.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

# --binary PATH: use that binary and build nothing (the CI test passes the
# one Cargo built for it: a nested `cargo build` would wait on the target
# dir's lock, held by the `cargo test` that runs the test).
binary=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        --binary) binary="${args[i + 1]:-}" ;;
        --binary=*) binary="${args[i]#--binary=}" ;;
        -h | --help)
            exec python3 ops/soak/soak.py --binary /dev/null --help ;;
    esac
done

if ! command -v python3 >/dev/null 2>&1; then
    echo "soak: python3 is needed (ops/soak/soak.py, standard library only)" >&2
    exit 2
fi

if [ -z "$binary" ]; then
    source ops/env.sh
    tailflight_install_build_deps
    # Always the whole workspace: `-p tailflight` would resolve features
    # differently and recompile RocksDB (~15 minutes).
    echo "soak: building (cargo build --workspace) in $CARGO_TARGET_DIR" >&2
    cargo build --workspace --quiet
    binary="$CARGO_TARGET_DIR/debug/tailflight"
    args+=(--binary "$binary")
fi
if [ ! -x "$binary" ]; then
    echo "soak: no tailflight binary at $binary" >&2
    exit 2
fi

# exec: the Python process receives Ctrl-C and SIGTERM itself and cleans up
# (processes, namespace, veth pair) in its `finally`; its children also
# carry a parent-death signal, so even a kill -9 of the soak leaves no
# process behind, and the next soak removes a dead one's namespace.
exec python3 ops/soak/soak.py "${args[@]}"
