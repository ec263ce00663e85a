"""The results files: <date>.md with the table of targets, CPU and memory, machine load, details,
bounds, plots, method and limits; <date>.json with every raw number; latest.md (quick mode:
the same names with "-quick")."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

from .analysis import median, ratio
from .bounds import bounds_analysis
from .ceilings import fs_type
from .config import GB, MiB
from .formatting import fmt, fmt_mb, strip_ansi
from .harness import Bench, say
from .plots import make_plots


def cpu_table(b: Bench) -> list[str]:
    sc = b.results["scenarios"]
    rows = []

    def add(name, runs):
        runs = [r for r in runs if r and r.get("bytes")]
        if not runs:
            return
        med = lambda k: median([r.get(k) for r in runs])
        wall = median([r.get("seconds") for r in runs])
        cores = None
        if wall:
            c = median([(r.get("watcher_cpu_s") or 0) + (r.get("sink_cpu_s") or 0) for r in runs])
            cores = c / wall if c is not None else None
        rows.append(f"| {name} | {len(runs)} | {med('bytes') / GB:.2f} | {fmt(med('watcher_cpu_s_per_gb'), '.2f')} | "
                    f"{fmt(med('sink_cpu_s_per_gb'), '.2f')} | {fmt(med('watcher_rss_mib'), '.0f')} | "
                    f"{fmt(med('sink_rss_mib'), '.0f')} | {fmt(cores, '.2f')} |")

    if "P1" in sc:
        add("P1 plaintext", sc["P1"]["runs"])
    if "P2" in sc:
        add("P2 mTLS", sc["P2"]["runs"])
    if "P3" in sc:
        add("P3 latency workload", sc["P3"]["tailflight"])
    if "P4" in sc and sc["P4"].get("runs"):
        for rtt in sc["P4"]["rtts"]:
            add(f"P4 4 conn, RTT {rtt} ms", [r for r in sc["P4"]["runs"]["tf4"] if r["rtt_ms"] == rtt])
            add(f"P4 1 conn, RTT {rtt} ms", [r for r in sc["P4"]["runs"]["tf1"] if r["rtt_ms"] == rtt])
    if "P5" in sc:
        add("P5 many slow files", [dict(sc["P5"], seconds=sc["P5"].get("seconds"))])
    if "P6" in sc:
        add("P6 many new files", sc["P6"]["tailflight"])
    if "P7" in sc:
        add("P7 kill -9 (whole run)", [dict(sc["P7"], seconds=None)])
    if not rows:
        return []
    return ["| scenario | runs | GB | watcher CPU s/GB | sink CPU s/GB | watcher peak RSS MiB | "
            "sink peak RSS MiB | cores busy (both, over the run) |",
            "|---|---|---|---|---|---|---|---|", *rows]


def details(b: Bench) -> list[str]:
    sc = b.results["scenarios"]
    out = []
    if "ceilings" in sc:
        c = sc["ceilings"]
        out += [f"**Ceilings**: loopback TCP {fmt_mb(c['tcp4'])} with 4 streams, {fmt_mb(c['tcp1'])} with 1; "
                f"disk ({c['disk_tool']}, fdatasync every 32 MiB, {c['disk_fs']}) {fmt_mb(c['disk'])}"
                + (f"; memory, dd into a new tmpfs file: {fmt_mb(c['memory_first_touch'])}, the same pages again "
                   f"{fmt_mb(c['memory_rewrite'])}" if c.get("memory_first_touch") else "")
                + (f"; disk with O_DIRECT (fio 4 MiB writes, no page cache, as the sink writes ranges of 1 MiB "
                   f"and more) {fmt_mb(c['disk_direct'])}" if c.get("disk_direct") else "")
                + ".", ""]
    for key in ("P1", "P2"):
        if key in sc:
            runs = sc[key]["runs"]
            out += [f"**{key}** runs: " + ", ".join(
                f"{r['bytes_per_s'] / 1e6:.0f} MB/s ({r['total_bytes'] / MiB:.0f} MiB, {r['seconds']:.1f}s, "
                f"{'verified' if r['verified'] else 'NOT IDENTICAL'})" for r in runs), ""]
    if "P3" in sc:
        p3 = sc["P3"]
        out += ["**P3** latency (ms); \"to sink\" is write → batch received by the sink, p50/p99:", "",
                "| who | run | writes | p50 | p90 | p99 | p99.9 | max | missing | to sink |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for i, r in enumerate(p3["tailflight"] + p3.get("linger0", []) + p3.get("journal", [])
                              + p3.get("two_writers", []) + p3.get("rotating", [])):
            wt = r.get("way_there") or {}
            out.append(f"| {r.get('label', 'tailflight')} | {i + 1} | {r['n']} | {fmt(r['p50_ms'], '.2f')} | {fmt(r['p90_ms'], '.2f')} | "
                       f"{fmt(r['p99_ms'], '.2f')} | {fmt(r['p999_ms'], '.2f')} | {fmt(r['max_ms'], '.1f')} | {r['missing']} | "
                       f"{fmt(wt.get('p50_ms'), '.2f')} / {fmt(wt.get('p99_ms'), '.2f')} |")
        for label, runs in p3["peers"].items():
            for i, r in enumerate(runs):
                out.append(f"| {label} | {i + 1} | {r['n']} | {fmt(r['p50_ms'], '.0f')} | {fmt(r['p90_ms'], '.0f')} | "
                           f"{fmt(r['p99_ms'], '.0f')} | {fmt(r['p999_ms'], '.0f')} | {fmt(r['max_ms'], '.0f')} | "
                           f"{r['missing']} | — |")
        out.append("")
    if "P4" in sc and sc["P4"].get("medians"):
        p4 = sc["P4"]
        out += [f"**P4** path: {p4['path']}" + (f"; link ceiling (iperf3 -P 4, no delay) {fmt_mb(p4.get('link_bytes_per_s'))}"
                                              if p4.get("link_bytes_per_s") else "") + ".", "",
                "| RTT ms | tailflight (4 conn) | tailflight (1 conn) | rsync daemon | tailflight ÷ own 0 ms |",
                "|---|---|---|---|---|"]
        lo = min(p4["rtts"])
        for rtt in p4["rtts"]:
            m = p4["medians"]
            out.append(f"| {rtt} | {fmt_mb(m['tf4'][rtt])} | {fmt_mb(m['tf1'][rtt])} | {fmt_mb(m['rsync'][rtt])} | "
                       f"{fmt(ratio(m['tf4'][rtt], m['tf4'][lo]), '.2f')} |")
        out.append("")
    if "P5" in sc:
        p = sc["P5"]
        out += [f"**P5**: {p['files']} files, {p['bytes'] / MiB:.0f} MiB; the last range was recorded "
                f"{fmt(p.get('drain_after_last_write_s'), '.2f')}s after the writer finished (negative: before it "
                f"had closed its files); writer max lag "
                f"{p['writer']['max_lag_s'] * 1000:.0f} ms.", ""]
    if "P6" in sc:
        p = sc["P6"]
        out += ["**P6** runs: tailflight " + ", ".join(f"{r['files_per_s']:.0f}" for r in p["tailflight"])
                + " files/s; rsync loop " + ", ".join(f"{r['files_per_s']:.0f}" for r in p["rsync"])
                + " files/s; rsync --fsync loop " + ", ".join(f"{r['files_per_s']:.0f}" for r in p["rsync_fsync"])
                + " files/s.", ""]
    if "P7" in sc:
        p = sc["P7"]
        out += ["**P7** kills: " + "; ".join(
            f"#{e['kill']}: answers {fmt(e['first_answer_s'], '.2f')}s, placed grows {fmt(e['resume_s'], '.2f')}s, "
            f"first commit {fmt(e['first_commit_after_restart_s'], '.3f')}s" for e in p["kills"])
            + f". Audit: {json.dumps({k: p['audit'].get(k) for k in ('placed_bytes', 'duplicate_bytes', 'rewritten_bytes', 'overlapping_placements', 'record_mismatches')})}.", ""]
    return out


METHOD = """\
## Method

