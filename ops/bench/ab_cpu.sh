#!/bin/bash
# Alternated A/B copies of P1c's workload (ops/bench/profile.sh MODE cpu),
# for a change whose effect on the CPU per byte is smaller than this
# machine's drift between runs: the variants take turns, each round starting
# one later than the last (the second run of a pair is often the faster one,
# whichever it is), every copy prints one line, and the medians close.
#
#   ops/bench/ab_cpu.sh ROUNDS MODE 'NAME|BINARY|ENV' 'NAME|BINARY|ENV' ...
#
# MODE is plain or tls; NAME labels the variant; BINARY is a tailflight
# build; ENV is optional `VAR=value` settings separated by `;`, exported for
# that variant's copies only, e.g. 'WATCH_EXTRA=--window 8MiB' or
# 'MIB=512;SINK_EXTRA=--direct-min 0' (empty: profile.sh's defaults). Lines
# go to stdout and to OUT/summary (OUT=/tmp/ab-cpu by default). Bounded:
# each copy gives up after 120 s (profile.sh), each round's turn after 300 s.
set -euo pipefail
rounds=${1:?rounds}
mode=${2:?plain or tls}
shift 2
[ $# -ge 2 ] || { echo "give at least two variants 'NAME|BINARY|ENV'" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/ab-cpu}
mkdir -p "$out"
: > "$out/summary"
variants=("$@")
count=${#variants[@]}
for round in $(seq 1 "$rounds"); do
    for turn in $(seq 0 $((count - 1))); do
        IFS='|' read -r name binary settings <<< "${variants[$(((turn + round) % count))]}"
        line=$(
            IFS=';' read -ra assignments <<< "$settings"
            for assignment in "${assignments[@]}"; do
                [ -n "$assignment" ] && export "$assignment"
            done
            OUT="$out/$name-$round" timeout 300 bash "$here/profile.sh" "$mode" cpu "$binary" 2>&1 | tail -1
        ) || true
        echo "$name round $round: $line" | tee -a "$out/summary"
    done
done
python3 - "$out/summary" <<'PY'
import re, statistics, sys
figures = {}
pattern = re.compile(r"^(\S+) round \d+: .*?(\d+) MB/s; CPU s/GB watcher ([\d.]+), sink ([\d.]+), both ([\d.]+)")
for line in open(sys.argv[1]):
    m = pattern.match(line)
    if m:
        name, *values = m.groups()
        figures.setdefault(name, []).append([float(v) for v in values])
for name, runs in figures.items():
    mbps, watcher, sink, both = (statistics.median(column) for column in zip(*runs))
    print(f"{name}: {len(runs)} copies, medians: watcher {watcher:.3f}, sink {sink:.3f}, "
          f"both {both:.3f} s/GB, {mbps:.0f} MB/s")
PY
