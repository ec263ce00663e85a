#!/bin/bash
# Profiles one copy of P1c's workload by the pipeline: FILES files of MIB MiB
# (random bytes on tmpfs) copied by a watcher to a sink on loopback, whose
# root is on the disk under ops/bench/work/profile. What docs/profile.md was
# made with.
#
#   ops/bench/profile.sh MODE HOW [BIN]
#     MODE  plain | tls   (tls: mutual TLS with the suite's certificates;
#                          run the suite once first to make them)
#     HOW   cpu           the watcher's and the sink's CPU per GB only
#           perf          perf record -a -g (frame pointers, every process)
#           dwarf-sink    perf record --call-graph dwarf of the sink alone
#           strace-sink | strace-watch
#                         strace -f -c of one process (syscall counts)
#     BIN   the tailflight binary (default: the dev build)
#   FILES=16 MIB=128 OUT=/tmp/tfprof   environment, with these defaults
#
# Output in OUT: perf-MODE.data, dwarf-sink-MODE.data, strace-*-MODE.txt,
# and a line per run on stdout. Bounded: each copy gives up after 120 s.
set -euo pipefail
mode=${1:?plain or tls}
how=${2:?cpu, perf, dwarf-sink, strace-sink or strace-watch}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../env.sh
source "$here/../env.sh"
bin=${3:-$CARGO_TARGET_DIR/debug/tailflight}
files=${FILES:-16}
mib=${MIB:-128}
out=${OUT:-/tmp/tfprof}
src=/dev/shm/tfprof-src
work=$here/work/profile
certs=$here/work/certs
mkdir -p "$out" "$src"

# The files' sizes alone: du counts the directory's own size too, which
# made every run write its sources anew.
source_bytes() { find "$src" -type f -printf '%s\n' | awk '{ total += $1 } END { printf "%.0f\n", total }'; }
if [ "$(find "$src" -type f | wc -l)" -ne "$files" ] || [ "$(source_bytes)" -ne $((files * mib << 20)) ]; then
    rm -rf "$src" && mkdir -p "$src"
    for i in $(seq 1 "$files"); do head -c $((mib << 20)) /dev/urandom > "$src/f$i"; done
fi
total=$(source_bytes)

rm -rf "$work" && mkdir -p "$work"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sink_tls=() watch_tls=() scheme=http
if [ "$mode" = tls ]; then
    sink_tls=(--tls-cert "$certs/server.pem" --tls-key "$certs/server.key" --client-ca "$certs/ca.pem")
    watch_tls=(--tls-ca "$certs/ca.pem" --tls-cert "$certs/client.pem" --tls-key "$certs/client.key")
    scheme=https
fi
sink=("$bin" sink --listen "127.0.0.1:$port" --root "$work/dest" --state "$work/sink-state" "${sink_tls[@]}" ${SINK_EXTRA:-})
watch=("$bin" watch --dir "$src" --source profile --to "$scheme://127.0.0.1:$port" --state "$work/watch-state" "${watch_tls[@]}" ${WATCH_EXTRA:-})

sync
pids=()
# Under strace the process to stop is strace's child (strace itself ignores
# SIGINT while it runs a command).
cleanup() {
    for p in "${pids[@]}"; do
        pkill -INT -P "$p" 2>/dev/null || true
        kill -INT "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# Starts ROLE's command in the background, under strace -c when HOW asks
# for that role's syscall counts.
launch() {
    local role=$1
    shift
    if [ "$how" = "strace-$role" ]; then
        strace -f -c -o "$out/strace-$role-$mode.txt" "$@" 2>"$work/$role.log" &
    else
        "$@" 2>"$work/$role.log" &
    fi
}

launch sink "${sink[@]}"
sink_pid=$!
pids+=("$sink_pid")
sleep 1.5
recorder=
case "$how" in
    perf) perf record -a -g -F 499 -o "$out/perf-$mode.data" 2>/dev/null & recorder=$! ;;
    dwarf-sink) perf record -p "$sink_pid" --call-graph dwarf,32768 -F 299 -o "$out/dwarf-sink-$mode.data" 2>/dev/null & recorder=$! ;;
esac
[ -n "$recorder" ] && sleep 0.3
started=$(date +%s.%N)
launch watch "${watch[@]}"
watch_pid=$!
pids+=("$watch_pid")
for _ in $(seq 1 2400); do
    got=$(du -sb --apparent-size "$work/dest" 2>/dev/null | cut -f1)
    [ "${got:-0}" -ge "$total" ] && break
    sleep 0.05
done
ended=$(date +%s.%N)
cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
faults_of() { awk '{print $10}' "/proc/$1/stat" 2>/dev/null || echo 0; }
watch_cpu=$(cpu_of "$watch_pid")
sink_cpu=$(cpu_of "$sink_pid")
faults="$(faults_of "$watch_pid") $(faults_of "$sink_pid")"
peak_of() { awk '/^VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
peaks="$(peak_of "$watch_pid") $(peak_of "$sink_pid")"
if [ -n "$recorder" ]; then kill -INT "$recorder"; wait "$recorder" 2>/dev/null || true; fi
cleanup
pids=()
cmp "$src/f1" "$work/dest/profile/f1"
python3 - "$mode" "$how" "$total" "$started" "$ended" "$watch_cpu" "$sink_cpu" "$(getconf CLK_TCK)" $faults $peaks <<'EOF'
import sys
mode, how, total, t0, t1, watch, sink, tck, watch_faults, sink_faults, watch_peak, sink_peak = sys.argv[1:]
gb, tck = int(total) / 1e9, int(tck)
watch, sink = int(float(watch)) / tck / gb, int(float(sink)) / tck / gb
print(f"{mode} {how}: {int(total) / (float(t1) - float(t0)) / 1e6:.0f} MB/s; CPU s/GB watcher {watch:.2f}, "
      f"sink {sink:.2f}, both {watch + sink:.2f}; minor faults watcher {watch_faults}, sink {sink_faults}; "
      f"peak resident MiB watcher {int(watch_peak or 0) // 1024}, sink {int(sink_peak or 0) // 1024} "
      "(under strace or perf, slower and dearer)")
EOF