- **One machine, one run.** Every ratio compares figures measured in the same invocation on the same
  machine ({ncpu} cores, {mem} GiB RAM, kernel {kernel}). The machine is shared and noisy (other jobs,
  a virtual disk): read small differences as noise. {runs_note}
- **Sources on tmpfs.** Simulator and writer outputs live on `{shm}` (tmpfs) so that reading the source
  costs no disk I/O and the disk ceiling is the sink's alone. The sink root, its RocksDB manifest and the
  peers' destinations are under `{work}` on {fs}. P3's measurement logs (the simulator's
  write log, the sink's commit log and round trace, the processes' logs: about 40 MB a minute) are
  written to tmpfs too, and moved beside the run's state afterwards: on the sink's disk, the kernel's
  writeback of them 30 s after they were written (its dirty-page expiry) stalled the sink's fdatasyncs,
  and that window's p99 went from 7–8 ms to 58–69 ms (3 paired 60 s runs, 2026-11-25). A sink root
  shared with other heavy writers sees the same; `--set p3_logs_tmpfs=0` measures it. Each P3 run
  (tailflight's and the peers') also starts only once a 4 KiB write + fdatasync in the work folder has
  stayed under 10 ms for 3 s (at most `p3_settle` s: 90 in full mode, 5 in quick mode; the wait is in the JSON, `disk_settle`): after the suite
  wrote or deleted gigabytes, this VM's disk stopped completing writes for 0.3–0.4 s every ~2.4 s for
  10 s and more, and a run started then measured those stalls (p99 43–119 ms against 8–19 ms,
  2026-11-25). `--set p3_settle=0` starts at once.
