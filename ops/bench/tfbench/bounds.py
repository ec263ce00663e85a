"""The report's "What bounds the figures" section: for each scenario, what this run's own numbers
(CPU per GB or per write, the ceilings, the floor, the diagnostics) say limits the figure."""

from __future__ import annotations

import os

from .analysis import STAGES, median, ratio
from .config import GB, TARGETS
from .formatting import fmt, fmt_mb, fmt_ms
from .harness import Bench
from .scenarios.p1c import TARGET as P1C_TARGET


def p6_ceiling_text(b: Bench, p6: dict) -> str:
    """What the disk allows for P6, so a factor target above it is seen as such."""
    disk = (b.results["scenarios"].get("ceilings") or {}).get("disk")
    peer = p6.get("rsync_files_per_s")
    if not disk or not peer:
        return ""
    most = disk / b.p["p6_size"]
    return (f"The disk ceiling ({fmt_mb(disk)}, fio) caps {b.p['p6_size'] // 1024} KiB files at {most:.0f} "
            f"files/s even with no per-file cost at all, {most / peer:.1f}× the rsync loop: a 10× target is "
            f"beyond this machine's disk. ")


def sink_writes_direct(b: Bench) -> bool:
    """Whether the sink's default (`--direct-min auto`) writes large ranges with O_DIRECT here: on
    ext4, XFS and btrfs, unless the run's sink arguments set --direct-min."""
    fs = str((b.results["scenarios"].get("ceilings") or {}).get("disk_fs", ""))
    overridden = any(a.startswith("--direct-min") for a in b.sink_args)
    return not overridden and fs.split(" ")[0] in ("ext2", "ext3", "ext4", "xfs", "btrfs")


def memory_text(b: Bench, sink_direct: bool) -> str:
    """The machine's rate for new memory, which every byte written into the page cache pays.
    `sink_direct`: this scenario's ranges are large enough for the sink to write their aligned middle
    with O_DIRECT (see sink_writes_direct), so only the writer's source takes new memory."""
    c = b.results["scenarios"].get("ceilings") or {}
    first, again = c.get("memory_first_touch"), c.get("memory_rewrite")
    reporting = any(f.get("free_page_reporting") for f in c.get("memory_fill_runs") or [])
    if not first or not again:
        return ""
    where = ("Each byte also lands in new memory in the writer's tmpfs source (the sink writes these large "
             "ranges' aligned middle with O_DIRECT, past the page cache)" if sink_direct else
             "Each byte also lands twice in new memory, the writer's tmpfs source and the page cache of "
             "the sink's files")
    return (f" {where}: this machine fills memory it has not touched lately at {fmt_mb(first)} and the "
            f"same pages again at {fmt_mb(again)} (dd, ceilings; new pages cost "
            f"{again / first:.1f}× a rewrite"
            + ("; this VM's balloon device reports freed pages to the host, which must back them again when "
               "they are reused)." if reporting else ").")
            + (f" The disk itself takes {fmt_mb(c['disk_direct'])} with O_DIRECT (fio, no page cache), "
               f"{c['disk_direct'] / c['disk']:.1f}× what it takes through the page cache (the disk ceiling above)."
               if c.get("disk_direct") and c.get("disk") else ""))


