"""P3's peers: an rsync loop and lsyncd (defaults, and delay 0 on every write) copy the same
writer workload; a thread sweeps the destination every ~1 ms and records when each file reached
each size, which is when a write counts as arrived."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from ..analysis import arrival_latencies, cdf_points, latency_summary
from ..config import INPROGRESS
from ..formatting import fmt
from ..harness import (Bench, BenchError, Proc, children_of, now_ns, read_write_log, rmtree, rsync_args, say,
                       settle_disk)
from .p3_workload import p3_sim_args


class SizePoller(threading.Thread):
    """Stats every file of a destination folder every ~1 ms and records when each size first appears."""

    def __init__(self, dest: Path, interval=0.001, limit_s=600):
        super().__init__(daemon=True)
        self.dest = dest
        self.interval = interval
        self.deadline = time.monotonic() + limit_s
        self.stop_flag = threading.Event()
        self.hist: dict[str, tuple[list[int], list[int]]] = {}
        self.sweeps = 0

    def run(self):
        dest = str(self.dest)
        while not self.stop_flag.is_set() and time.monotonic() < self.deadline:
            try:
                with os.scandir(dest) as it:
                    for e in it:
                        name = e.name
                        if name.startswith("."):
                            continue  # rsync temporaries
                        base = name[: -len(INPROGRESS)] if name.endswith(INPROGRESS) else name
                        try:
                            size = e.stat(follow_symlinks=False).st_size
                        except FileNotFoundError:
                            continue
                        t = time.time_ns()
                        h = self.hist.get(base)
                        if h is None:
                            self.hist[base] = ([t], [size])
                        elif size > h[1][-1]:
                            h[0].append(t)
                            h[1].append(size)
            except FileNotFoundError:
                pass
            self.sweeps += 1
            time.sleep(self.interval)

    def reached(self, sizes: dict[str, int]) -> bool:
        for name, size in sizes.items():
            h = self.hist.get(name)
            if h is None or h[1][-1] < size:
                return False
        return True

    def latencies(self, writes) -> tuple[list[float], int]:
        return arrival_latencies(self.hist, writes)


def prefix_identical(src: Path, dest: Path) -> tuple[bool, str]:
    """Every source file has a complete, byte-identical copy at dest (under its name or its .inprogress name)."""
    for entry in os.scandir(src):
        if not entry.is_file():
            continue
        want = entry.stat().st_size
        candidates = [dest / entry.name, dest / (entry.name + INPROGRESS)]
        good = False
        for c in candidates:
            try:
                if c.stat().st_size != want:
                    continue
            except FileNotFoundError:
                continue
            with open(entry.path, "rb") as a, open(c, "rb") as bfile:
                while True:
                    x = a.read(1 << 20)
                    y = bfile.read(1 << 20)
                    if x != y:
                        break
                    if not x:
                        good = True
                        break
            if good:
                break
        if not good:
            return False, f"{entry.name}: no complete identical copy in {dest}"
    return True, ""


def p3_peer(b: Bench, kind: str, delay=None, run=1) -> dict:
    """Same writer workload; a peer copies it; the destination is polled for sizes."""
    label = kind if delay is None else f"{kind}-delay{delay}"
    d = b.fresh("p3", f"{label}-{run}")
    src = b.fresh_src("p3", f"{label}-{run}")
    dest = d / "dest"
    dest.mkdir()
    logs = b.fresh_src("p3-logs", f"{label}-{run}") if int(b.p["p3_logs_tmpfs"]) else d  # as for tailflight
    settled = settle_disk(d, limit_s=float(b.p["p3_settle"])) if float(b.p["p3_settle"]) else None
    stop = threading.Event()
    passes = []
    lsyncd = None
    loop_thread = None
    drain = b.p["p3_peer_drain"]
    poller = SizePoller(dest, limit_s=b.p["p3_seconds"] + drain + 120)
    try:
        if kind == "rsync":
            def loop():
                deadline = time.monotonic() + b.p["p3_seconds"] + drain + 60
                while not stop.is_set() and time.monotonic() < deadline:
                    t = now_ns()
                    subprocess.run([*rsync_args(), f"{src}/", f"{dest}/"], capture_output=True,
                                   timeout=600)
                    passes.append((t, now_ns()))
            loop_thread = threading.Thread(target=loop, daemon=True)
            loop_thread.start()
        else:
            conf = d / "lsyncd.conf.lua"
            # Lowest delay: also react to every write (IN_MODIFY), not only to
            # close-after-write (lsyncd's default, which never fires while a file grows).
            delay_line = "" if delay is None else f"    delay = {delay},\n"
            mode_line = "" if delay is None else '    inotifyMode = "CloseWrite or Modify",\n'
            conf.write_text(
                "settings {\n"
                f'    logfile = "{d}/lsyncd-own.log",\n'
                f'    statusFile = "{d}/lsyncd.status",\n'
                "    nodaemon = true,\n"
                f"{mode_line}"
                "}\n"
                "sync {\n"
                "    default.rsync,\n"
                f'    source = "{src}",\n'
                f'    target = "{dest}",\n'
                f"{delay_line}"
                "    rsync = { archive = true, inplace = true, append_verify = true },\n"
                "}\n")
            lsyncd = Proc("lsyncd", ["lsyncd", conf], d)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if not lsyncd.alive():
                    raise BenchError(f"lsyncd exited: {lsyncd.log_tail()}")
                try:
                    if "finished" in (d / "lsyncd-own.log").read_text():
                        break
                except FileNotFoundError:
                    pass
                time.sleep(0.1)
        poller.start()
        time.sleep(0.5)
        sim = b.sim(logs, "sim", src, *p3_sim_args(b), "--write-log", logs / "writes.log")
        if sim.wait(b.p["p3_seconds"] + 60) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        sizes = {e.name: e.stat().st_size for e in os.scandir(src) if e.is_file()}
        # The end marker is not part of the latency workload.
        sizes = {k: v for k, v in sizes.items() if k.endswith(".xtc2")}
        deadline = time.monotonic() + drain
        while time.monotonic() < deadline and not poller.reached(sizes):
            time.sleep(0.05)
        complete = poller.reached(sizes)
    finally:
        stop.set()
        poller.stop_flag.set()
        if lsyncd is not None:
            kids = children_of(lsyncd.pid)
            lsyncd.stop(10)
            for pid in kids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if loop_thread is not None:
            loop_thread.join(timeout=120)
        poller.join(timeout=5)
    writes = read_write_log(logs / "writes.log")
    if logs != d:
        for log in logs.iterdir():
            shutil.move(log, d / log.name)
    lat, missing = poller.latencies(writes)
    summ = latency_summary(lat, missing)
    ok, why = prefix_identical(src, dest)
    summ.update({"peer": label, "complete": complete, "content_identical": ok, "why": why,
                 "poll_sweeps": poller.sweeps, "rsync_passes": len(passes),
                 "cdf": cdf_points(lat), "disk_settle": settled})
    say(f"  {label}: p50 {fmt(summ['p50_ms'], '.0f')} ms, p99 {fmt(summ['p99_ms'], '.0f')} ms, "
        f"max {fmt(summ['max_ms'], '.0f')} ms; writes never seen at the destination within "
        f"{drain}s: {missing}; content {'identical' if ok else 'DIFFERENT: ' + why}"
        + (f"; {len(passes)} rsync passes" if passes else "")
        + f"; {poller.sweeps} destination sweeps")
    rmtree(src)
    rmtree(dest)
    return summ
