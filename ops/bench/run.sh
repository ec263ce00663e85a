#!/usr/bin/env bash
# Runs the benchmark suite (ops/bench/bench.py): installs the tools it
# compares against, builds tailflight (dev profile) and writes
# ops/bench/results/<date>.md/.json, plots and latest.md.
#
#   ops/bench/run.sh            full sizes (~30 min on 2 cores)
#   ops/bench/run.sh --quick    tiny sizes (< 5 min): keeps the suite from rotting
#
# Other arguments go to bench.py (e.g. --only P1,P3, --runs 5).
set -euo pipefail
cd "$(dirname "$0")/../.."
source ops/env.sh

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

# Debian packages: peers, ceilings and the namespace/tbf tools.
missing=()
for pair in iperf3:iperf3 fio:fio rsync:rsync lsyncd:lsyncd ip:iproute2 tc:iproute2 etcd:etcd-server etcdctl:etcd-client xrootd:xrootd-server xrdcp:xrootd-client; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair##*:}")
done
/usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# matplotlib (plots) and pyarrow (P8: its consumer and its ceiling) in a venv outside the clone
venv="${TAILFLIGHT_BENCH_VENV:-$HOME/.cache/tailflight/bench-venv}"
if ! "$venv/bin/python" -c 'import matplotlib, pyarrow.flight' >/dev/null 2>&1; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet matplotlib pyarrow
fi
# confluent-kafka (P12: the consumer of the sink's events and the broker's floor) in the
# project's venv, which ops/test.sh prepares with it; added there if missing, nothing removed.
pyvenv="${TAILFLIGHT_PY_VENV:-$HOME/.cache/tailflight/py-venv}"
if ! "$pyvenv/bin/python" -c 'import confluent_kafka' >/dev/null 2>&1; then
    [ -x "$pyvenv/bin/python" ] || /usr/bin/python3 -m venv "$pyvenv"
    "$pyvenv/bin/pip" install --quiet confluent-kafka
fi
export TAILFLIGHT_PY_VENV="$pyvenv"

tailflight_install_build_deps
cargo build --features bench   # dev profile, with the measurement aids (--commit-log, stage clocks)
cargo build -p detector-sim --bin tailflight-bench   # floor and delay-line: benchmark-only tools
cargo build -p flight-server --example cipher-speed --example copy_floor --example tonic_floor   # the TLS cipher's ceiling; P1c's floors
bin="$CARGO_TARGET_DIR/debug/tailflight"

# Names of what the suite creates outside the work tree, so the trap can
# remove them even if bench.py dies without cleaning up.
shm="/dev/shm/tfbench-$$"
netns="tfb$$"
bench_pid=""
cleanup() {
    trap - EXIT INT TERM
    if [ -n "$bench_pid" ] && kill -0 "$bench_pid" 2>/dev/null; then
        # bench.py leads its own process group: this ends it and its children only.
        kill -TERM -- "-$bench_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$bench_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$bench_pid" 2>/dev/null || true
    fi
    if ip netns list 2>/dev/null | grep -qw "$netns"; then
        $sudo ip netns del "$netns" || true
    fi
    host_if="h$netns"
    $sudo ip link del "${host_if:0:15}" 2>/dev/null || true
    rm -rf "$shm"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p ops/bench/work
setsid "$venv/bin/python" ops/bench/bench.py --bin "$bin" --shm "$shm" --netns "$netns" "$@" &
bench_pid=$!
set +e
wait "$bench_pid"
status=$?
set -e
bench_pid=""
exit "$status"