def p1c_goal_text(movers: dict, target: float) -> str:
    """Whether P1c's goal (the pipeline's CPU per GB within `target` times the bare copy floor's) is
    within reach of any mover that keeps the pipeline's transport and checks: the floor that copies on
    Arrow Flight's transport (HTTP/2) and makes and verifies the pipeline's checksums is measured in
    the same run, and when it alone costs more than `target` times the bare copy, so must the
    pipeline. Empty when the run lacks those floors. `movers`: P1c's summary, by mover name."""
    def cost(name: str):
        return (movers.get(name) or {}).get("process_cpu_s_per_gb")

    said = []
    for mode, suffix in (("plaintext", ""), ("TLS", " TLS")):
        bare, checked = cost(f"copy floor{suffix}"), cost(f"HTTP/2 copy floor{suffix}, checksummed")
        ours = cost(f"pipeline{suffix}")
        floor_ratio, ours_ratio = ratio(checked, bare), ratio(ours, checked)
        if floor_ratio is None or ours_ratio is None:
            continue
        said.append((mode, floor_ratio, ours_ratio))
    if not said:
        return ""
    beyond = [mode for mode, floor_ratio, _ in said if floor_ratio > target]
    parts = "; ".join(f"{mode}: that floor {fr:.2f}× the bare copy, the pipeline {orr:.2f}× that floor"
                      for mode, fr, orr in said)
    verdict = (f"the goal of {target}× the bare copy is out of reach in {' and '.join(beyond)} for any mover "
               f"that keeps Arrow Flight's transport and checks every byte, as the pipeline must"
               if beyond else f"that floor is within the goal's {target}× of the bare copy here: the goal is within "
               f"reach of such a mover")
    return (f"- **P1c**: the copy on Arrow Flight's transport (HTTP/2) that makes and verifies the pipeline's "
            f"checksums, measured in this run ({parts}): {verdict}.")



def p3_goal_text(p3: dict, factor: float) -> str:
    """What bounds P3's p50 goal (`factor` × the floor's): the floor on Arrow Flight's wire, which checks its bytes
    and acks its rounds but keeps no manifest, set beside the floor and beside tailflight."""
    fm, am = p3.get("floor_medians") or {}, p3.get("flight_floor_medians") or {}
    if not fm.get("p50_ms") or not am.get("p50_ms"):
        return ""
    over = ratio(am["p50_ms"], fm["p50_ms"])
    text = (f"The same ranges as Arrow record batches in one Arrow Flight DoPut call (`floor --flight --place`: "
            f"the wire the issue keeps, through arrow-flight's own encoder and decoder) have p50 "
            f"{fmt_ms(am['p50_ms'])} ({fmt(over, '.2f')}× the floor), and tailflight's p50 is "
            f"{fmt(ratio(p3.get('p50_ms'), am['p50_ms']), '.2f')}× it")
    if over is not None and over > factor:
        return (text + f": a mover on Arrow Flight's wire that checks its bytes and acks its rounds is past the "
                       f"{factor}× goal before it keeps a manifest, so the goal is out of reach on this machine. ")
    return text + f", within the {factor}× goal of the floor. "

