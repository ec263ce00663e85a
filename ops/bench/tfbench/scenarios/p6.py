"""P6: many new small files created as fast as one process can (writers.creator): files per second
through tailflight against an rsync loop, and an rsync --fsync loop for information."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..analysis import median, ratio
from ..config import ENTRY, TARGETS
from ..formatting import cpu_line, fmt, met
from ..harness import (Bench, BenchError, Pipeline, commit_rounds, dir_bytes, now_ns, rmtree, rsync_args, say,
                       settle_deletes, trouble_note, wait_commits)


def run_creator(b: Bench, src: Path) -> dict:
    cp = subprocess.run([sys.executable, str(ENTRY), "_creator", "--dir", str(src),
                         "--files", str(b.p["p6_files"]), "--size", str(b.p["p6_size"])],
                        capture_output=True, text=True, timeout=900)
    if cp.returncode != 0:
        raise BenchError(f"creator failed: {cp.stderr[-1000:]}")
    return json.loads(cp.stdout)


def disk_written_bytes() -> int | None:
    """Bytes written so far to the machine's whole disks (/proc/diskstats, 512-byte sectors)."""
    try:
        total = 0
        for line in Path("/proc/diskstats").read_text().splitlines():
            f = line.split()
            if len(f) > 9 and Path(f"/sys/block/{f[2]}/device").exists():
                total += int(f[9]) * 512
        return total
    except (OSError, ValueError):
        return None


def p6_tailflight(b: Bench, i: int) -> dict:
    d = b.fresh("p6", f"tailflight-{i}")
    src = b.fresh_src("p6", f"tailflight-{i}")
    settle_deletes(float(b.p.get("p6_settle_s", 0)))
    # Files are written once and closed: seal them 1 s after the close instead of 60 s, so that
    # each file's seal (final size and digest) falls inside the measured run, as it would in a
    # steady stream of new files.
    pl = Pipeline(b, d, src, watch_extra=["--seal-idle", "1s"], sink_extra=str(b.p.get("p6_sink", "")).split(),
                  trace_rounds=True)
    try:
        pl.start_watcher()
        time.sleep(1.0)
        disk_before = disk_written_bytes()
        c = run_creator(b, src)
        total, nfiles = dir_bytes(src)
        wait_commits(pl.cl, total, 1200, "P6 files to arrive", (pl.sink, pl.watcher))
        disk_after = disk_written_bytes()
        m = pl.finish(total)
    finally:
        pl.kill_all()
    # Everything the disk took while the files arrived: the files, RocksDB, the journal, logs, metadata.
    m["disk_write_bytes"] = disk_after - disk_before if disk_before is not None and disk_after is not None else None
    m["rounds"] = commit_rounds(pl.sink.log_path)
    elapsed = (pl.cl.last_ns - c["start"]) / 1e9
    ok, text = b.verify(src, pl.dest)
    m.update({"files": nfiles, "seconds": elapsed, "files_per_s": nfiles / elapsed,
              "create_files_per_s": nfiles / ((c["end"] - c["start"]) / 1e9), "verified": ok,
              "verify_report": None if ok else text})
    say(f"  tailflight run {i}: {nfiles} files in {elapsed:.2f}s = {nfiles / elapsed:.0f} files/s "
        f"(created at {m['create_files_per_s']:.0f} files/s); verify {'identical' if ok else 'DIFFERENT'}; "
        + cpu_line(m)
        + (f"; the disk took {m['disk_write_bytes'] / total:.2f} bytes per file byte" if m["disk_write_bytes"] and total
           else "")
        + (f"; {100 * m['rounds']['journaled_share']:.0f}% of commit rounds journaled" if m.get("rounds") else ""))
    rmtree(src)
    rmtree(pl.dest_root)
    return m


def p6_rsync(b: Bench, i: int, extra=()) -> dict:
    label = "rsync" + "".join(extra).replace("--", "-")
    d = b.fresh("p6", f"{label}-{i}")
    src = b.fresh_src("p6", f"{label}-{i}")
    dest = d / "dest"
    dest.mkdir()
    settle_deletes(float(b.p.get("p6_settle_s", 0)))
    stop = threading.Event()
    passes: list[tuple[int, int]] = []

    def loop():
        deadline = time.monotonic() + 1200
        while not stop.is_set() and time.monotonic() < deadline:
            t = now_ns()
            subprocess.run([*rsync_args(), *extra, f"{src}/", f"{dest}/"], capture_output=True, timeout=1200)
            passes.append((t, now_ns()))

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        c = run_creator(b, src)
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline and not any(s >= c["end"] for s, _ in passes):
            time.sleep(0.01)
    finally:
        stop.set()
        th.join(timeout=1200)
    done = next((e for s, e in passes if s >= c["end"]), None)
    if done is None:
        raise BenchError("rsync loop did not complete a pass after the files were created")
    elapsed = (done - c["start"]) / 1e9
    ok, text = b.verify(src, dest)
    nfiles = c["files"]
    say(f"  {label} loop run {i}: {nfiles} files in {elapsed:.2f}s = {nfiles / elapsed:.0f} files/s "
        f"({len(passes)} passes); verify {'identical' if ok else 'DIFFERENT'}")
    rmtree(src)
    rmtree(dest)
    return {"label": label, "files": nfiles, "seconds": elapsed, "files_per_s": nfiles / elapsed,
            "passes": len(passes), "verified": ok}


def scenario_p6(b: Bench):
    n = b.p["p6_files"]
    say(f"[P6] {n} new {b.p['p6_size'] // 1024} KiB files created as fast as possible (1000 per new "
        f"subfolder); {b.p['runs']} run(s) each")
    tf, rs, rsf = [], [], []
    peers = int(b.p.get("p6_peers", 1))  # 0: tailflight alone, for A/B runs
    for i in range(b.p["runs"]):
        tf.append(p6_tailflight(b, i + 1))
        if peers:
            rs.append(p6_rsync(b, i + 1))
    if peers:
        rsf.append(p6_rsync(b, 1, ("--fsync",)))
    v, vr, vf = (median([r["files_per_s"] for r in x]) for x in (tf, rs, rsf))
    r = ratio(v, vr)
    trouble_note(b, "P6", tf)
    b.results["scenarios"]["P6"] = {"tailflight": tf, "rsync": rs, "rsync_fsync": rsf,
                                    "files_per_s": v, "rsync_files_per_s": vr,
                                    "rsync_fsync_files_per_s": vf, "ratio": r}
    say(f"[P6] tailflight {fmt(v, '.0f')} files/s vs rsync loop {fmt(vr, '.0f')} files/s: x{fmt(r, '.2f')} "
        f"(target ≥{TARGETS['P6_factor']:.0f}); rsync --fsync loop {fmt(vf, '.0f')} files/s")
    b.row(id="P6", scenario=f"{n} new {b.p['p6_size'] // 1024} KiB files, files/s vs rsync loop",
          figure=f"{fmt(v, '.0f')} files/s", peer=f"{fmt(vr, '.0f')} files/s", ratio=r,
          target=f"≥{TARGETS['P6_factor']:.0f}×", met=met(r, TARGETS["P6_factor"]))
    b.row(id="P6", scenario="… vs rsync loop with --fsync (durable like the sink)",
          figure=f"{fmt(v, '.0f')} files/s", peer=f"{fmt(vf, '.0f')} files/s", ratio=ratio(v, vf),
          target="(info)", met="—")
