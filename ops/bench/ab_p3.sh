#!/bin/bash
# Alternated A/B runs of P3 (100 files x 100 writes/s of 4 KiB, 20 s each,
# with each run's own floor), for a change whose effect on latency is
# smaller than this machine's drift: the variants take turns, each round
# starting one later than the last, and every run prints one line.
#
#   ops/bench/ab_p3.sh ROUNDS 'NAME|BINARY|SETTING' 'NAME|BINARY|SETTING' ...
#
# NAME labels the variant; BINARY is a tailflight built with the `bench`
# feature (tailflight-bench beside it, for the floor); SETTING is one
# optional `--set` of bench.py, e.g. 'p3_watch=--linger 100us' or
# 'p3_sink=--sync files' (empty: the defaults). Lines go to stdout and to
# OUT/summary (OUT=/tmp/ab-p3 by default), each run's report under OUT.
# Bounded: each run gives up after 10 minutes.
set -euo pipefail
rounds=${1:?rounds}
shift
[ $# -ge 2 ] || { echo "give at least two variants 'NAME|BINARY|SETTING'" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/ab-p3}
bench_python=${TAILFLIGHT_BENCH_VENV:-$HOME/.cache/tailflight/bench-venv}/bin/python
export TAILFLIGHT_PY_VENV=${TAILFLIGHT_PY_VENV:-$HOME/.cache/tailflight/py-venv}
mkdir -p "$out"
variants=("$@")
count=${#variants[@]}
for round in $(seq 1 "$rounds"); do
    for turn in $(seq 0 $((count - 1))); do
        IFS='|' read -r name binary setting <<< "${variants[$(((turn + round) % count))]}"
        run="$out/$name-$round"
        rm -rf "$run"
        extra=()
        [ -n "$setting" ] && extra=(--set "$setting")
        timeout 600 "$bench_python" "$here/bench.py" --quick --only P3 --bin "$binary" \
            --shm /dev/shm/ab-p3 --out "$run" \
            --set p3_streams=100 --set p3_seconds=20 --set runs=1 --set p3_peers= \
            --set p3_linger0=0 --set p3_two_writers=0 --set p3_rotate_chunk= --set p3_journal=0 --set p3_floor_place=0 \
            "${extra[@]}" > "$run.log" 2>&1 || true
        python3 - "$name" "$round" "$run" <<'PY' | tee -a "$out/summary"
import glob, json, sys
name, round_, run = sys.argv[1:]
try:
    report = json.load(open(glob.glob(run + "/*.json")[0]))
    p3 = report["scenarios"]["P3"] if "scenarios" in report else report["P3"]
    ours, floor = p3["tailflight"][0], (p3.get("floor") or [{}])[0]
    rounds = ours.get("rounds") or {}
    print(f"{name} round {round_}: p50 {ours['p50_ms']:.2f} ms, p99 {ours['p99_ms']:.2f}, "
          f"p99.9 {ours['p999_ms']:.1f}; floor p50 {floor.get('p50_ms', 0):.2f}, p99 {floor.get('p99_ms', 0):.2f}; "
          f"to the sink p50 {ours['way_there']['p50_ms']:.2f}; CPU s/GB sink {ours['sink_cpu_s_per_gb']:.2f}, "
          f"watcher {ours['watcher_cpu_s_per_gb']:.2f}; round medians (µs) placing {rounds.get('placing_us')}, "
          f"waited {rounds.get('waited_us')}, round {rounds.get('total_us')}")
except (IndexError, KeyError, OSError, ValueError) as error:
    print(f"{name} round {round_}: no result ({error!r}); see {run}.log")
PY
    done
done