- **Throughput** (P1, P2, P4) = source bytes ÷ (time from the simulator's start, or the watcher's start
  for P4, to the commit time of the last range in the sink's `--commit-log`). Source files are written by
  `tailflight sim` (16 streams, 1 MiB writes, 64 MiB chunks renamed from `.inprogress`).
  The ceilings are `iperf3 -P 4` on loopback and `fio` 4 MiB sequential writes with an fdatasync every
  8 writes (32 MiB) in the sink root's filesystem. Every destination is checked with `tailflight verify`.
- **Latency** (P3) = commit time (sink `--commit-log`, wall clock after the fdatasync + manifest commit) of
  the last range covering a write, minus the time `write()` returned in the simulator (`--write-log`); same
  host clock. The writer is `tailflight sim` ({p3_files} files, {p3_writers}): every file's write falls
  due at the same moment.{p3_two_writers} Peers get the same simulator workload; their destination folder is swept every ~1 ms by a
  Python thread and a write counts as arrived when the destination file first reaches its end offset (so
  the peers are credited with bytes that are only in the page cache: neither rsync nor lsyncd fsyncs).
  Destination content is compared with the source at the end. The **floor** (`tailflight-bench floor ship` / `land`)
  runs the same workload after each tailflight run through the least such a tool must do: inotify, one read
  per file with events, one TCP message per read of events, one write + fdatasync of a preallocated ring file
  per round of arrived messages; it places nothing into destination files and keeps no manifest. The
  **placing floor** (`floor land --place`) then does the same and also writes each range into its own file,
  on a thread beside the ring's write + fdatasync (a range counts once both are done), those files flushed
  every 400 ms in the background (the ring reuses a round's space only once they are): the least a mover
  that delivers files does. The **floor over HTTP/2** (`floor --http2 --place`) carries the placing floor's
  messages in one HTTP/2 stream (h2 as tonic uses it, the sink's windows and frame size, tokio on both ends),
  each range with a CRC32C checked before its round, and acks each round: the least a mover on Arrow
  Flight's transport that checks its bytes does. The **floor over Arrow Flight** (`floor --flight --place`)
  sends the same ranges as Arrow record batches in one DoPut call (arrow-flight's encoder and decoder over
  tonic, the same windows), checked and acked the same way: the least a mover on Arrow Flight's wire does.
- **WAN** (P4): watcher → `tailflight-bench delay-line` on the host (holds each chunk RTT/2 per direction,
  unbounded buffer, so TCP windows do not see the delay; HTTP/2 and tailflight windows and acks do) →
  veth pair with `tbf rate {rate} burst 2mb latency 100ms` on both ends → sink in a network namespace.
  The data set is written first; each run copies it whole (files are found by the watcher's first walk).
  The rsync peer is an `rsync --daemon` in the same namespace behind a second delay line. The delay line
  is an emulation: no loss, no reordering, no real congestion control at the RTT.
- **P5** uses one Python process that keeps every file open and appends one block to each file per second
  in 100 slots of 10 ms (the simulator uses a thread per stream, which does not scale to 10k files).{p5_dest}
- **P6** creates the files with one Python process (open, one 64 KiB write, close; 1000 files per new
  subfolder).{p6_settle} The watcher runs with `--seal-idle 1s`, so that each file's seal (final size and digest)
  falls inside the measured run; with the default 60 s it would come after it. Its open descriptors stay
  bounded either way: past `--max-open-files` (4096) it closes those of idle, fully read files (100,000
  files at the default seal delay: at most ~4800 descriptors, 2026-11-24). rsync loops run back to
  back; done = end of the first pass that started after the last file was created.
- **P7**: under a paced simulator load the sink is killed with SIGKILL and restarted at once; resume =
  restart → first `status` answer whose placed_bytes exceeds the first answer after restart (polled every
  50 ms; the commit-log time of the first commit after restart is also given). Then verify + `audit`.
- **CPU and memory**: user+sys CPU seconds from `/proc/PID/stat` and peak RSS (`VmHWM`) of the watcher and
  the sink, read just before they are stopped, divided by the source bytes of the run. Binary: the dev
  profile as built by `cargo build` (everything at opt-level 3; the workspace crates keep debug
  assertions, overflow checks and line tables).
"""


def write_report(b: Bench, started: float | None):
    """started: time.monotonic() at the start of the suite; None when re-rendering a saved run."""
    date = b.results["meta"]["started"][:10] if started is None else datetime.date.today().isoformat()
    suffix = "-quick" if b.quick else ""
    out = Path(b.args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{date}{suffix}"
    if started is not None:
        b.results["meta"].update({"runtime_s": time.monotonic() - started,
                                  "finished": datetime.datetime.now().isoformat(timespec="seconds")})
    plots = make_plots(b, out, stem)
    b.results["rows"], b.results["notes"] = b.rows, b.notes
    (out / f"{stem}.json").write_text(json.dumps(b.results, indent=1, default=str))
    meta = b.results["meta"]
    lines = [f"# tailflight benchmarks — {date}{' (quick mode: tiny sizes, not figures to quote)' if b.quick else ''}",
             "",
             f"Mode **{b.mode}**, commit `{meta['commit']}`, {meta['nproc']} cores, "
             f"{meta['mem_gib']:.0f} GiB RAM, load average at start {meta['loadavg']}; suite runtime "
             f"{meta['runtime_s'] / 60:.1f} min. Raw numbers: `{stem}.json`.", "",
             "| id | scenario | tailflight | ceiling / peer | ratio | target | met? |",
             "|---|---|---|---|---|---|---|"]
    for r in b.rows:
        rt = r.get("ratio_text") or (fmt(r.get("ratio"), ".2f") + "×" if r.get("ratio") is not None else "—")
        lines.append(f"| {r['id']} | {r['scenario']} | {r['figure']} | {r['peer']} | {rt} | {r['target']} | {r['met']} |")
    if b.results["errors"]:
        lines += ["", "**Scenarios that failed to run:**", ""]
        lines += [f"- {k}: {strip_ansi(v)[:600]}" for k, v in b.results["errors"].items()]
    if b.notes:
        lines += ["", *[f"- {n}" for n in b.notes]]
    ct = cpu_table(b)
    if ct:
        lines += ["", "## CPU and memory (medians over runs)", "", *ct]
    mach = b.results.get("machine") or {}
    if mach:
        lines += ["", "## Machine load per scenario (everything on the machine, the suite included)", "",
                  "| scenario | wall s | cores busy (of " + str(os.cpu_count()) + ") | load avg 1 min at start → end |",
                  "|---|---|---|---|"]
        lines += [f"| {k} | {v['seconds']:.0f} | {v['busy_cores']:.2f} | {v['loadavg_start']:.1f} → {v['loadavg_end']:.1f} |"
                  for k, v in mach.items()]
    lines += ["", "## Details", ""]
    lines += details(b)
    ba = bounds_analysis(b)
    if ba:
        lines += ["", "## What bounds the figures", "", *ba]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in plots]
    p5_dest = (" The P5 sink root is on tmpfs (its manifest on disk): the targets concern the watcher, and on "
               "this disk (ext4 mounted with `discard`) deleting 10k files grown by interleaved synced appends takes "
               "many minutes." if (b.results["scenarios"].get("P5") or {}).get("dest_on_tmpfs") else "")
    lines += ["", METHOD.format(
        p5_dest=p5_dest, p3_writers=(f"{int(b.p.get('p3_writer_threads', 0))} writer threads" if 0 < int(b.p.get("p3_writer_threads", 0))
                    < b.p["p3_streams"] else "a writer thread per file"), p3_files=b.p["p3_streams"], p3_two_writers=(" A diagnostic run makes the same writes from 2 threads (`--writer-threads 2`), each "
                        "writing its share back to back." if b.p.get("p3_two_writers") else ""),
        p6_settle=(f" Each run, tailflight's or a loop's, starts {b.p['p6_settle_s']} s after the suite last deleted "
                   "files, and after a sync: on ext4 without a journal (this disk) the inode allocator tests every "
                   "inode freed in the last 5–35 s before it reuses one, so creating files right after a run's files "
                   "were deleted measured that scan (75% of the sink's CPU in one profile, 2026-11-24)."
                   if b.p.get("p6_settle_s") else ""),
        ncpu=meta["nproc"], mem=f"{meta['mem_gib']:.0f}", kernel=meta["kernel"], shm=b.shm, work=b.work,
        fs=b.results["scenarios"].get("ceilings", {}).get("disk_fs", fs_type(b.work)), rate=b.p["p4_rate"],
        runs_note=(f"Comparisons use medians of {b.p['runs']} runs of tailflight and "
                   f"{b.p['peer_runs']} of each P3 peer, interleaved (a tailflight run, then one of each peer)."
                   if not b.quick else "Quick mode: one run each, tiny sizes: the figures only prove the "
                   "suite works."))]
    lines += ["## Limits", "",
              "- Loopback TCP and a veth are not a NIC: no interrupts, no wire; the TCP ceiling is memory bandwidth.",
              "- The delay line emulates RTT only (no loss, jitter or reordering) and costs CPU on the same 2 cores. "
              "It buffers without bound, so the kernel's TCP windows never see the RTT: only tailflight's own "
              "windows (32 MiB in flight per connection, HTTP/2 64 MiB) do. At 2 Gbit/s × 120 ms (30 MB in flight) "
              "one connection's window already suffices, so P4 cannot show what several connections gain on a real "
              "long link whose TCP buffers are capped.",
              "- tbf shapes at the veth; bursts of up to 2 MB pass at once.",
              "- Sources on tmpfs favour the watcher (reads never wait for a disk); a real DAQ disk adds its own limits.",
              "- P3's measurement logs are kept off the sink's disk, and each P3 run waits for a quiet disk; on a disk "
              "other writers share, their writeback delays the sink's fdatasyncs, and a stalled device stalls every "
              "commit (see Method).",
              "- P3 write times are taken by the simulator after write() returns; a writer thread can be descheduled "
              "before it reads the clock (more often with a thread per file, 100 threads on 2 cores), so a few writes "
              "show latencies near or below 0 (`nonpositive` in the JSON) and some are slightly underestimated.",
              "- Peers (rsync, lsyncd) never fsync: they are credited when bytes reach the page cache, tailflight only "
              "when they are durable and recorded.",
              "- The 2 cores are shared by the writer, the watcher, the sink, the peers and the measuring tools.",
              ""]
    text = "\n".join(lines)
    (out / f"{stem}.md").write_text(text)
    (out / f"latest{suffix}.md").write_text(text)
    say(f"\nwrote {out / (stem + '.md')}, {stem}.json, latest{suffix}.md and {len(plots)} plot(s)")
    say("\n" + "\n".join(lines[4:4 + 2 + len(b.rows)]))
