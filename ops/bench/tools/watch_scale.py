#!/usr/bin/env python3
"""The watcher at scale: 100,000 files in 10,000 directories, inotify vs
fanotify vs poll.

Builds the tree once under /tmp (10,000 directories of 10 files of 1 KiB,
removed at the end, also on failure), then for each mode starts a sink and
`tailflight watch --events MODE` on loopback and measures, from the
watcher's own /api/status:

- discovered: seconds from the watcher's start until it tracks every file;
- committed: ... until the sink has acknowledged every byte (everything
  discovered, opened, read and made durable);
- the watcher's CPU seconds until then and its peak RSS (VmHWM);
- idle CPU: the watcher's CPU over 10 s with nothing changing (what
  hearing of nothing costs: polling stats files, events cost nothing);
- a change: 1 KiB appended to 1,000 files spread over the tree, seconds
  until the sink has acknowledged all of it.

Figures are given per 1,000 files where they scale with the tree. The sink
runs on the same filesystem: with fanotify the watcher also reads (and
drops) the events of the sink's own writes, as it would those of any
process on a busy filesystem.

    python3 ops/bench/tools/watch_scale.py [--dirs 10000] [--files-per-dir 10]
        [--modes inotify,fanotify,poll] [--out results.md]

Needs root for fanotify (CAP_SYS_ADMIN; without it the watcher falls back to
inotify, and the table says so). Every wait is bounded (--timeout).
"""

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

KIB = 1024


def binary() -> Path:
    if os.environ.get("TAILFLIGHT_BIN"):
        return Path(os.environ["TAILFLIGHT_BIN"])
    target = os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache/tailflight/target"))
    return Path(target) / "debug" / "tailflight"


# The sink holds a descriptor per destination directory (10,000 here) beside
# its file cache (about 4 x --max-open-files): more than a default soft limit
# of 1024 allows. The soft limit is raised to the hard one, and the sink's
# file cache kept small (SINK_OPEN_FILES).
SINK_OPEN_FILES = 256


def raise_nofile() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def status(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5) as r:
            return json.load(r)
    except (OSError, ValueError):
        return None