def bounds_analysis(b: Bench) -> list[str]:
    """What bounds each missed target, from the numbers of this run."""
    sc = b.results["scenarios"]
    out = []
    ncpu = os.cpu_count() or 1
    if "P1" in sc and "P2" in sc:
        c1 = median([(r["watcher_cpu_s_per_gb"] or 0) + (r["sink_cpu_s_per_gb"] or 0) for r in sc["P1"]["runs"]])
        c2 = median([(r["watcher_cpu_s_per_gb"] or 0) + (r["sink_cpu_s_per_gb"] or 0) for r in sc["P2"]["runs"]])
        if c1 and c2:
            text = (f"- **P2 vs P1**: mutual TLS costs {c2:.2f} instead of {c1:.2f} CPU s/GB (watcher + sink, "
                    f"+{(c2 / c1 - 1) * 100:.0f}%); on a CPU-bound machine that alone predicts a ratio of "
                    f"{c1 / c2:.2f} (measured {fmt(ratio(sc['P2']['median_bytes_per_s'], sc['P1']['median_bytes_per_s']), '.2f')}).")
            aes = (sc.get("ceilings") or {}).get("cipher")
            sim1 = median([r.get("sim_cpu_s_per_gb") for r in sc["P1"]["runs"]])
            if aes:
                cipher = GB / aes["seal_bytes_per_s"] + GB / aes["open_bytes_per_s"]
                text += (f" The cipher alone (AES-128-GCM from aws-lc, as rustls runs it, one core: seal "
                         f"{aes['seal_bytes_per_s'] / 1e9:.1f} GB/s, open {aes['open_bytes_per_s'] / 1e9:.1f} GB/s) "
                         f"costs {cipher:.2f} CPU s/GB, encrypting at the watcher and decrypting at the sink; TLS "
                         f"added {c2 - c1:.2f} s/GB in all"
                         + ("; the rest is rustls's own work per record (a profile of an 8 GiB run, 2026-11-24: at "
                            "the sink its copies out of the read buffer, into a plaintext queue and out to HTTP/2 "
                            "are ~7% of the sink's samples, decryption ~7%; at the watcher encryption is ~8%; "
                            "kernel TLS, which would save the copies, is not in this kernel)." if c2 - c1 > 1.2 * cipher else
                            ", about the cipher's cost." if c2 - c1 >= 0.8 * cipher else
                            ", less than the cipher's own cost: the runs' spread is larger than it."))
                if sim1:
                    whole = c1 + sim1
                    text += (f" With the simulator's {sim1:.2f} s/GB, the plaintext pipeline takes {whole:.2f} "
                             f"CPU s/GB on these shared cores; adding only the cipher's {cipher:.2f} leaves at most "
                             f"{whole / (whole + cipher):.2f} of the plaintext rate while the run is CPU-bound.")
            out.append(text)
    for key, label in (("P1", "P1"), ("P2", "P2")):
        if key not in sc:
            continue
        runs = sc[key]["runs"]
        wall = median([r["seconds"] for r in runs])
        cpu = median([(r["watcher_cpu_s"] or 0) + (r["sink_cpu_s"] or 0) for r in runs])
        w = median([r["watcher_cpu_s_per_gb"] for r in runs])
        s = median([r["sink_cpu_s_per_gb"] for r in runs])
        v = sc[key]["median_bytes_per_s"]
        if wall and cpu is not None and w is not None and s is not None:
            busy = cpu / wall
            cap = GB / (w + s) * ncpu / 1e6
            sim_s = median([r.get("sim_seconds") for r in runs])
            out.append(f"- **{label}**: watcher + sink used {busy:.2f} of {ncpu} cores on average over the "
                       f"{wall:.1f}s run ({w:.2f} + {s:.2f} CPU s/GB); at that cost {ncpu} cores could carry at most "
                       f"≈{cap:.0f} MB/s with nothing else running; measured {v / 1e6:.0f} MB/s. During the first "
                       f"{fmt(sim_s, '.1f')}s the simulator itself writes the data into tmpfs with 16 threads on the "
                       f"same cores (the throughput plot shows the sink's rate climbing once it is done). "
                       + ("Watcher + sink alone kept the cores busy: the figure is CPU-bound on this machine."
                          if busy > 0.75 * ncpu else
                          "So the figure is bounded by the CPU shared with the writer on this 2-core machine rather "
                          "than by the disk or TCP ceilings, which it stays well below.")
                       + memory_text(b, sink_direct=sink_writes_direct(b)))
    if "P3" in sc and sc["P3"].get("p99_ms") is not None:
        p3 = sc["P3"]
        fl = (sc.get("ceilings") or {}).get("fdatasync")
        runs = p3["tailflight"]
        wus = median([r["cpu_us_per_write"]["watcher"] for r in runs])
        sus = median([r["cpu_us_per_write"]["sink"] for r in runs])
        simus = median([r["cpu_us_per_write"].get("simulator") for r in runs])
        rate = b.p["p3_streams"] * b.p["p3_rate"]
        l0 = (p3.get("linger0") or [{}])[0]
        text = (f"- **P3**: p50 {fmt_ms(p3['p50_ms'])}, p99 {fmt_ms(p3['p99_ms'])}, p99.9 {fmt_ms(p3.get('p999_ms'))}. "
                f"Each write is tailed (inotify, pread), batched (linger 300 µs by default), sent, placed (pwrite), "
                f"made durable by a group commit (for a round of small ranges, one write of the ranges into the "
                f"sink's journal file while the round's RocksDB WriteBatch is built, then one write of that batch "
                f"after them and one fdatasync, while RocksDB applies the batch unsynced; their files a "
                f"background flush makes durable within 400 ms) and recorded. ")
        fm = p3.get("floor_medians")
        if fm and fm.get("p50_ms"):
            text += (f"The machine's floor on the same workload (`tailflight floor`, which does no more than "
                     f"inotify, pread, one TCP message and a ring-file write + fdatasync per round) is p50 "
                     f"{fmt_ms(fm['p50_ms'])}, p99 {fmt_ms(fm['p99_ms'])}: tailflight's p50 is "
                     f"{fmt(ratio(p3['p50_ms'], fm['p50_ms']), '.1f')}× it"
                     + (", and the p50 target is below it on this machine. " if fm["p50_ms"] > TARGETS["P3_p50_ms"]
                        else ". "))
        gm = p3.get("placing_floor_medians")
        if gm and gm.get("p50_ms") and fm and fm.get("p50_ms"):
            text += (f"With each range also written into its own file beside the ring's write and fdatasync "
                     f"(`floor land --place`), the floor's p50 is {fmt_ms(gm['p50_ms'])} "
                     f"({fmt(ratio(gm['p50_ms'], fm['p50_ms']), '.2f')}× the floor): placement written beside "
                     f"the durable write costs that much, where the sink places a batch before its round. ")
        hm = p3.get("h2_floor_medians")
        if hm and hm.get("p50_ms") and fm and fm.get("p50_ms"):
            text += (f"The placing floor over one HTTP/2 stream, with a CRC32C per range checked on landing and an "
                     f"ack per round (`floor --http2 --place`: Arrow Flight's transport without Arrow), has p50 "
                     f"{fmt_ms(hm['p50_ms'])} ({fmt(ratio(hm['p50_ms'], fm['p50_ms']), '.2f')}× the floor), and "
                     f"tailflight's p50 is {fmt(ratio(p3['p50_ms'], hm['p50_ms']), '.2f')}× it. ")
        text += p3_goal_text(p3, TARGETS["P3_p50_floor_factor"])
        paired = sorted((r["sink_cpu_s"], r["p50_ms"]) for r in runs
                        if r.get("sink_cpu_s") is not None and r.get("p50_ms") is not None)
        if len(paired) > 1:
            text += ("Run by run, p50 and the sink's CPU seconds for the same writes (the same work takes "
                     "more CPU time when other load shares the machine): "
                     + ", ".join(f"{fmt_ms(p50)} with {cpu:.2f} s" for cpu, p50 in paired) + ". ")
        ways = [r["way_there"] for r in runs if r.get("way_there")]
        if ways:
            way50 = median([w["p50_ms"] for w in ways])
            way99 = median([w["p99_ms"] for w in ways])
            text += (f"Split by the time each batch reached the sink (the commit log's 7th column): write → sink "
                     f"p50 {fmt_ms(way50)}, p99 {fmt_ms(way99)}; the rest, about "
                     f"{fmt_ms(p3['p50_ms'] - way50 if way50 is not None else None)} at p50, is placement and commit. ")
        bursts = [r["sim_burst"] for r in runs if r.get("sim_burst")]
        if bursts:
            text += (f"The simulator's {b.p['p3_streams']} streams tick together: each tick is a burst of "
                     f"{bursts[0]['size_p50']} writes that the {ncpu} cores take "
                     f"{fmt_ms(median([x['width_p50_ms'] for x in bursts]))} (p50) to issue, while the watcher "
                     f"and the sink share those cores"
                     + (", so the way to the sink alone takes half the 2 ms budget. "
                        if ways and way50 is not None and way50 >= 1.0 else ". "))
        ticks = [r["ticks"] for r in runs if r.get("ticks")]
        if ticks:
            span = median([x["span_p50_ms"] for x in ticks])
            per_tick_cpu = (wus + sus) * bursts[0]["size_p50"] / 1000 if bursts and wus and sus else None
            head = median([x["first_tenth_p50_ms"] for x in ticks])
            tail = median([x["last_tenth_p50_ms"] for x in ticks])
            text += (f"By a write's place in its burst: p50 {fmt_ms(head)} for the first tenth of a burst's "
                     f"writes, {fmt_ms(tail)} for the last"
                     + (" (the last wait no longer than the first, so the writes do not queue one behind "
                        "another). " if head and tail and tail <= head else ". ")
                     + f"A burst lasts {fmt_ms(span)} (p50) from its first write to its last commit. ")
            if per_tick_cpu is not None and span:
                share = per_tick_cpu / (span * ncpu)
                text += (f"The watcher and the sink use {fmt_ms(per_tick_cpu)} of CPU per burst on average (their "
                         f"CPU per write, background work included, times {bursts[0]['size_p50']} writes): "
                         f"{share:.0%} of what {ncpu} cores give in a burst's length, before the simulator's own "
                         f"writes. ")
        if fl:
            text += (f"One 4 KiB write + fdatasync takes p50 {fl['p50_ms']:.3f} ms, p99 {fl['p99_ms']:.3f} ms here "
                     f"when the disk is otherwise idle, but flushing a file that grew also commits its new size and "
                     f"blocks, one metadata update per file, whereas the journal file is pre-written, so its "
                     f"fdatasync is only a data write and a cache flush. ")
        def round_text(rs: list[dict], who: str) -> str:
            rs = [r for r in rs if r]
            if not rs:
                return ""
            g = lambda k: median([r.get(k, 0) for r in rs]) / 1000  # noqa: E731
            return (f"{who}: {median([r['rounds'] for r in rs]):.0f} rounds, "
                    f"{100 * median([r['journaled_share'] for r in rs]):.0f}% journaled; per round (medians) "
                    f"file flushes {g('sync_us'):.2f} ms, building and writing the manifest batch "
                    f"{g('manifest_us'):.2f} ms, then the journal's batch write + fdatasync "
                    f"{g('journal_us'):.2f} ms, whole round {g('total_us'):.2f} ms; a batch's arrival to its "
                    f"round's start {g('waited_us'):.2f} ms"
                    + (f", of which placement {g('placing_us'):.2f} ms" if all("placing_us" in r for r in rs) else ""))
        measured = [round_text([r.get("rounds") for r in runs], "default")]
        if p3.get("journal"):
            measured.append(round_text([r.get("rounds") for r in p3["journal"]], "`--journal-max-range 0`"))
        measured = [m for m in measured if m]
        if measured:
            text += ("The sink's commit-round trace (sink::commit=debug) of these runs: " + "; ".join(measured)
                     + ". A batch arriving during a round waits for it, then for its own. ")
        if wus is not None and sus is not None:
            threads = int(b.p.get("p3_writer_threads", 0)) or b.p["p3_streams"]
            text += (f"CPU per 4 KiB write: watcher {wus:.0f} µs, sink {sus:.0f} µs, i.e. "
                     f"{(wus + sus) * rate / 1e6:.2f} cores at {rate:.0f} writes/s on a {ncpu}-core machine that also "
                     f"runs the simulator ("
                     + ("a writer thread per file" if threads >= b.p["p3_streams"]
                        else f"{threads} writer threads for {b.p['p3_streams']} files")
                     + (f", {simus:.0f} µs per write" if simus is not None else "") + "). ")
            staged = [(r["rounds"]["stage_cpu_s"], r["writes"]) for r in runs
                      if (r.get("rounds") or {}).get("stage_cpu_s") and r.get("writes")]
            if staged:
                per = {k: median([c[k] / n * 1e6 for c, n in staged]) for k in STAGES}
                text += (f"The sink's own clocks (each stage's thread CPU time, summed; medians per write): placing "
                         f"(every write into files included) {per['place']:.1f} µs, "
                         f"commit rounds (records, manifest write) {per['round']:.1f} µs, the journal thread (its "
                         f"writes and fdatasyncs) {per['journal']:.1f} µs; the other "
                         f"{max(sus - sum(per.values()), 0):.1f} µs are receiving, decoding and acknowledging on the "
                         f"async runtime, hand-offs between threads, and RocksDB's background work. ")
        if l0.get("p50_ms") is not None:
            diff = p3["p50_ms"] - l0["p50_ms"]
            text += (f"With `--linger 0ms` p50 is {fmt_ms(l0['p50_ms'])} and p99 {fmt_ms(l0['p99_ms'])} (one run)"
                     + (f": the linger accounts for about {fmt_ms(diff)} of the p50 (watcher CPU per GB "
                        f"{fmt(median([r['watcher_cpu_s_per_gb'] for r in runs]), '.1f')} s with the linger, "
                        f"{fmt(l0.get('watcher_cpu_s_per_gb'), '.1f')} s without). "
                        if diff > 0 else ": no measurable difference at this load. "))
        two = p3.get("two_writers") or []
        t50 = median([r.get("p50_ms") for r in two])
        t99 = median([r.get("p99_ms") for r in two])
        per_file = int(b.p.get("p3_writer_threads", 0)) in (0, b.p["p3_streams"])
        if t50 is not None and p3.get("p50_ms") is not None and per_file:
            fus = median([(r.get("cpu_us_per_write") or {}).get("simulator") for r in two])
            text += (f"With the same writes made by 2 writer threads instead of one per file, p50 is "
                     f"{fmt_ms(t50)} and p99 {fmt_ms(t99)} ({len(two)} run{'s' if len(two) > 1 else ''})"
                     + (f", with the writer taking {fus:.0f} µs of CPU per write instead of {simus:.0f}"
                        + (" (a thread per file spends the difference waking its threads)" if fus < simus else "")
                        if fus is not None and simus is not None else ""))
            if t50 > 1.1 * p3["p50_ms"]:
                text += ": p50 is higher with fewer writer threads. "
            elif t50 >= 0.9 * p3["p50_ms"]:
                text += ": the writer's CPU on the shared cores is not what sets the p50. "
            else:
                text += (f": the writer's wake-ups cost the pipeline about {fmt_ms(p3['p50_ms'] - t50)} of p50 on "
                         f"the shared cores. ")
        rot = p3.get("rotating") or []
        if rot and rot[0].get("p50_ms") is not None:
            r = rot[0]
            text += (f"With every file rotating to a new chunk at the same moment ({r.get('label')}; each rotation "
                     f"renames all {b.p['p3_streams']} files and creates as many), p50 is {fmt_ms(r['p50_ms'])}, p99 "
                     f"{fmt_ms(r['p99_ms'])}, p99.9 {fmt_ms(r['p999_ms'])} and the max {fmt_ms(r['max_ms'])} (one run): "
                     f"a run of renames records all its intents with one synced manifest write, a round that only "
                     f"moves files fsyncs their directory and still journals, and the new files are flushed by the "
                     f"rounds that create them. ")
        mach = (b.results.get("machine") or {}).get("P3")
        if mach:
            text += (f"The whole machine was {mach['busy_cores']:.2f} of {ncpu} cores busy during P3 (load average "
                     f"{mach['loadavg_start']:.1f} → {mach['loadavg_end']:.1f})"
                     + ("; with other jobs competing for the 2 cores latency rises sharply (queueing in the tailer "
                        "and the commit rounds)." if mach["busy_cores"] > 0.6 * ncpu or mach["loadavg_end"] > ncpu
                        else "."))
        out.append(text)
    if "P6" in sc:
        p6 = sc["P6"]
        runs = p6["tailflight"]
        w = median([r["watcher_cpu_s"] for r in runs])
        s = median([r["sink_cpu_s"] for r in runs])
        wall = median([r["seconds"] for r in runs])
        n = median([r["files"] for r in runs])
        if w is not None and s is not None and wall and n:
            out.append(f"- **P6**: per file the watcher spent {w / n * 1e6:.0f} µs CPU and the sink "
                       f"{s / n * 1e6:.0f} µs ({(w + s) / wall:.2f} cores busy); each new file costs the sink a "
                       f"confined create (openat per path component), a pwrite, its share of a round's syncfs, "
                       f"manifest records and a seal (CRC-64 of the bytes as written), and the "
                       f"watcher an open, a read, a checksum and a seal: about {(w + s) / n * 1e6:.0f} µs of CPU per file "
                       f"on {ncpu} cores, the bound on files/s here (a perf profile of a 60000-file run puts about "
                       f"half of the sink's CPU in the kernel's copy into new page-cache pages, "
                       f"copy_folio_from_iter_atomic, then clearing new pages, HTTP/2, ext4's directory and inode "
                       f"work, and no hot spot in tailflight's own code; but perf on this VM charges stalls to that "
                       f"copy: a test build that first copied each range into a hot buffer took the symbol out of a "
                       f"P3 profile without lowering the sink's CPU).{memory_text(b, sink_direct=False)} "
                       f"Whereas the rsync loop writes into the page "
                       f"cache without any sync (rsync --fsync: "
                       f"{fmt(p6.get('rsync_fsync_files_per_s'), '.0f')} files/s). " + p6_ceiling_text(b, p6) +
                       f"Peak RSS: watcher "
                       f"{fmt(median([r['watcher_rss_mib'] for r in runs]), '.0f')} MiB, sink "
                       f"{fmt(median([r['sink_rss_mib'] for r in runs]), '.0f')} MiB for {n:.0f} files."
                       + (f" The disk took {median([r.get('disk_write_bytes') for r in runs]) / (n * b.p['p6_size']):.2f} "
                          f"bytes per file byte while the files arrived (everything written to the disk meanwhile: the files, RocksDB, the sink's journal, logs and metadata)."
                          if median([r.get("disk_write_bytes") for r in runs]) else ""))
    if "P1c" in sc:
        text = p1c_goal_text(sc["P1c"].get("movers") or {}, P1C_TARGET)
        if text:
            out.append(text)
    if "P4" in sc and sc["P4"].get("medians"):
        p4 = sc["P4"]
        lo, hi = min(p4["rtts"]), max(p4["rtts"])
        runs = p4["runs"]["tf4"]
        first = median([r["first_commit_s"] for r in runs if r["rtt_ms"] == hi])
        first0 = median([r["first_commit_s"] for r in runs if r["rtt_ms"] == lo])
        steady = median([r["steady_bytes_per_s"] for r in runs if r["rtt_ms"] == hi])
        secs = median([r["seconds"] for r in runs if r["rtt_ms"] == hi])
        link = p4.get("link_bytes_per_s")
        text = "- **P4**: "
        if link:
            text += (f"at {lo} ms tailflight carries {p4['medians']['tf4'][lo] / link * 100:.0f}% of the link measured "
                     f"by iperf3 ({fmt_mb(link)}): the tbf rate is the bound. ")
        if first is not None and first0 is not None and secs:
            text += (f"At {hi} ms the first range is recorded {first:.2f}s after the watcher starts (vs {first0:.2f}s "
                     f"at {lo} ms: TCP and HTTP/2 setup and the hello take round trips, then the first window), out of a "
                     f"{secs:.1f}s transfer; from first to last range it moves {fmt_mb(steady)}. The delay line "
                     f"relays every byte in user space on the same cores (`delay_line_cpu_s` in the JSON).")
        out.append(text)
    return out
