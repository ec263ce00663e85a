"""P3: append→durable latency of many files each appended 4 KiB at a fixed rate: tailflight's runs,
the machine's floor (`tailflight-bench floor`) after each, the peers (scenarios/p3_peers.py) interleaved
with them, and the diagnostics (watcher --linger 0ms, no journal, 2 writer threads, rotating
chunks, sources on the sink's disk)."""

from __future__ import annotations

import resource
import shutil
import time

from ..analysis import (burst_widths, cdf_points, latency_summary, latency_windows, median, parse_size, ratio,
                        tailflight_latencies, tick_profile)
from ..config import NO_JOURNAL_LABEL, TARGETS
from ..formatting import cpu_line, fmt, fmt_ms, met_le
from ..harness import (Bench, BenchError, CommitLog, Pipeline, Proc, commit_rounds, dir_bytes, free_port,
                       read_write_log, rmtree, say, settle_disk, trouble_note, wait_commits)
from .p3_peers import p3_peer
from .p3_workload import p3_sim_args


def p3_tailflight(b: Bench, i: int, watch_extra=(), label="tailflight", sink_extra=(), sim_threads=None,
                  chunk="1GiB", src_on_disk=False) -> dict:
    d = b.fresh("p3", f"{label}-{i}".replace(" ", "_"))
    # Sources live on tmpfs unless asked otherwise: on the sink's disk, the simulator's
    # unsynced pages are writeback the sink's flushes may have to wait for.
    src = (b.fresh("p3-src", f"{label}-{i}".replace(" ", "_")) if src_on_disk
           else b.fresh_src("p3", f"{label}-{i}".replace(" ", "_")))
    # The measurement's own logs (every write, every commit, every round) go
    # to tmpfs: on the sink's disk their writeback would compete with the
    # fdatasyncs being measured.
    logs = b.fresh_src("p3-logs", f"{label}-{i}".replace(" ", "_")) if int(b.p["p3_logs_tmpfs"]) else d
    settled = settle_disk(d, limit_s=float(b.p["p3_settle"])) if float(b.p["p3_settle"]) else None
    pl = Pipeline(b, d, src, watch_extra=watch_extra, sink_extra=sink_extra, trace_rounds=True, logdir=logs)
    try:
        pl.start_watcher()
        time.sleep(1.0)
        # The simulator is the only child reaped while it runs (as in P1).
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        sim = b.sim(logs, "sim", src, *p3_sim_args(b, sim_threads, chunk), "--write-log", logs / "writes.log")
        if sim.wait(b.p["p3_seconds"] + 60) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        sim_cpu_s = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        total, _ = dir_bytes(src)
        wait_commits(pl.cl, total, 300, "P3 data to arrive", (pl.sink, pl.watcher))
        m = pl.finish(total)
    finally:
        pl.kill_all()
    writes = read_write_log(logs / "writes.log")
    timed: list[tuple[int, float]] = []
    way: list[float] = []
    lat, missing = tailflight_latencies(writes, pl.cl.records, timed, way)
    summ = latency_summary(lat, missing)
    summ["way_there"] = latency_summary(way, 0) if way else None
    summ["sim_burst"] = burst_widths(writes)
    summ["ticks"] = tick_profile(timed)
    summ["windows"] = latency_windows(writes, timed, 10.0 if b.p["p3_seconds"] >= 30 else 1.0)
    # A run's start, when its files are created, is where the tail was
    # (docs/profile.md): its first second by tenths.
    summ["start_windows"] = [w for w in latency_windows(writes, timed, 0.1) if w["from_s"] < 1.0]
    ok, _ = b.verify(src, pl.dest)
    m["rounds"] = commit_rounds(pl.sink.log_path)
    if logs != d:
        for log in logs.iterdir():
            shutil.move(log, d / log.name)
    m["disk_settle"] = settled
    m.update(summ)
    m.update({"verified": ok, "cdf": cdf_points(lat), "writes": sum(len(w) for w in writes.values()),
              "seconds": b.p["p3_seconds"], "label": label, "watch_extra": list(map(str, watch_extra)),
              "src_on_disk": src_on_disk})
    nw = m["writes"] or 1
    m["cpu_us_per_write"] = {"watcher": (m["watcher_cpu_s"] or 0) / nw * 1e6, "sink": (m["sink_cpu_s"] or 0) / nw * 1e6,
                             "simulator": sim_cpu_s / nw * 1e6}
    say(f"  {label} run {i}: {summ['n']} writes, p50 {fmt(summ['p50_ms'], '.2f')} ms, "
        f"p90 {fmt(summ['p90_ms'], '.2f')}, p99 {fmt(summ['p99_ms'], '.2f')}, "
        f"p99.9 {fmt(summ['p999_ms'], '.2f')}, max {fmt(summ['max_ms'], '.1f')} ms; "
        f"missing {missing}; verify {'identical' if ok else 'DIFFERENT'}; " + cpu_line(m)
        + f"; simulator {m['cpu_us_per_write']['simulator']:.1f} µs CPU per write"
        + (f"; started after {settled['waited_s']:.1f} s for a quiet disk (slowest probe {settled['slowest_probe_ms']:.0f} ms"
           + ("" if settled["quiet"] else ", never quiet") + ")" if settled else ""))
    if summ["way_there"]:
        wt = summ["way_there"]
        say(f"    of which write -> batch at the sink (watcher, batching, network): p50 {fmt(wt['p50_ms'], '.2f')} ms, "
            f"p99 {fmt(wt['p99_ms'], '.2f')} ms; the rest is the sink's placement and commit")
    if summ["sim_burst"]:
        sb = summ["sim_burst"]
        say(f"    the simulator's writes come in bursts of {sb['size_p50']} spread over {fmt(sb['width_p50_ms'], '.2f')} ms (p50)")
    if summ["ticks"]:
        tp = summ["ticks"]
        say(f"    p50 latency of the first tenth of each burst's writes {fmt(tp['first_tenth_p50_ms'], '.2f')} ms, "
            f"of the last tenth {fmt(tp['last_tenth_p50_ms'], '.2f')} ms; a burst lasts "
            f"{fmt(tp['span_p50_ms'], '.2f')} ms (p50) from its first write to its last commit")
    say("    p50/p99 per window of the run: " + ", ".join(
        f"{w['from_s']:.0f}s {fmt(w['p50_ms'], '.1f')}/{fmt(w['p99_ms'], '.1f')}" for w in summ["windows"]))
    say("    p50/p99 per 100 ms of its first second: " + ", ".join(
        f"{w['from_s']:.1f}s {fmt(w['p50_ms'], '.1f')}/{fmt(w['p99_ms'], '.1f')}" for w in summ["start_windows"]))
    rmtree(src)
    rmtree(pl.dest_root)
    return m