def wait(what: str, timeout: float, condition, every: float = 0.1) -> float:
    """Polls `condition` until true; returns when, fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def build_tree(source: Path, dirs: int, per_dir: int, size: int) -> int:
    payload = bytes(range(256)) * (size // 256)
    for d in range(dirs):
        sub = source / f"g{d // 100:03d}" / f"d{d:05d}"
        sub.mkdir(parents=True)
        for f in range(per_dir):
            (sub / f"f{f:02d}.dat").write_bytes(payload)
    return dirs * per_dir * size


def run_mode(mode: str, tf: Path, scratch: Path, source: Path, files: int, total: int,
             change_files: list[Path], timeout: float) -> dict:
    work = scratch / mode
    work.mkdir()
    port, metrics = free_port(), free_port()
    logs = []
    sink_log = open(work / "sink.log", "w")
    watch_log = open(work / "watch.log", "w")
    logs += [sink_log, watch_log]
    sink = subprocess.Popen(
        [str(tf), "sink", "--root", str(work / "dest"), "--state", str(work / "sink-state"),
         "--listen", f"127.0.0.1:{port}", "--max-open-files", str(SINK_OPEN_FILES)],
        stdout=sink_log, stderr=subprocess.STDOUT, preexec_fn=raise_nofile)
    watcher = None
    try:
        wait("the sink's port", 60, lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0)
        started = time.monotonic()
        watcher = subprocess.Popen(
            [str(tf), "watch", "--dir", str(source), "--source", "scale", "--to", f"http://127.0.0.1:{port}",
             "--state", str(work / "watch-state"), "--events", mode, "--seal-idle", "1h",
             "--metrics-listen", f"127.0.0.1:{metrics}"],
            stdout=watch_log, stderr=subprocess.STDOUT, preexec_fn=raise_nofile)

        def source_status():
            s = status(metrics)
            return s["sources"][0] if s else None

        def tracks_all():
            s = source_status()
            return s is not None and s["tracked_files"] >= files

        discovered = wait("every file tracked", timeout, tracks_all) - started
        committed_at = wait("every byte committed", timeout,
                            lambda: (source_status() or {}).get("committed_bytes", 0) >= total, every=0.05)
        committed = committed_at - started
        cpu_startup = cpu_seconds(watcher.pid)
        discovery = (source_status() or {}).get("discovery", {})

        idle_s = 10.0
        cpu_before = cpu_seconds(watcher.pid)
        time.sleep(idle_s)
        idle_cpu = (cpu_seconds(watcher.pid) - cpu_before) / idle_s

        before = source_status()["committed_bytes"]
        appended = 0
        t0 = time.monotonic()
        for path in change_files:
            with open(path, "ab") as f:
                f.write(b"x" * KIB)
            appended += KIB
        change = wait("the appends committed", timeout,
                      lambda: (source_status() or {}).get("committed_bytes", 0) >= before + appended,
                      every=0.02) - t0
        return {
            "mode": mode,
            "events_in_use": discovery.get("events", "?"),
            "watched_directories": discovery.get("watched_directories"),
            "unwatched_directories": discovery.get("unwatched_directories"),
            "discovered_s": discovered,
            "committed_s": committed,
            "cpu_startup_s": cpu_startup,
            "peak_rss_mib": hwm_mib(watcher.pid),
            "idle_cpu_per_s": idle_cpu,
            "change_s": change,
            "change_files": len(change_files),
            "sink_peak_rss_mib": hwm_mib(sink.pid),
        }
    finally:
        for proc in (watcher, sink):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for log in logs:
            log.close()


def report(results: list[dict], args, files: int, build_s: float) -> str:
    k = files / 1000
    lines = [
        f"| mode | in use | dirs watched | discovered (s) | all committed (s) | watcher CPU to commit (s) "
        f"| CPU per 1k files (ms) | peak RSS (MiB) | RSS per 1k files (MiB) | idle CPU per 1k files (ms/s) "
        f"| {results[0]['change_files'] if results else 0} appends committed (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['mode']} | {r['events_in_use']} | {r['watched_directories']} "
            f"(+{r['unwatched_directories']} unwatched) | {r['discovered_s']:.2f} | {r['committed_s']:.2f} "
            f"| {r['cpu_startup_s']:.2f} | {1000 * r['cpu_startup_s'] / k:.1f} | {r['peak_rss_mib']:.0f} "
            f"| {r['peak_rss_mib'] / k:.2f} | {1000 * r['idle_cpu_per_s'] / k:.2f} | {r['change_s']:.2f} |")
    lines.append("")
    lines.append(f"Tree: {args.dirs} directories x {args.files_per_dir} files x {args.size} B "
                 f"({files} files) built in {build_s:.1f} s. Sink peak RSS: "
                 + ", ".join(f"{r['mode']} {r['sink_peak_rss_mib']:.0f} MiB" for r in results) + ".")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dirs", type=int, default=10_000)
    parser.add_argument("--files-per-dir", type=int, default=10)
    parser.add_argument("--size", type=int, default=KIB, help="bytes per file")
    parser.add_argument("--modes", default="inotify,fanotify,poll")
    parser.add_argument("--timeout", type=float, default=900, help="bound of every wait, seconds")
    parser.add_argument("--scratch", default="/tmp", help="where the tree and the sinks go")
    parser.add_argument("--out", help="also write the table (markdown) and the raw figures (JSON, beside it)")
    args = parser.parse_args()
    tf = binary()
    if not tf.exists():
        raise SystemExit(f"{tf} is missing: cargo build first (or set TAILFLIGHT_BIN)")
    scratch = Path(args.scratch) / f"tf-watch-scale-{os.getpid()}"
    scratch.mkdir()
    try:
        source = scratch / "source"
        t0 = time.monotonic()
        total = build_tree(source, args.dirs, args.files_per_dir, args.size)
        build_s = time.monotonic() - t0
        files = args.dirs * args.files_per_dir
        print(f"tree: {files} files in {args.dirs} directories, {build_s:.1f} s", flush=True)
        step = max(1, args.dirs // 1000)
        change_files = [source / f"g{d // 100:03d}" / f"d{d:05d}" / "f00.dat" for d in range(0, args.dirs, step)][:1000]
        results = []
        for mode in args.modes.split(","):
            r = run_mode(mode, tf, scratch, source, files, total, change_files, args.timeout)
            total += len(change_files) * KIB
            print(json.dumps(r), flush=True)
            results.append(r)
            shutil.rmtree(scratch / mode, ignore_errors=True)
        table = report(results, args, files, build_s)
        print(table)
        if args.out:
            Path(args.out).write_text(table + "\n")
            Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
