"""P5: many files growing slowly (one append per file per second, from writers.p5_writer): no byte
missed, the watcher's peak RSS and its CPU per 1,000 files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ..config import ENTRY, TARGETS, MiB
from ..formatting import cpu_line, fmt, met_le
from ..harness import Bench, Pipeline, dir_bytes, rmtree, say, trouble_note, wait_commits


def scenario_p5(b: Bench):
    n, secs = b.p["p5_files"], b.p["p5_seconds"]
    say(f"[P5] {n} files growing slowly: one {b.p['p5_append']}-byte append per file per second for "
        f"{secs}s (one Python writer process, round-robin, paced in 10 ms slots)")
    d = b.fresh("p5")
    src = b.fresh_src("p5", "src")
    os.sync()
    # The sink root is on tmpfs too (its manifest stays on disk): P5's targets concern the watcher, and
    # on a filesystem mounted with `discard` deleting 10k files grown by interleaved synced 4 KiB appends
    # (tens of extents each) takes many minutes afterwards.
    pl = Pipeline(b, d, src, dest_root=b.fresh_src("p5", "dest"))
    try:
        pl.start_watcher()
        time.sleep(1.0)
        writer = subprocess.Popen([sys.executable, str(ENTRY), "_p5writer", "--dir", str(src),
                                   "--files", str(n), "--seconds", str(secs),
                                   "--size", str(b.p["p5_append"])],
                                  stdout=subprocess.PIPE, text=True)
        try:
            created = json.loads(writer.stdout.readline())
            appending = json.loads(writer.stdout.readline())
            cpu0, t0 = pl.watcher.cpu_seconds(), time.monotonic()
            done = json.loads(writer.stdout.readline())
            cpu1, t1 = pl.watcher.cpu_seconds(), time.monotonic()
            writer.wait(timeout=30)
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
        total, nfiles = dir_bytes(src)
        wait_commits(pl.cl, total, 300, "P5 data to arrive", (pl.sink, pl.watcher))
        lag_s = (pl.cl.last_ns - done["done"]) / 1e9
        m = pl.finish(total)
    finally:
        pl.kill_all()
    ok, text = b.verify(src, pl.dest)
    cpu_core = (cpu1 - cpu0) / (t1 - t0) if cpu0 is not None and cpu1 is not None else None
    per_1k = cpu_core / (n / 1000) if cpu_core is not None else None
    m.update({"files": n, "created": created["created"], "seconds": secs, "writer": done, "dest_on_tmpfs": True,
              "verified": ok, "verify_report": None if ok else text,
              "watcher_core_fraction": cpu_core, "watcher_core_fraction_per_1k_files": per_1k,
              "drain_after_last_write_s": lag_s, "appending_ns": appending["appending"]})
    b.results["scenarios"]["P5"] = m
    trouble_note(b, "P5", [m])
    rss = m.get("watcher_rss_mib")
    say(f"[P5] verify {'identical (no missed byte)' if ok else 'DIFFERENT'}; {total / MiB:.0f} MiB in {nfiles} "
        f"files; watcher RSS {fmt(rss, '.0f')} MiB (target ≤{TARGETS['P5_rss_mib']:.0f}); watcher CPU while "
        f"appending {fmt(cpu_core and cpu_core * 100, '.1f')}% of a core = {fmt(per_1k and per_1k * 100, '.2f')}% "
        f"per 1k files; writer max lag {done['max_lag_s'] * 1000:.0f} ms; " + cpu_line(m))
    b.row(id="P5", scenario=f"{n} slowly growing files: no missed byte (verify)",
          figure="identical" if ok else "DIFFERENT", peer="—", ratio=None, target="0 bytes missed",
          met="yes" if ok else "no")
    b.row(id="P5", scenario="… watcher peak RSS (VmHWM)", figure=f"{fmt(rss, '.0f')} MiB", peer="—", ratio=None,
          target=f"≤{TARGETS['P5_rss_mib']:.0f} MiB", met=met_le(rss, TARGETS["P5_rss_mib"]))
    b.row(id="P5", scenario="… watcher CPU per 1k files (share of one core while appending)",
          figure=f"{fmt(per_1k and per_1k * 100, '.2f')}%", peer="—", ratio=None, target="(report)", met="—")
    rmtree(src)
    rmtree(pl.dest_root)