def p3_floor(b: Bench, i: int, place: bool = False, http2: bool = False, flight: bool = False) -> dict:
    """The same workload through `tailflight-bench floor`: inotify, one read per named file, one TCP message,
    one write + fdatasync of a preallocated ring file per round. No destination files, manifest, acks,
    checksums or window: what this machine allows any tail-and-ship tool, not a peer. With `place`, the lander
    also writes each range into its own file (`floor land --place`), on a thread of its own beside the ring's
    write and fdatasync, and flushes those files in the background: the floor of placement. With `http2`, the
    messages go over one HTTP/2 stream (h2, the sink's windows and frame size, tokio on both ends), each range
    with a CRC32C the lander checks, and an ack per round back: the floor on Arrow Flight's transport. With
    `flight`, the same ranges go as Arrow record batches in one Arrow Flight DoPut call (arrow-flight's encoder
    and decoder over tonic), checked and acked the same way: the floor on Arrow Flight's wire."""
    name = ("floor-flight" if flight else "floor-h2" if http2 else "floor-placing" if place else "floor") + f"-{i}"
    d = b.fresh("p3", name)
    src = b.fresh_src("p3", name)
    logs = b.fresh_src("p3-logs", name) if int(b.p["p3_logs_tmpfs"]) else d  # as for tailflight
    settled = settle_disk(d, limit_s=float(b.p["p3_settle"])) if float(b.p["p3_settle"]) else None
    port = free_port()
    limit = f"{int(b.p['p3_seconds']) + 400}s"
    cl = CommitLog(logs / "commit.log")
    land = ship = None
    try:
        placing = ["--place", d / "placed"] if place else []
        h2 = ["--flight"] if flight else ["--http2"] if http2 else []
        land = Proc("land", [b.bench_bin, "floor", "land", "--listen", f"127.0.0.1:{port}", "--ring", d / "ring",
                             "--commit-log", cl.path, "--limit", limit, *placing, *h2], logs, env=b.env)
        ship = Proc("ship", [b.bench_bin, "floor", "ship", "--src", src, "--to", f"127.0.0.1:{port}",
                             "--limit", limit, *h2], logs, env=b.env)
        time.sleep(1.0)
        sim = b.sim(logs, "sim", src, *p3_sim_args(b), "--write-log", logs / "writes.log")
        if sim.wait(b.p["p3_seconds"] + 60) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        total, _ = dir_bytes(src)
        wait_commits(cl, total, 300, "P3 floor data to land", (land, ship))
    finally:
        for p in (ship, land):
            if p is not None:
                p.kill9()
        if place:
            rmtree(d / "placed")  # the files placed (GBs at full size), whether the run ended well or not
    writes = read_write_log(logs / "writes.log")
    way: list[float] = []
    lat, missing = tailflight_latencies(writes, cl.records, None, way)
    summ = latency_summary(lat, missing)
    summ["way_there"] = latency_summary(way, 0) if way else None
    if logs != d:
        for log in logs.iterdir():
            shutil.move(log, d / log.name)
    (d / "ring").unlink(missing_ok=True)
    summ.update({"disk_settle": settled, "cdf": cdf_points(lat)})
    wt = summ["way_there"] or {}
    what = ("floor over Arrow Flight" if flight else "floor over HTTP/2" if http2 else "placing floor" if place
            else "floor")
    say(f"  {what} run {i}: p50 {fmt(summ['p50_ms'], '.2f')} ms, p90 {fmt(summ['p90_ms'], '.2f')}, "
        f"p99 {fmt(summ['p99_ms'], '.2f')}, max {fmt(summ['max_ms'], '.1f')} ms; missing {missing}; "
        f"write -> landed p50 {fmt(wt.get('p50_ms'), '.2f')} ms")
    rmtree(src)
    return summ


