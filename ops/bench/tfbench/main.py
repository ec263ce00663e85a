"""The command line: parses the arguments, runs the chosen scenarios in order (each one's failure
recorded, not fatal), measures the machine's load per scenario, writes the report, and cleans up.
Also re-renders a saved run's report (--rerender) and dispatches the hidden writer subcommands."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from . import __doc__ as SUITE_DOC
from .analysis import busy_cores
from .config import HERE, REPO, TARGETS
from .harness import Bench, NetNs, Proc, rmtree, say
from .report import write_report
from .scenarios import SCENARIOS
from .writers import creator, p5_writer


def meta(b: Bench) -> dict:
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return {"mode": b.mode, "commit": commit + ("+dirty" if dirty else ""), "nproc": os.cpu_count(),
            "mem_gib": mem_kib / 2**20, "kernel": platform.release(), "loadavg": load,
            "binary": b.bin, "binary_mtime": datetime.datetime.fromtimestamp(os.stat(b.bin).st_mtime).isoformat(
                timespec="seconds"), "params": b.p, "targets": TARGETS, "sink_args": b.sink_args, "watch_args": b.watch_args,
            "started": datetime.datetime.now().isoformat(timespec="seconds"), "log": b.args.log,
            "work": str(b.work), "shm": str(b.shm),
            "tools": {t: tool_version(t) for t in ("iperf3", "fio", "rsync", "lsyncd")}}


def cpu_times():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields[:8]), idle


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def tool_version(tool):
    if not shutil.which(tool):
        return None
    try:
        cp = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=10)
        return (cp.stdout + cp.stderr).strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "?"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_p5writer":
        return p5_writer(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "_creator":
        return creator(sys.argv[2:])
    ap = argparse.ArgumentParser(description=SUITE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one run each (< 5 min)")
    ap.add_argument("--bin", default=os.path.join(os.environ.get(
        "CARGO_TARGET_DIR", os.path.expanduser("~/.cache/tailflight/target")), "debug", "tailflight"))
    ap.add_argument("--work", default=str(HERE / "work"), help="scratch for sinks and peers (disk)")
    ap.add_argument("--shm", default=f"/dev/shm/tfbench-{os.getpid()}", help="scratch for sources (tmpfs)")
    ap.add_argument("--netns", default=f"tfb{os.getpid()}", help="name of the network namespace for P4")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--only", default="", help="comma-separated scenarios, e.g. P1,P3 (ceilings always run with P1)")
    ap.add_argument("--runs", type=int, default=0, help="override the number of runs per comparison")
    ap.add_argument("--peer-runs", type=int, default=0, help="override the runs per P3 peer")
    ap.add_argument("--log", default="warn", help="TAILFLIGHT_LOG of sink, watcher, simulator")
    ap.add_argument("--sink-args", default="", help="extra flags for every sink, e.g. \"--sync files\"")
    ap.add_argument("--watch-args", default="", help="extra flags for every watcher")
    ap.add_argument("--rerender", metavar="JSON", help="only rewrite the report and plots of a saved run")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a size parameter of the mode, e.g. --set p3_seconds=20 (see MODES)")
    args = ap.parse_args()

    if args.rerender:
        data = json.loads(Path(args.rerender).read_text())
        args.quick = data["meta"]["mode"] == "quick"
        b = Bench(args)
        b.p = data["meta"]["params"]
        b.work = Path(data["meta"].get("work", b.work))
        b.shm = Path(data["meta"].get("shm", b.shm))
        p4 = data["scenarios"].get("P4") or {}
        for series in (p4.get("medians") or {}).values():  # JSON turned the RTT keys into strings
            for k in list(series):
                series[int(k)] = series.pop(k)
        b.results, b.rows, b.notes = data, data.get("rows", []), data.get("notes", [])
        write_report(b, None)
        return 0
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"no tailflight binary at {args.bin}: run ops/bench/run.sh or cargo build")
    b = Bench(args)
    b.work.mkdir(parents=True, exist_ok=True)
    b.shm.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    b.results["meta"] = meta(b)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    only = {s.strip().upper() for s in args.only.split(",") if s.strip()}
    if "P2" in only:
        only.add("P1")
    if "P1" in only:
        only.add("CEILINGS")
    failed = False
    say(f"tailflight benchmarks, {b.mode} mode; binary {b.bin}; scratch {b.work} and {b.shm}")
    try:
        for name, fn in SCENARIOS:
            if only and name.upper() not in only:
                continue
            t = time.monotonic()
            busy0, load0 = cpu_times(), loadavg()
            try:
                fn(b)
            except KeyboardInterrupt:
                raise
            except Exception as e:
                failed = True
                b.results["errors"][name] = f"{type(e).__name__}: {e}"
                say(f"[{name}] FAILED: {e}")
                traceback.print_exc()
            finally:
                Proc.stop_all()
                b.prune_made()
            b.results.setdefault("durations_s", {})[name] = time.monotonic() - t
            busy = busy_cores(busy0, cpu_times(), os.cpu_count() or 1)
            if busy is not None:
                b.results.setdefault("machine", {})[name] = {
                    "busy_cores": busy,
                    "loadavg_start": load0, "loadavg_end": loadavg(), "seconds": time.monotonic() - t}
            say(f"[{name}] took {time.monotonic() - t:.0f}s")
        write_report(b, started)
    finally:
        Proc.stop_all()
        if b.netns_up:
            NetNs(b.netns, "").down()
        rmtree(b.shm)
    say(f"suite runtime {(time.monotonic() - started) / 60:.1f} min")
    return 1 if failed else 0
