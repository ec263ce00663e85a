"""Pure calculations of the suite: medians, ratios, rates, percentiles, latency matching of writes
with commits or arrivals, burst and window profiles, and the parsing of the logs' lines.

No I/O, no processes, no clock: every function takes values and returns values, so that
tests/test_analysis.py can check them with the standard library alone."""

from __future__ import annotations

import bisect
import json
import math
import re
import statistics

from .config import INPROGRESS


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def mbps(nbytes, seconds):
    if not seconds or seconds <= 0:
        return None
    return nbytes / seconds / 1e6


def percentile(sorted_values, p):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def parse_size(text: str) -> int:
    """Bytes in a size such as `4MiB`, as the simulator reads it."""
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "B": 1}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def parse_set_value(value: str):
    """A --set value: JSON where it parses as such (numbers, lists, true/false), else the text
    (sizes like 4MiB start with a digit but are not JSON)."""
    if (value and value[0] in "[{0123456789-") or value in ("true", "false"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            pass
    return value


BURST_GAP_NS = 2_000_000


def split_bursts(items):
    """Splits (write time ns, ...) tuples, sorted by time, into bursts: the
    simulator's streams tick together, so each tick is a burst of one write
    per stream, as long as the machine takes to run them (writes more than
    2 ms apart start a new burst)."""
    bursts = []
    for item in items:
        if not bursts or item[0] - bursts[-1][-1][0] > BURST_GAP_NS:
            bursts.append([])
        bursts[-1].append(item)
    return bursts


def burst_widths(writes) -> dict | None:
    """How the simulator's writes bunch up (see `split_bursts`)."""
    bursts = split_bursts(sorted((t,) for ws in writes.values() for _, _, t in ws))
    if not bursts:
        return None
    widths = sorted(b[-1][0] - b[0][0] for b in bursts)
    sizes = sorted(len(b) for b in bursts)
    return {"bursts": len(bursts), "width_p50_ms": widths[len(widths) // 2] / 1e6,
            "width_p90_ms": widths[int(len(widths) * 0.9)] / 1e6, "size_p50": sizes[len(sizes) // 2]}


def tick_profile(timed) -> dict | None:
    """Latency by a write's place in its burst (see `split_bursts`), and how
    long a burst lasts from its first write to its last commit: were the
    writes queued one behind another, the last of a burst would wait longest."""
    ticks = split_bursts(sorted(timed))
    if not ticks:
        return None
    first, last, spans = [], [], []
    for tick in ticks:
        n = len(tick)
        tenth = max(1, n // 10)
        first += [lat for _, lat in tick[:tenth]]
        last += [lat for _, lat in tick[n - tenth:]]
        spans.append(max(t / 1e6 + lat for t, lat in tick) - tick[0][0] / 1e6)
    return {"ticks": len(ticks), "first_tenth_p50_ms": percentile(sorted(first), 50),
            "last_tenth_p50_ms": percentile(sorted(last), 50), "span_p50_ms": percentile(sorted(spans), 50)}


def latency_windows(writes, lat_by_write, window_s=10.0):
    """p50/p99 per window of write time (does latency drift during the run?)."""
    pairs = sorted(lat_by_write)
    if not pairs:
        return []
    t0 = pairs[0][0]
    # In whole nanoseconds: a write on a window's edge starts the next one.
    window_ns = round(window_s * 1e9)
    buckets: dict[int, list[float]] = {}
    for t, lat in pairs:
        buckets.setdefault((t - t0) // window_ns, []).append(lat)
    out = []
    for k in sorted(buckets):
        v = sorted(buckets[k])
        out.append({"from_s": round(k * window_ns / 1e9, 9), "n": len(v), "p50_ms": percentile(v, 50),
                    "p99_ms": percentile(v, 99)})
    return out


def tailflight_latencies(writes, records, timed=None, way_there=None) -> tuple[list[float], int]:
    """ms from each write's return to the commit of its last range (all its bytes durable).

    `way_there`, if given, gets per write the ms until the sink received its
    last range (the watcher, the batching and the network; the rest is the commit)."""
    per_file: dict[str, list[tuple[int, int, int, int]]] = {}
    for key, offset, length, nanos, received in records:
        if key.endswith(INPROGRESS):
            key = key[: -len(INPROGRESS)]
        per_file.setdefault(key, []).append((offset, offset + length, nanos, received))
    lat, missing = [], 0
    for name, ws in writes.items():
        cs = sorted(per_file.get(name, []))
        starts = [c[0] for c in cs]
        for offset, length, t in ws:
            end = offset + length
            j = max(0, bisect.bisect_right(starts, offset) - 1)
            pos, tmax, rmax = offset, None, 0
            while pos < end:
                if j >= len(cs) or cs[j][0] > pos:
                    break
                if cs[j][1] > pos:
                    pos = cs[j][1]
                    tmax = cs[j][2] if tmax is None else max(tmax, cs[j][2])
                    rmax = max(rmax, cs[j][3])
                j += 1
            if pos < end or tmax is None:
                missing += 1
            else:
                lat.append((tmax - t) / 1e6)
                if way_there is not None and rmax:
                    way_there.append((rmax - t) / 1e6)
                if timed is not None:
                    timed.append((t, lat[-1]))
    return lat, missing


def latency_summary(lat: list[float], missing: int) -> dict:
    s = sorted(lat)
    return {"n": len(s), "missing": missing, "nonpositive": sum(1 for v in s if v <= 0),
            "p50_ms": percentile(s, 50), "p90_ms": percentile(s, 90), "p99_ms": percentile(s, 99),
            "p999_ms": percentile(s, 99.9), "max_ms": s[-1] if s else None,
            "mean_ms": statistics.fmean(s) if s else None}


def cdf_points(lat: list[float], points=400):
    s = sorted(lat)
    if not s:
        return []
    n = len(s)
    idx = sorted({min(n - 1, int(i * n / points)) for i in range(points)} | {n - 1})
    return [(s[i], (i + 1) / n) for i in idx]


ROUND_FIELDS = ("requests", "waited_us", "placing_us", "queued_us", "journal_us", "manifest_us", "fold_us",
                "prepare_us", "written_us", "sync_us", "total_us")


STAGES = ("place", "round", "journal")


def parse_commit_line(line: str) -> tuple[str, int, int, int, int] | None:
    """One line of a sink's --commit-log (source, key, generation, offset, len, unix_nanos[, received_nanos],
    tab-separated) as (key, offset, len, durable nanos, received nanos or 0); None if it is not one."""
    parts = line.split("\t")
    if len(parts) not in (6, 7):  # 7th: when the batch reached the sink
        return None
    _, key, _, offset, length, nanos = parts[:6]
    received = int(parts[6]) if len(parts) == 7 else 0
    return key, int(offset), int(length), int(nanos), received


def commit_series(records, t0_ns: int, bin_s=0.25) -> list[tuple[float, float]]:
    """(seconds since t0, MB/s) per bin of commit time, from commit-log records (see parse_commit_line);
    each point is at its bin's end."""
    if not records:
        return []
    bins: dict[int, int] = {}
    for _, _, length, nanos, _ in records:
        k = int((nanos - t0_ns) / 1e9 / bin_s)
        bins[k] = bins.get(k, 0) + length
    last = max(bins)
    return [((k + 1) * bin_s, bins.get(k, 0) / bin_s / 1e6) for k in range(0, last + 1)]


def parse_write_log(lines) -> dict[str, list[tuple[int, int, int]]]:
    """The simulator's --write-log lines (file, offset, length, write time ns) as, per file, its
    (offset, length, write time ns) in the log's order; other lines are skipped."""
    writes: dict[str, list[tuple[int, int, int]]] = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 4:
            continue
        writes.setdefault(parts[0], []).append((int(parts[1]), int(parts[2]), int(parts[3])))
    return writes


def summarize_commit_rounds(lines) -> dict | None:
    """Medians of the sink's commit-round trace (sink::commit=debug), the share of rounds that journaled, and
    the CPU time each sink stage had spent by the last round (its `cpu_totals_us`, one per STAGES).
    None if no line is a commit round."""
    rows, stage_cpu = [], None
    for line in lines:
        if "commit round" in line:
            rows.append(dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", line)))
            totals = re.search(r"cpu_totals_us=\[([\d, ]+)\]", line)
            if totals:
                stage_cpu = [int(x) for x in totals.group(1).split(",")]
    if not rows:
        return None
    out = {k: median([r.get(k, 0) for r in rows]) for k in ROUND_FIELDS}
    out["rounds"] = len(rows)
    out["journaled_share"] = sum(1 for r in rows if r.get("journaled", 0) > 0) / len(rows)
    if stage_cpu and len(stage_cpu) == len(STAGES):
        out["stage_cpu_s"] = {k: us / 1e6 for k, us in zip(STAGES, stage_cpu)}
    return out


def arrival_latencies(history, writes) -> tuple[list[float], int]:
    """ms from each write to when its file was first seen at least as large as the write's end, from
    `history`: per file, (times ns, sizes) of every size first seen, ascending. Returns the latencies
    and the number of writes never seen arrive."""
    lat, missing = [], 0
    for name, ws in writes.items():
        h = history.get(name)
        for offset, length, t in ws:
            end = offset + length
            if h is None:
                missing += 1
                continue
            k = bisect.bisect_left(h[1], end)
            if k >= len(h[1]):
                missing += 1
            else:
                lat.append((h[0][k] - t) / 1e6)
    return lat, missing


RANGE_COMMITTED = "org.tailflight.range.committed.v1"


def parse_event_log(lines) -> list[tuple[int, int, str]]:
    """P12's events log (tools/kafka_latency.py events: arrival ns, record timestamp ms, CloudEvent type,
    tab-separated) as (arrival ns, timestamp ms, type); other lines are skipped."""
    out = []
    for line in lines:
        parts = line.rstrip("\n").split("\t")
        if len(parts) == 3 and parts[0].isdigit() and parts[1].lstrip("-").isdigit():
            out.append((int(parts[0]), int(parts[1]), parts[2]))
    return out


def event_latencies(records, kind=RANGE_COMMITTED, since_ms=None) -> list[float]:
    """ms from each event's record timestamp (the sink's commit time, whole ms) to its arrival at the
    consumer, for the events of type `kind` committed at `since_ms` or later."""
    return [(recv - ts * 1_000_000) / 1e6 for recv, ts, t in records
            if t == kind and (since_ms is None or ts >= since_ms)]


def event_counts(records, since_ms=None) -> dict[str, int]:
    """Events per type, of those committed at `since_ms` or later."""
    out: dict[str, int] = {}
    for _, ts, t in records:
        if since_ms is None or ts >= since_ms:
            out[t] = out.get(t, 0) + 1
    return out


def arrival_batches(records, since_ms=None) -> dict | None:
    """How the events committed at `since_ms` or later reached the consumer: grouped by arrival time
    (the consumer stamps every record it takes off its queue at once with one time, so a batch is
    what one fetch brought: about one relay transaction), the number of batches, the events per batch
    (p50, max) and the time between consecutive batches (p50, p90, max). None without events."""
    sizes: dict[int, int] = {}
    for recv, ts, _ in records:
        if since_ms is None or ts >= since_ms:
            sizes[recv] = sizes.get(recv, 0) + 1
    if not sizes:
        return None
    times = sorted(sizes)
    gaps = sorted((b - a) / 1e6 for a, b in zip(times, times[1:]))
    counts = sorted(sizes.values())
    return {"batches": len(times), "events_p50": percentile(counts, 50), "events_max": counts[-1],
            "gap_p50_ms": percentile(gaps, 50), "gap_p90_ms": percentile(gaps, 90),
            "gap_max_ms": gaps[-1] if gaps else None}


def parse_floor_log(lines) -> list[tuple[int, int, int, int]]:
    """P12's floor log (tools/kafka_latency.py floor: send ns, arrival ns, record timestamp ms and, in
    newer logs, how many messages the message's transaction held; tab-separated) as (send ns, arrival
    ns, timestamp ms, width; 1 when absent); other lines are skipped."""
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) in (3, 4) and all(p.isdigit() for p in parts):
            width = int(parts[3]) if len(parts) == 4 else 1
            out.append((int(parts[0]), int(parts[1]), int(parts[2]), width))
    return out


def floor_latencies(records, first_ns=None, last_ns=None, spread=None) -> tuple[list[float], list[float]]:
    """The floor's messages sent between first_ns and last_ns (inclusive; None: unbounded): ms from
    each one's record timestamp to its arrival (as P12 measures the events), and from its exact send
    time to its arrival. `spread`: None for every message, False for those sent alone in their
    transaction, True for those of transactions spread over the partitions."""
    by_ts, exact = [], []
    for sent, recv, ts, width in records:
        if spread is not None and (width > 1) != spread:
            continue
        if (first_ns is None or sent >= first_ns) and (last_ns is None or sent <= last_ns):
            by_ts.append((recv - ts * 1_000_000) / 1e6)
            exact.append((recv - sent) / 1e6)
    return by_ts, exact


def trouble_totals(runs) -> tuple[dict[str, int], int]:
    """Counts of the trouble seen in the runs' logs, by "<process> <event>", and the duplicate (re-sent)
    bytes the sink reported, summed over the runs."""
    totals: dict[str, int] = {}
    dup = 0
    for m in runs:
        for who, ev in (m.get("log_events") or {}).items():
            for k, n in ev.items():
                if n:
                    totals[f"{who} {k.replace('_', ' ')}"] = totals.get(f"{who} {k.replace('_', ' ')}", 0) + n
        dup += (m.get("status") or {}).get("duplicate_bytes") or 0
    return totals, dup


def worst_resume(kills) -> float | None:
    """The longest resume of P7's kills; None if any kill never resumed (or there were none)."""
    worst = max((e["resume_s"] for e in kills if e["resume_s"] is not None), default=None)
    if any(e["resume_s"] is None for e in kills):
        worst = None
    return worst


def fio_write_bytes_per_s(data: dict) -> float:
    """Write rate of fio's first job from its JSON output, over the job's whole runtime: fio's own
    bandwidth leaves out the final fsync, which the job's runtime includes (when fio reports it)."""
    w = data["jobs"][0]["write"]
    job_ms = data["jobs"][0].get("job_runtime") or w.get("runtime")
    return w["io_bytes"] / (job_ms / 1000)


def fio_sync_latency_ms(data: dict) -> dict:
    """p50, p99 and p99.9 of fio's first job's syncs (fdatasync), ms, from its JSON output."""
    pct = data["jobs"][0]["sync"]["lat_ns"]["percentile"]
    return {"p50_ms": pct["50.000000"] / 1e6, "p99_ms": pct["99.000000"] / 1e6,
            "p999_ms": pct["99.900000"] / 1e6}


def medians_by_rtt(runs: dict[str, list[dict]], rtts) -> dict[str, dict[int, float | None]]:
    """P4: per kind of run, the median bytes/s of its runs at each RTT."""
    return {k: {rtt: median([r["bytes_per_s"] for r in v if r["rtt_ms"] == rtt]) for rtt in rtts}
            for k, v in runs.items()}


def busy_cores(before: tuple[int, int], after: tuple[int, int], ncpu: int) -> float | None:
    """Cores busy on average between two readings of /proc/stat's cpu line as (total, idle) jiffies;
    None if no time passed between them."""
    (tot0, idle0), (tot1, idle1) = before, after
    if tot1 <= tot0:
        return None
    return (1 - (idle1 - idle0) / (tot1 - tot0)) * ncpu