def floor_medians(res: dict, key: str, runs: list[dict], ours: tuple[float, float],
                  label: str) -> tuple[float, float]:
    """A floor's p50 and p99 (the medians of its runs), kept in `res[key]` and said beside tailflight's."""
    m50, m99 = median([r["p50_ms"] for r in runs]), median([r["p99_ms"] for r in runs])
    res[key] = {"p50_ms": m50, "p99_ms": m99}
    say(f"[P3] {label}: p50 {fmt(m50, '.2f')} ms, p99 {fmt(m99, '.2f')} ms; tailflight is "
        f"×{fmt(ratio(ours[0], m50), '.2f')} (p50), ×{fmt(ratio(ours[1], m99), '.2f')} (p99) of it")
    return m50, m99


def row_beside(b: Bench, scenario: str, ours: tuple[float, float], theirs: tuple[float, float], of_what: str,
               goal: tuple[float, float] | None = None):
    """A row setting one p50 (p99) beside another, with their ratios: information, unless `goal` gives the
    most each ratio may be (p50's, p99's)."""
    (p50, p99), (m50, m99) = ours, theirs
    r50, r99 = ratio(p50, m50), ratio(p99, m99)
    target, met = "(info)", "—"
    if goal is not None:
        target = f"≤{goal[0]:g}× (≤{goal[1]:g}×)"
        met = f"{met_le(r50, goal[0])} ({met_le(r99, goal[1])})"
    b.row(id="P3", scenario=scenario, figure=f"{fmt_ms(p50)} ({fmt_ms(p99)})", peer=f"{fmt_ms(m50)} ({fmt_ms(m99)})",
          ratio_text=f"{fmt(r50, '.2f')}× ({fmt(r99, '.2f')}×){of_what}", target=target, met=met)


def scenario_p3(b: Bench):
    n, rate, secs = b.p["p3_streams"], b.p["p3_rate"], b.p["p3_seconds"]
    say(f"[P3] append→durable latency: {n} files × {rate:.0f} appends/s of 4 KiB for {secs}s; "
        f"tailflight {b.p['runs']} run(s), each peer {b.p['peer_runs']} run(s)")
    extra = tuple(str(b.p["p3_watch"]).split())  # e.g. --set "p3_watch=--linger 250us"
    sink_extra = tuple(str(b.p["p3_sink"]).split())  # e.g. --set "p3_sink=--sync files"
    wanted = {p.strip() for p in str(b.p["p3_peers"]).split(",")}
    peer_kinds = [(label, kind, delay) for key, label, kind, delay in (
        ("rsync", "rsync loop", "rsync", None),
        ("lsyncd", "lsyncd (defaults: delay 15 s, on close)", "lsyncd", None),
        ("lsyncd0", "lsyncd (delay 0, on every write)", "lsyncd", 0)) if key in wanted]
    tf_runs: list[dict] = []
    floors: list[dict] = []
    placing_floors: list[dict] = []
    h2_floors: list[dict] = []
    flight_floors: list[dict] = []
    peers: dict[str, list[dict]] = {label: [] for label, _, _ in peer_kinds}
    # Interleaved, a tailflight run then one of each peer: the machine's load
    # drifts over minutes, and the runs of tailflight and of each peer should
    # see the same spread of it.
    for i in range(max(b.p["runs"], b.p["peer_runs"])):
        if i < b.p["runs"]:
            tf_runs.append(p3_tailflight(b, i + 1, extra, sink_extra=sink_extra))
            for setting, place, http2, flight, runs, what in (
                    ("p3_floor", False, False, False, floors, "floor"),
                    ("p3_floor_place", True, False, False, placing_floors, "placing floor"),
                    ("p3_floor_h2", True, True, False, h2_floors, "floor over HTTP/2"),
                    ("p3_floor_flight", True, False, True, flight_floors, "floor over Arrow Flight")):
                if not int(b.p.get(setting, 0)):
                    continue
                try:
                    runs.append(p3_floor(b, i + 1, place=place, http2=http2, flight=flight))
                except Exception as e:  # the floor failing must not lose the scenario's results
                    say(f"  {what} FAILED: {e}")
                    b.results["errors"][f"P3 {what} run {i + 1}"] = str(e)
        if i >= b.p["peer_runs"]:
            continue
        for label, kind, delay in peer_kinds:
            try:
                peers[label].append(p3_peer(b, kind, delay, i + 1))
            except Exception as e:  # one peer failing must not hide the others
                say(f"  {label} FAILED: {e}")
                b.results["errors"][f"P3 {label} run {i + 1}"] = str(e)
    # Diagnostic, not a target: how much of the latency is the watcher's batching linger.
    linger0 = [p3_tailflight(b, i + 1, ("--linger", "0ms"), "tailflight --linger 0ms")
               for i in range(int(b.p["p3_linger0"]))]
    # Diagnostic: without the sink's journal file (every round flushes the files it grew).
    journal = [p3_tailflight(b, i + 1, extra, NO_JOURNAL_LABEL, ("--journal-max-range", "0"))
               for i in range(int(b.p["p3_journal"]))]
    # Diagnostic: a writer of 2 threads instead of one per file, which wakes 100 threads
    # per tick on the cores the watcher and the sink need.
    two_writers = []
    for i in range(int(b.p.get("p3_two_writers", 0))):
        try:
            two_writers.append(p3_tailflight(b, i + 1, extra, "tailflight, 2 writer threads", sink_extra,
                                             sim_threads=2))
        except Exception as e:  # a diagnostic failing must not lose the scenario's results
            say(f"  2 writer threads FAILED: {e}")
            b.results["errors"][f"P3 2 writer threads run {i + 1}"] = str(e)
    # Diagnostic: every file rotates to a new chunk at the same moment, as a DAQ writer's
    # streams do: each rotation renames all the files and creates as many.
    rotating = []
    chunk = str(b.p.get("p3_rotate_chunk") or "")
    if chunk:
        try:
            rotating.append(p3_tailflight(b, 1, extra, f"tailflight, {chunk} chunks", sink_extra, chunk=chunk))
        except Exception as e:  # a diagnostic failing must not lose the scenario's results
            say(f"  rotating chunks FAILED: {e}")
            b.results["errors"]["P3 rotating chunks"] = str(e)
    # The same with the sources on the sink's own disk, as on a host that writes and
    # receives: their dirty pages are what a syncfs of that filesystem would wait for.
    if chunk and int(b.p.get("p3_rotate_src_disk", 0)):
        try:
            rotating.append(p3_tailflight(b, 1, extra, f"tailflight, {chunk} chunks, sources on the sink's disk",
                                          sink_extra, chunk=chunk, src_on_disk=True))
        except Exception as e:  # a diagnostic failing must not lose the scenario's results
            say(f"  rotating chunks with sources on disk FAILED: {e}")
            b.results["errors"]["P3 rotating chunks, sources on disk"] = str(e)
    p50 = median([r["p50_ms"] for r in tf_runs])
    p99 = median([r["p99_ms"] for r in tf_runs])
    res = {"tailflight": tf_runs, "linger0": linger0, "journal": journal, "two_writers": two_writers,
           "rotating": rotating, "peers": peers, "floor": floors, "placing_floor": placing_floors,
           "h2_floor": h2_floors, "flight_floor": flight_floors,
           "p50_ms": p50, "p99_ms": p99,
           "p90_ms": median([r["p90_ms"] for r in tf_runs]),
           "p999_ms": median([r["p999_ms"] for r in tf_runs]),
           "max_ms": median([r["max_ms"] for r in tf_runs])}
    b.results["scenarios"]["P3"] = res
    trouble_note(b, "P3", tf_runs + linger0 + journal + two_writers + rotating)
    say(f"[P3] tailflight p50 {fmt(p50, '.2f')} ms (target ≤{TARGETS['P3_p50_ms']}), "
        f"p99 {fmt(p99, '.2f')} ms (target ≤{TARGETS['P3_p99_ms']})")
    b.row(id="P3", scenario=f"append→durable latency p50, {n} files × {rate:.0f}/s × 4 KiB, {secs}s",
          figure=fmt_ms(p50), peer="—", ratio=None, target=f"≤{TARGETS['P3_p50_ms']} ms",
          met=met_le(p50, TARGETS["P3_p50_ms"]))
    b.row(id="P3", scenario="… p99 (p99.9 / max in the details)", figure=fmt_ms(p99), peer="—", ratio=None,
          target=f"≤{TARGETS['P3_p99_ms']} ms", met=met_le(p99, TARGETS["P3_p99_ms"]))
    # Each floor beside tailflight, then against the floors before it:
    # (its key, its runs, how the log names it, its row, the ratio's
    # suffix, and (earlier floor, row) comparisons).
    floor_rows = (
        ("floor", floors, "floor (inotify → TCP → ring write + fdatasync, nothing else)",
         "… the machine's floor on the same workload (`tailflight-bench floor`: inotify → one TCP connection → "
         "ring-file write + fdatasync; no placement, manifest or acks): p50 (p99)", " the floor", ()),
        ("placing_floor", placing_floors, "placing floor (the floor, each range also written into its own file)",
         "… the floor with placement (`floor land --place`: each range also written into its own file, on a "
         "thread beside the ring's write + fdatasync; those files flushed every 400 ms): p50 (p99)",
         " the placing floor",
         (("floor", "… what placement alone adds to the floor: the placing floor against the floor, p50 (p99)"),)),
        ("h2_floor", h2_floors,
         "floor over HTTP/2 (the placing floor over one h2 stream, a CRC32C per range, an ack per round)",
         "… the placing floor over Arrow Flight's transport (`floor --http2 --place`: one HTTP/2 stream with the "
         "sink's windows and frame size, tokio on both ends, a CRC32C per range checked on landing, an ack per "
         "round): p50 (p99)", " the floor over HTTP/2",
         (("floor", "… the floor over HTTP/2 against the floor: what placement, HTTP/2, the checksums and the "
                    "acks add together, p50 (p99)"),
          ("placing_floor", "… the floor over HTTP/2 against the placing floor: what HTTP/2, the checksums and "
                            "the acks add, p50 (p99)"))),
        ("flight_floor", flight_floors,
         "floor over Arrow Flight (the floor over HTTP/2 as record batches in one DoPut call)",
         "… the placing floor on Arrow Flight's wire (`floor --flight --place`: the ranges as Arrow record "
         "batches in one DoPut call, arrow-flight's encoder and decoder over tonic, the sink's windows and frame "
         "size, a CRC32C per range checked on landing, a PutResult per round): p50 (p99)",
         " the floor over Arrow Flight",
         (("floor", "… the floor over Arrow Flight against the floor: what placement, Arrow Flight, the checksums "
                    "and the acks add together, p50 (p99)"),
          ("h2_floor", "… the floor over Arrow Flight against the floor over HTTP/2: what Arrow's and gRPC's "
                       "framing and tonic add, p50 (p99)"))),
    )
    floor_p = {}
    for key, runs, label, row, suffix, against in floor_rows:
        if not runs:
            continue
        floor_p[key] = floor_medians(res, f"{key}_medians", runs, (p50, p99), label)
        # Issue 43's goals are ratios to the floor itself.
        goal = ((TARGETS["P3_p50_floor_factor"], TARGETS["P3_p99_floor_factor"]) if key == "floor" else None)
        row_beside(b, row, (p50, p99), floor_p[key], suffix, goal)
        for earlier, text in against:
            if earlier in floor_p:
                row_beside(b, text, floor_p[key], floor_p[earlier], "")
    for runs, what in ((linger0, "watcher `--linger 0ms`"),
                       (journal, "sink `--journal-max-range 0` (no journal file)"),
                       (two_writers, "the simulator's writes made by 2 threads")):
        if runs:
            d50 = median([r["p50_ms"] for r in runs])
            d99 = median([r["p99_ms"] for r in runs])
            b.row(id="P3", scenario=f"… diagnostic: {what}, p50 (p99)",
                  figure=f"{fmt_ms(d50)} ({fmt_ms(d99)})", peer="—", ratio=None, target="(info)", met="—")
    for r in rotating:
        every = parse_size(chunk) / (rate * 4096)
        where = ", sources on the sink's disk" if r.get("src_on_disk") else ""
        b.row(id="P3", scenario=f"… diagnostic: all {n} files rotate to a new {chunk} chunk every {every:.1f} s, "
                                 f"at once{where}: p99 (p99.9 / max)",
              figure=f"{fmt_ms(r['p99_ms'])} ({fmt_ms(r['p999_ms'])} / {fmt_ms(r['max_ms'])})", peer="—",
              ratio=None, target="(info)", met="—")
    for label, runs in peers.items():
        pp50 = median([r["p50_ms"] for r in runs])
        pp99 = median([r["p99_ms"] for r in runs])
        r50, r99 = ratio(pp50, p50), ratio(pp99, p99)
        res.setdefault("peer_medians", {})[label] = {"p50_ms": pp50, "p99_ms": pp99,
                                                     "x_p50": r50, "x_p99": r99}
        say(f"[P3] vs {label}: peer p50 {fmt_ms(pp50)} (×{fmt(r50, '.0f')} tailflight's), "
            f"p99 {fmt_ms(pp99)} (×{fmt(r99, '.0f')})")
        ok = None if r50 is None or r99 is None else (r50 >= TARGETS["P3_peer_factor"] and r99 >= TARGETS["P3_peer_factor"])
        b.row(id="P3", scenario=f"… vs {label}: p50 (p99)",
              figure=f"{fmt_ms(p50)} ({fmt_ms(p99)})", peer=f"{fmt_ms(pp50)} ({fmt_ms(pp99)})",
              ratio_text=f"{fmt(r50, '.0f')}× ({fmt(r99, '.0f')}×) lower",
              target=f"≥{TARGETS['P3_peer_factor']:.0f}× lower", met="yes" if ok else ("no" if ok is False else "?"))
