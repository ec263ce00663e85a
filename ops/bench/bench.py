#!/usr/bin/env python3
"""tailflight benchmark suite: scenarios P1-P7 of the benchmark issue.

Every figure is compared with a ceiling or a peer measured in the same run
on the same machine. Writes results/<date>.md, results/<date>.json, the
plots, and results/latest.md (quick mode: the same names with "-quick").

    bench.py [--quick] [--bin PATH] [--only P1,P3] [--runs N]

Python 3.11 standard library, plus matplotlib for the plots (optional: the
suite still runs and writes its tables without it). ops/bench/run.sh sets
everything up; see ops/bench/README.md.
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import json
import math
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
MiB = 1 << 20
GB = 1e9
INPROGRESS = ".inprogress"
SOURCE = "bench"  # --source of every watcher: files land in <root>/bench/
NO_JOURNAL_LABEL = "tailflight, sink --journal-max-range 0"

# Sizes per mode. Full mode follows the issue; quick mode only keeps the
# suite from rotting (< 5 minutes on 2 cores).
MODES = {
    "quick": dict(
        runs=1, peer_runs=1, ceiling_runs=1,
        iperf_seconds=2, fio_mib=256,
        p1_total_mib=256, p1_streams=16, p1_chunk="64MiB",
        p3_streams=20, p3_rate=100.0, p3_seconds=5, p3_peer_drain=40, p3_peers="rsync,lsyncd,lsyncd0",
        p3_linger0=1, p3_journal=0, p3_watch="", p3_sink="", p3_writer_threads=0, p3_two_writers=1,
        p3_rotate_chunk="1MiB", p3_rotate_src_disk=0, p3_logs_tmpfs=1, p3_settle=5, p3_floor=1,
        p4_rtts=[0, 20, 60, 120], p4_total_mib=64, p4_runs=1, p4_rate="2gbit",
        p5_files=1000, p5_seconds=5, p5_append=4096,
        p6_files=2000, p6_size=65536, p6_sink="", p6_settle_s=0, p6_peers=1,
        p7_seconds=8, p7_rate=10.0, p7_kills=3,
    ),
    "full": dict(
        runs=3, peer_runs=3, ceiling_runs=3,
        iperf_seconds=5, fio_mib=2048,
        p1_total_mib=4096, p1_streams=16, p1_chunk="64MiB",
        p3_streams=100, p3_rate=100.0, p3_seconds=60, p3_peer_drain=120, p3_peers="rsync,lsyncd,lsyncd0",
        p3_linger0=1, p3_journal=1, p3_watch="", p3_sink="", p3_writer_threads=0, p3_two_writers=1,
        p3_rotate_chunk="4MiB", p3_rotate_src_disk=1, p3_logs_tmpfs=1, p3_settle=90, p3_floor=1,
        p4_rtts=[0, 20, 60, 120], p4_total_mib=1024, p4_runs=3, p4_rate="2gbit",
        p5_files=10000, p5_seconds=60, p5_append=4096,
        p6_files=100000, p6_size=65536, p6_sink="", p6_settle_s=40, p6_peers=1,
        p7_seconds=20, p7_rate=10.0, p7_kills=3,
    ),
}

TARGETS = {
    "P1_tcp": 0.7, "P1_disk": 0.9, "P2": 0.9,
    "P3_p50_ms": 2.0, "P3_p99_ms": 10.0, "P3_peer_factor": 100.0,
    "P4": 0.9, "P5_rss_mib": 256.0, "P6_factor": 10.0, "P7_resume_s": 1.0,
}


class BenchError(Exception):
    pass


def say(msg: str = "") -> None:
    print(msg, flush=True)


def now_ns() -> int:
    return time.time_ns()


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, timeout: float, proc: "Proc | None" = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise BenchError(f"{proc.name} exited before listening: {proc.log_tail()}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise BenchError(f"nothing listens on {host}:{port} after {timeout}s")


def wait_log(proc: "Proc", text: str, timeout: float) -> None:
    """Waits until the process's output contains text (for servers that a probe connection would disturb)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if text in proc.log_path.read_text(errors="replace"):
                return
        except FileNotFoundError:
            pass
        if not proc.alive():
            raise BenchError(f"{proc.name} exited: {proc.log_tail()}")
        time.sleep(0.02)
    raise BenchError(f"{proc.name} did not print {text!r} within {timeout}s")


def dir_bytes(path: Path) -> tuple[int, int]:
    """(total bytes, number of files) of the regular files under path."""
    total = files = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            total += st.st_size
            files += 1
    return total, files


KEPT_SUFFIXES = {".log", ".json", ".md", ".csv", ".txt"}


LAST_DELETE = [0.0]  # time.monotonic() of the last rmtree that removed anything


def rmtree(path: Path) -> None:
    existed = path.exists()
    shutil.rmtree(path, ignore_errors=True)
    if existed:
        # From the end: deleting 100,000 files can itself take longer than a settle.
        LAST_DELETE[0] = time.monotonic()


def settle_deletes(seconds: float) -> None:
    """Waits until `seconds` have passed since the last deletion, after a sync.

    On ext4 without a journal (this machine's disk) the inode allocator skips
    every free inode deleted in the last 5 s, or 35 s while its inode-table
    block is dirty, testing each one: creating files right after thousands were
    deleted then costs a scan per create. Scenarios that create many files
    wait this out so that they measure creating files, not the previous run's
    deletion."""
    os.sync()
    wait = LAST_DELETE[0] + seconds - time.monotonic()
    if wait > 0:
        time.sleep(wait)


def settle_disk(directory: Path, quiet_s: float = 3.0, limit_s: float = 90.0, stall_ms: float = 10.0) -> dict:
    """Waits, after a sync, until a 4 KiB write + fdatasync in `directory` has
    stayed under `stall_ms` for `quiet_s` seconds (probing every 20 ms), or
    `limit_s` passed. Returns how long it waited and the slowest probe.

    After the suite wrote or deleted gigabytes (P1, a peer's run), this VM's
    disk stops completing writes for 0.3-0.4 s every ~2.4 s, for 10 s and
    more (/proc/diskstats: requests in flight, none completing; 2026-11-25):
    the host writing back what the guest flushed. A latency run started then
    measures those stalls, not the pipeline; each P3 run starts on a quiet
    disk instead, and the wait is reported."""
    os.sync()
    probe = directory / ".disk-probe"
    started = time.monotonic()
    quiet_since = started
    slowest = 0.0
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        block = os.urandom(4096)
        while True:
            t = time.monotonic()
            os.pwrite(fd, block, 0)
            os.fdatasync(fd)
            ms = (time.monotonic() - t) * 1e3
            slowest = max(slowest, ms)
            now = time.monotonic()
            if ms >= stall_ms:
                quiet_since = now
            if now - quiet_since >= quiet_s or now - started >= limit_s:
                break
            time.sleep(0.02)
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    return {"waited_s": time.monotonic() - started, "slowest_probe_ms": slowest,
            "quiet": time.monotonic() - quiet_since >= quiet_s}


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def percentile(sorted_values, p):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


# ---------------------------------------------------------------- processes


class Proc:
    """A child process (in our process group), its output in <dir>/<name>.log."""

    registry: list["Proc"] = []

    def __init__(self, name, argv, logdir: Path, env=None, netns=None, stdout=None, nofile=None):
        self.nofile = nofile
        self.name = name
        self.argv = [str(a) for a in argv]
        self.netns = netns
        self.env = env
        self.log_path = logdir / f"{name}.log"
        self.stdout = stdout
        self.popen = None
        self.log_path.write_bytes(b"")  # restarts (start()) append to it
        self.start()

    def start(self):
        argv = self.argv if not self.netns else ["ip", "netns", "exec", self.netns] + self.argv
        logf = open(self.log_path, "ab")
        self.popen = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL,
            stdout=self.stdout if self.stdout is not None else logf,
            stderr=logf, env=self.env, preexec_fn=self._limits if self.nofile else None,
        )
        logf.close()
        self.started_ns = now_ns()
        Proc.registry.append(self)

    def _limits(self):
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    @property
    def pid(self):
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def cpu_seconds(self):
        """user+sys CPU seconds of the process (/proc/PID/stat utime+stime)."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                text = f.read()
        except OSError:
            return None
        fields = text[text.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def hwm_mib(self):
        """Peak resident set (/proc/PID/status VmHWM), MiB."""
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def sample(self) -> dict:
        return {"cpu_s": self.cpu_seconds(), "hwm_mib": self.hwm_mib()}

    def wait(self, timeout):
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BenchError(f"{self.name} still running after {timeout}s")

    def stop(self, timeout=20.0):
        if not self.alive():
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()

    def kill9(self):
        if self.alive():
            self.popen.kill()
        if self.popen is not None:
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def log_tail(self, lines=3) -> str:
        try:
            text = strip_ansi(self.log_path.read_text(errors="replace")).splitlines()
        except OSError:
            return ""
        return "\n".join(line[:500] for line in text[-lines:])

    @classmethod
    def stop_all(cls):
        for proc in reversed(cls.registry):
            if proc.alive():
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in reversed(cls.registry):
            if proc.popen is None:
                continue
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill9()
        cls.registry.clear()


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is pid (for lsyncd's rsync children)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == pid:
            out.append(int(entry))
    return out


# ---------------------------------------------------------------- commit log


class CommitLog:
    """Tails a sink's --commit-log: source, key, generation, offset, len, unix_nanos[, received_nanos]."""

    def __init__(self, path: Path):
        self.path = path
        self.pos = 0
        self.rest = b""
        self.bytes = 0
        # (key, offset, len, durable nanos, received nanos or 0)
        self.records: list[tuple[str, int, int, int, int]] = []
        self.first_ns = None
        self.last_ns = None

    def poll(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return
        if not data:
            return
        self.pos += len(data)
        data = self.rest + data
        lines = data.split(b"\n")
        self.rest = lines.pop()
        for line in lines:
            parts = line.decode(errors="replace").split("\t")
            if len(parts) not in (6, 7):  # 7th: when the batch reached the sink
                continue
            _, key, _, offset, length, nanos = parts[:6]
            offset, length, nanos = int(offset), int(length), int(nanos)
            received = int(parts[6]) if len(parts) == 7 else 0
            self.records.append((key, offset, length, nanos, received))
            self.bytes += length
            if self.first_ns is None or nanos < self.first_ns:
                self.first_ns = nanos
            if self.last_ns is None or nanos > self.last_ns:
                self.last_ns = nanos

    def series(self, t0_ns: int, bin_s=0.25):
        """(seconds since t0, MB/s) per bin, from the commit times."""
        if not self.records:
            return []
        bins: dict[int, int] = {}
        for _, _, length, nanos, _ in self.records:
            k = int((nanos - t0_ns) / 1e9 / bin_s)
            bins[k] = bins.get(k, 0) + length
        last = max(bins)
        return [((k + 1) * bin_s, bins.get(k, 0) / bin_s / 1e6) for k in range(0, last + 1)]


def wait_commits(cl: CommitLog, total: int, timeout: float, what: str, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cl.poll()
        if cl.bytes >= total:
            return
        for p in procs:
            if not p.alive():
                raise BenchError(f"{p.name} exited while waiting for {what}: {p.log_tail()}")
        time.sleep(0.05)
    raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}: {cl.bytes}/{total} bytes recorded")


# ---------------------------------------------------------------- the bench


class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        # Extra flags for every sink and watcher of the run (A/B of an option).
        self.sink_args = shlex.split(getattr(args, "sink_args", "") or "")
        self.watch_args = shlex.split(getattr(args, "watch_args", "") or "")
        self.mode = "quick" if args.quick else "full"
        self.p = dict(MODES[self.mode])
        if args.runs:
            self.p["runs"] = args.runs
            self.p["p4_runs"] = args.runs
        if args.peer_runs:
            self.p["peer_runs"] = args.peer_runs
        for item in args.set:
            key, _, value = item.partition("=")
            if key not in self.p:
                raise SystemExit(f"--set: unknown parameter {key!r}; known: {', '.join(sorted(self.p))}")
            self.p[key] = parse_set_value(value)
        self.bin = str(Path(args.bin).resolve())
        self.work = Path(args.work).resolve()
        self.made: list[Path] = []
        self.shm = Path(args.shm)
        self.netns = args.netns
        self.env = dict(os.environ, TAILFLIGHT_LOG=args.log, NO_COLOR="1")
        self.results: dict = {"scenarios": {}, "errors": {}}
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self._certs = None
        self.netns_up = False

    # -- tailflight subcommands

    def tf(self, *args, timeout=600, check=True) -> subprocess.CompletedProcess:
        cp = subprocess.run([self.bin, *map(str, args)], capture_output=True, text=True,
                            timeout=timeout, env=dict(self.env, TAILFLIGHT_LOG="warn"))
        if check and cp.returncode != 0:
            raise BenchError(f"tailflight {' '.join(map(str, args))} failed ({cp.returncode}): "
                             f"{cp.stdout[-2000:]}{cp.stderr[-2000:]}")
        return cp

    def status(self, endpoint, tls=()):
        try:
            cp = self.tf("status", "--to", endpoint, *tls, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            return None
        if cp.returncode != 0:
            return None
        start = cp.stdout.find("{")
        if start < 0:
            return None
        try:
            return json.loads(cp.stdout[start:].splitlines()[0])
        except json.JSONDecodeError:
            return None

    def verify(self, src, dest) -> tuple[bool, str]:
        cp = self.tf("verify", src, dest, timeout=900, check=False)
        return cp.returncode == 0, (cp.stdout + cp.stderr)[-1500:]

    def certs(self) -> Path:
        if self._certs is None:
            out = self.work / "certs"
            rmtree(out)
            self.tf("certs", "--out", out)
            self._certs = out
        return self._certs

    def sim(self, logdir: Path, name: str, src: Path, *args) -> "Proc":
        return Proc(name, [self.bin, "sim", "--dir", src, *args], logdir, env=self.env)

    def fresh(self, *parts) -> Path:
        d = self.work.joinpath(*parts)
        rmtree(d)
        d.mkdir(parents=True)
        self.made.append(d)
        return d

    def prune_made(self) -> None:
        """Deletes the data a scenario left in its folders, keeping logs and reports.

        CI machines can have little free disk, and one scenario's gigabytes must not
        starve the next."""
        for d in self.made:
            for path in sorted(d.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                try:
                    if path.is_symlink() or path.is_file():
                        if path.suffix not in KEPT_SUFFIXES:
                            path.unlink()
                    elif path.is_dir() and not any(path.iterdir()):
                        path.rmdir()
                except OSError:
                    pass
        LAST_DELETE[0] = time.monotonic()
        self.made.clear()

    def fresh_src(self, *parts) -> Path:
        d = self.shm.joinpath(*parts)
        rmtree(d)
        d.mkdir(parents=True)
        self.made.append(d)
        return d

    def row(self, **kw):
        self.rows.append(kw)


def parse_set_value(value: str):
    """A --set value: JSON where it parses as such (numbers, lists, true/false), else the text
    (sizes like 4MiB start with a digit but are not JSON)."""
    if (value and value[0] in "[{0123456789-") or value in ("true", "false"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            pass
    return value


class Pipeline:
    """One sink and one watcher, each with its own state, for one run."""

    def __init__(self, b: Bench, d: Path, src: Path, *, tls=False, watch_extra=(), sink_extra=(),
                 sink_host="127.0.0.1", netns=None, sink_port=None, nofile=None, dest_root=None,
                 trace_rounds=False, logdir=None):
        self.b, self.d, self.src = b, d, src
        # Where the processes' logs and the commit log go (by default with the state).
        self.logdir = logdir or d
        # The sink's commit-round trace (one debug line per round) shows where the latency goes.
        self.sink_env = (dict(b.env, TAILFLIGHT_LOG=f"{b.env.get('TAILFLIGHT_LOG', 'warn')},sink::commit=debug")
                         if trace_rounds else b.env)
        self.nofile = nofile
        self.port = sink_port or free_port()
        self.host = sink_host
        self.dest_root = dest_root or d / "dest"
        self.dest = self.dest_root / SOURCE
        self.sink_state = d / "sink-state"
        self.commit_path = self.logdir / "commit.log"
        self.cl = CommitLog(self.commit_path)
        self.tls_client: list[str] = []
        self.netns = netns
        scheme = "http"
        self.sink_args = [b.bin, "sink", "--listen", f"{sink_host}:{self.port}",
                          "--root", self.dest_root, "--state", self.sink_state,
                          "--commit-log", self.commit_path, *sink_extra, *b.sink_args]
        if tls:
            c = b.certs()
            self.sink_args += ["--tls-cert", c / "server.pem", "--tls-key", c / "server.key",
                               "--client-ca", c / "ca.pem"]
            self.tls_client = ["--tls-ca", str(c / "ca.pem"), "--tls-cert", str(c / "client.pem"),
                               "--tls-key", str(c / "client.key")]
            scheme = "https"
        self.endpoint = f"{scheme}://{sink_host}:{self.port}"
        self.watch_extra = list(watch_extra)
        self.sink = None
        self.watcher = None
        self.start_sink()

    def start_sink(self):
        self.sink = Proc("sink", self.sink_args, self.logdir, env=self.sink_env, netns=self.netns, nofile=self.nofile)
        wait_port(self.host, self.port, 60, self.sink)

    def restart_sink(self):
        self.sink.start()

    def start_watcher(self, to=None):
        self.watch_start_ns = now_ns()
        self.watcher = Proc("watcher", nofile=self.nofile, argv=[
            self.b.bin, "watch", "--dir", self.src, "--source", SOURCE,
            "--to", to or self.endpoint, "--state", self.d / "watch-state",
            *self.tls_client, *self.watch_extra, *self.b.watch_args], logdir=self.logdir, env=self.b.env)
        return self.watcher

    def status(self):
        return self.b.status(self.endpoint, self.tls_client)

    def finish(self, nbytes: int) -> dict:
        """Samples CPU and peak RSS just before stopping both; returns the figures."""
        self.cl.poll()
        st = self.status()
        w = self.watcher.sample() if self.watcher else {}
        s = self.sink.sample()
        if self.watcher:
            self.watcher.stop()
        self.sink.stop()
        gb = nbytes / GB if nbytes else None
        trouble = {}
        for proc in (self.watcher, self.sink):
            if proc is None:
                continue
            try:
                text = proc.log_path.read_text(errors="replace")
            except OSError:
                continue
            trouble[proc.name] = {
                "too_many_open_files": text.count("Too many open files"),
                "connection_lost": text.count("connection lost"),
                "inotify_overflow": text.count("inotify queue overflowed"),
            }
        out = {
            "log_events": trouble,
            "bytes": nbytes,
            "watcher_cpu_s": w.get("cpu_s"), "sink_cpu_s": s.get("cpu_s"),
            "watcher_rss_mib": w.get("hwm_mib"), "sink_rss_mib": s.get("hwm_mib"),
            "watcher_cpu_s_per_gb": ratio(w.get("cpu_s"), gb),
            "sink_cpu_s_per_gb": ratio(s.get("cpu_s"), gb),
            "status": st,
        }
        return out

    def kill_all(self):
        for p in (self.watcher, self.sink):
            if p is not None:
                p.kill9()


def cpu_line(m: dict) -> str:
    def f(v, fmt):
        return "?" if v is None else format(v, fmt)
    text = (f"watcher {f(m.get('watcher_cpu_s_per_gb'), '.2f')} CPU s/GB, "
            f"RSS {f(m.get('watcher_rss_mib'), '.0f')} MiB; sink {f(m.get('sink_cpu_s_per_gb'), '.2f')} "
            f"CPU s/GB, RSS {f(m.get('sink_rss_mib'), '.0f')} MiB")
    dup = (m.get("status") or {}).get("duplicate_bytes")
    if dup:
        text += f"; sink saw {dup / MiB:.0f} MiB duplicate (re-sent) bytes"
    events = [f"{who}: {k.replace('_', ' ')} ×{n}" for who, ev in (m.get("log_events") or {}).items()
              for k, n in ev.items() if n]
    if events:
        text += "; log: " + ", ".join(events)
    return text


def trouble_note(b: "Bench", scenario: str, runs) -> None:
    """Turns errors seen in the logs and re-sent bytes into a note of the results."""
    totals: dict[str, int] = {}
    dup = 0
    for m in runs:
        for who, ev in (m.get("log_events") or {}).items():
            for k, n in ev.items():
                if n:
                    totals[f"{who} {k.replace('_', ' ')}"] = totals.get(f"{who} {k.replace('_', ' ')}", 0) + n
        dup += (m.get("status") or {}).get("duplicate_bytes") or 0
    if totals or dup:
        parts = [f"{k} ×{n}" for k, n in totals.items()]
        if dup:
            parts.append(f"{dup / MiB:.0f} MiB of duplicate (re-sent) bytes at the sink")
        b.notes.append(f"{scenario}: the logs show " + ", ".join(parts) + " (see the JSON `log_events`).")


# ---------------------------------------------------------------- ceilings


def iperf_loopback(b: Bench, d: Path, streams: int) -> float:
    port = free_port()
    server = Proc(f"iperf3-s-{streams}", ["iperf3", "-s", "-1", "--forceflush", "-B", "127.0.0.1", "-p", port], d)
    try:
        wait_log(server, "listening", 10)
        cp = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-P", str(streams),
                             "-t", str(b.p["iperf_seconds"]), "-J"],
                            capture_output=True, text=True, timeout=b.p["iperf_seconds"] + 30)
        data = json.loads(cp.stdout)
        if "error" in data:
            raise BenchError(f"iperf3: {data['error']}")
        return data["end"]["sum_received"]["bits_per_second"] / 8
    finally:
        server.stop(5)


def disk_ceiling(b: Bench, d: Path) -> dict:
    """Sequential write with fdatasync on the sink root's filesystem."""
    target = d / "fio.tmp"
    size = b.p["fio_mib"]
    try:
        if shutil.which("fio"):
            cp = subprocess.run(["fio", "--name=seq", f"--filename={target}", "--rw=write", "--bs=4M",
                                 f"--size={size}M", "--end_fsync=1", "--fdatasync=8",
                                 "--output-format=json"],
                                capture_output=True, text=True, timeout=600)
            data = json.loads(cp.stdout[cp.stdout.find("{"):])
            w = data["jobs"][0]["write"]
            # fio's bandwidth leaves out the final fsync; recompute over the job's
            # whole runtime (which includes it) when fio reports it.
            job_ms = data["jobs"][0].get("job_runtime") or w.get("runtime")
            return {"tool": "fio", "bytes_per_s": w["io_bytes"] / (job_ms / 1000),
                    "fio_bw_bytes": w["bw_bytes"], "mib": size}
        count = size // 4
        t0 = time.monotonic()
        subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=4M", f"count={count}",
                        "conv=fdatasync"], check=True, capture_output=True, timeout=600)
        return {"tool": "dd", "bytes_per_s": count * 4 * MiB / (time.monotonic() - t0), "mib": size}
    finally:
        target.unlink(missing_ok=True)


def direct_disk_ceiling(b: Bench, d: Path) -> float | None:
    """The device without the page cache: fio 4 MiB O_DIRECT writes, then an fsync, on the sink root's
    filesystem: what the disk itself takes when no new memory has to be filled on the way (the sink
    writes the aligned middle of large ranges this way on ext4, XFS and btrfs, see sink_writes_direct)."""
    if not shutil.which("fio"):
        return None
    target = d / "fio-direct.tmp"
    try:
        cp = subprocess.run(["fio", "--name=direct", f"--filename={target}", "--rw=write", "--bs=4M",
                             f"--size={b.p['fio_mib']}M", "--direct=1", "--end_fsync=1",
                             "--output-format=json"], capture_output=True, text=True, timeout=600)
        data = json.loads(cp.stdout[cp.stdout.find("{"):])
        w = data["jobs"][0]["write"]
        job_ms = data["jobs"][0].get("job_runtime") or w.get("runtime")
        return w["io_bytes"] / (job_ms / 1000)
    except (KeyError, ValueError, ZeroDivisionError, TypeError, subprocess.TimeoutExpired):
        return None
    finally:
        target.unlink(missing_ok=True)


def memory_fill_ceiling(b: Bench) -> dict:
    """How fast this machine hands out memory it has not touched lately, and how fast it rewrites memory
    it has: dd of P1's volume into a new tmpfs file, then over the same pages again. On a VM whose host
    backs guest memory lazily (or takes freed pages back, e.g. virtio-balloon free page reporting), the
    first figure is far below memcpy speed, and every new page-cache page pays it: the simulator's
    tmpfs source, the sink's destination files and fio's alike."""
    target = b.shm / "fill.tmp"
    count = b.p["p1_total_mib"]
    out = {"mib": count, "free_page_reporting": free_page_reporting()}
    try:
        for label, extra in (("first_touch", []), ("rewrite", ["conv=notrunc"])):
            t0 = time.monotonic()
            subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={count}", *extra],
                           check=True, capture_output=True, timeout=600)
            out[f"{label}_bytes_per_s"] = count * MiB / (time.monotonic() - t0)
    except (OSError, subprocess.SubprocessError) as e:
        # A tmpfs too small for P1's volume, say: the other ceilings still count.
        out["error"] = str(e)[-300:]
    finally:
        target.unlink(missing_ok=True)
    return out


def free_page_reporting() -> bool | None:
    """Whether a virtio balloon hands the guest's free pages back to the host (feature bit 5)."""
    found = None
    for dev in Path("/sys/bus/virtio/devices").glob("*"):
        try:
            if (dev / "device").read_text().strip() == "0x0005":
                features = (dev / "features").read_text().strip()
                found = bool(found) or (len(features) > 5 and features[5] == "1")
        except OSError:
            continue
    return found


def cipher_ceiling(b: Bench) -> dict | None:
    """AES-128-GCM (the suite mutual TLS negotiates) on one core, from aws-lc, the library rustls uses:
    flight-server's cipher-speed example seals and opens 16 KiB records (TLS's largest) in place. What
    encrypting at the watcher and decrypting at the sink cost at the least, whatever the TLS stack
    around them does."""
    tool = Path(b.bin).parent / "examples" / "cipher-speed"
    if not tool.exists():
        return None
    try:
        cp = subprocess.run([str(tool), "0.4" if b.quick else "2"], capture_output=True, text=True, timeout=60)
        return json.loads(cp.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def fdatasync_latency(b: Bench, d: Path) -> dict | None:
    """Floor for P3: fio 4 KiB appends, each followed by fdatasync, on the sink root's filesystem."""
    if not shutil.which("fio"):
        return None
    target = d / "lat.tmp"
    try:
        cp = subprocess.run(["fio", "--name=lat", f"--filename={target}", "--rw=write", "--bs=4k",
                             "--size=16M" if b.quick else "--size=64M", "--fdatasync=1",
                             "--output-format=json"], capture_output=True, text=True, timeout=600)
        data = json.loads(cp.stdout[cp.stdout.find("{"):])
        pct = data["jobs"][0]["sync"]["lat_ns"]["percentile"]
        return {"p50_ms": pct["50.000000"] / 1e6, "p99_ms": pct["99.000000"] / 1e6,
                "p999_ms": pct["99.900000"] / 1e6}
    except (KeyError, ValueError, subprocess.TimeoutExpired):
        return None
    finally:
        target.unlink(missing_ok=True)


def scenario_ceilings(b: Bench):
    d = b.fresh("ceilings")
    runs = b.p["ceiling_runs"]
    tcp4, tcp1, disk, fill, direct = [], [], [], [], []
    for _ in range(runs):
        tcp4.append(iperf_loopback(b, d, 4))
        tcp1.append(iperf_loopback(b, d, 1))
        disk.append(disk_ceiling(b, d)["bytes_per_s"])
        fill.append(memory_fill_ceiling(b))
        direct.append(direct_disk_ceiling(b, d))
    res = {"tcp4_bytes_per_s": tcp4, "tcp1_bytes_per_s": tcp1, "disk_bytes_per_s": disk,
           "tcp4": median(tcp4), "tcp1": median(tcp1), "disk": median(disk), "memory_fill_runs": fill,
           "memory_first_touch": median([f.get("first_touch_bytes_per_s") for f in fill]),
           "memory_rewrite": median([f.get("rewrite_bytes_per_s") for f in fill]),
           "disk_direct_runs": direct, "disk_direct": median([x for x in direct if x]),
           "disk_tool": "fio" if shutil.which("fio") else "dd",
           "disk_fs": fs_type(b.work), "fdatasync": fdatasync_latency(b, d),
           "cipher": cipher_ceiling(b)}
    b.results["scenarios"]["ceilings"] = res
    fl = res["fdatasync"]
    say(f"[ceilings] loopback TCP iperf3 -P 4: {res['tcp4'] / 1e6:.0f} MB/s "
        f"({res['tcp4'] * 8 / 1e9:.1f} Gbit/s), -P 1: {res['tcp1'] / 1e6:.0f} MB/s; "
        f"disk {res['disk_tool']} 4 MiB writes + fdatasync every 32 MiB on {res['disk_fs']}: "
        f"{res['disk'] / 1e6:.0f} MB/s"
        + (f"; 4 KiB write + fdatasync: p50 {fl['p50_ms']:.3f} ms, p99 {fl['p99_ms']:.3f} ms" if fl else "")
        + (f"; memory (dd of {b.p['p1_total_mib']} MiB into tmpfs): new pages {res['memory_first_touch'] / 1e6:.0f} "
           f"MB/s, the same pages again {res['memory_rewrite'] / 1e6:.0f} MB/s"
           if res["memory_first_touch"] and res["memory_rewrite"] else "")
        + (f"; disk with O_DIRECT (fio, no page cache): {res['disk_direct'] / 1e6:.0f} MB/s"
           if res["disk_direct"] else "")
        + (f"; AES-128-GCM on one core (aws-lc, 16 KiB records): seal {res['cipher']['seal_bytes_per_s'] / 1e6:.0f} "
           f"MB/s, open {res['cipher']['open_bytes_per_s'] / 1e6:.0f} MB/s" if res["cipher"] else ""))


def fs_type(path: Path) -> str:
    try:
        cp = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
        best, fstype = "", cp.stdout.strip()
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, typ = line.split()[:3]
                if str(path).startswith(mnt) and len(mnt) > len(best):
                    best, fstype = mnt, f"{typ} ({dev} on {mnt})"
        return fstype
    except OSError:
        return "?"


# ---------------------------------------------------------------- P1, P2


def throughput_run(b: Bench, name: str, tls: bool) -> dict:
    d = b.fresh("p1", name)
    src = b.fresh_src("p1", name)
    os.sync()
    pl = Pipeline(b, d, src, tls=tls)
    try:
        pl.start_watcher()
        time.sleep(0.5)
        t0 = now_ns()
        # The simulator is the only child reaped while it runs: the change in
        # the children's rusage is its CPU time.
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        sim = b.sim(d, "sim", src, "--streams", b.p["p1_streams"], "--rate", 0, "--frame", "1MiB",
                    "--chunk", b.p["p1_chunk"], "--total", f"{b.p['p1_total_mib']}MiB")
        if sim.wait(600) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        sim_s = (now_ns() - t0) / 1e9
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        sim_cpu_s = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        total, nfiles = dir_bytes(src)
        wait_commits(pl.cl, total, 900, f"{name} to arrive", (pl.sink, pl.watcher))
        elapsed = (pl.cl.last_ns - t0) / 1e9
        m = pl.finish(total)
    finally:
        pl.kill_all()
    ok, text = b.verify(src, pl.dest)
    m.update({"name": name, "tls": tls, "total_bytes": total, "files": nfiles, "seconds": elapsed,
              "bytes_per_s": total / elapsed, "sim_seconds": sim_s, "verified": ok,
              "sim_cpu_s_per_gb": sim_cpu_s / (total / GB) if total else None,
              "series": pl.cl.series(t0)})
    if not ok:
        m["verify_report"] = text
    say(f"  {name}: {total / MiB:.0f} MiB in {elapsed:.2f}s = {total / elapsed / 1e6:.0f} MB/s "
        f"(simulator alone {total / sim_s / 1e6:.0f} MB/s); verify {'identical' if ok else 'DIFFERENT'}; "
        + cpu_line(m))
    rmtree(src)
    rmtree(pl.dest_root)
    return m


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


def scenario_p1_p2(b: Bench):
    ceil = b.results["scenarios"].get("ceilings") or {}
    p1, p2 = [], []
    say(f"[P1/P2] {b.p['p1_streams']} files, {b.p['p1_total_mib']} MiB written as fast as the "
        f"simulator can (tmpfs source), plaintext and mTLS in ABBA order, {b.p['runs']} run(s) each")
    # ABBA (plain, mTLS, mTLS, plain, ...): a run suffers from the one before
    # it (the disk still discarding its deleted output, the page cache
    # refilling), and the very first run of the pair never does. A fixed
    # order would put that on one side only.
    # One unmeasured run first: the ceilings just filled and freed gigabytes
    # of memory (this VM hands freed pages back to its host), and the run
    # after them was the slowest of every series (its simulator alone
    # 1.0-1.6 GB/s against 2-3 GB/s in later runs), always on the plaintext side.
    throughput_run(b, "warm-up", tls=False)
    for i in range(b.p["runs"]):
        for tls in ((False, True) if i % 2 == 0 else (True, False)):
            if tls:
                p2.append(throughput_run(b, f"mtls-{i + 1}", tls=True))
            else:
                p1.append(throughput_run(b, f"plain-{i + 1}", tls=False))
    v1 = median([r["bytes_per_s"] for r in p1])
    v2 = median([r["bytes_per_s"] for r in p2])
    tcp, disk = ceil.get("tcp4"), ceil.get("disk")
    b.results["scenarios"]["P1"] = {"runs": p1, "median_bytes_per_s": v1, "tcp_ceiling": tcp,
                                    "disk_ceiling": disk}
    b.results["scenarios"]["P2"] = {"runs": p2, "median_bytes_per_s": v2, "p1_median": v1}
    binding = "disk" if (disk is not None and tcp is not None and disk < tcp) else "tcp"
    r_tcp, r_disk, r2 = ratio(v1, tcp), ratio(v1, disk), ratio(v2, v1)
    say(f"[P1] {v1 / 1e6:.0f} MB/s vs TCP ceiling {fmt_mb(tcp)} (x{fmt(r_tcp, '.2f')}) and disk "
        f"ceiling {fmt_mb(disk)} (x{fmt(r_disk, '.2f')}); binding ceiling: {binding}")
    say(f"[P2] mTLS {v2 / 1e6:.0f} MB/s vs plaintext {v1 / 1e6:.0f} MB/s: x{fmt(r2, '.2f')}")
    verified = all(r["verified"] for r in p1 + p2)
    trouble_note(b, "P1/P2", p1 + p2)
    b.row(id="P1", scenario="file→file, 16 growing files, loopback, plaintext — vs loopback TCP (iperf3 -P 4)",
          figure=fmt_mb(v1), peer=fmt_mb(tcp), ratio=r_tcp, target=f"≥{TARGETS['P1_tcp']}× (binding if TCP ≤ disk)",
          met=met(r_tcp, TARGETS["P1_tcp"]) if binding == "tcp" else "not binding")
    b.row(id="P1", scenario="… vs disk sequential write + fdatasync (same filesystem as the sink root)",
          figure=fmt_mb(v1), peer=fmt_mb(disk), ratio=r_disk, target=f"≥{TARGETS['P1_disk']}× (binding if disk < TCP)",
          met=met(r_disk, TARGETS["P1_disk"]) if binding == "disk" else "not binding")
    direct = ceil.get("disk_direct")
    if direct:
        b.row(id="P1", scenario="… vs the disk with O_DIRECT (fio, no page cache: what the device takes)",
              figure=fmt_mb(v1), peer=fmt_mb(direct), ratio=ratio(v1, direct),
              target="(info: the disk ceiling the target names is the buffered fio above)", met="—")
    b.row(id="P2", scenario="P1 with mutual TLS — vs P1 plaintext", figure=fmt_mb(v2), peer=fmt_mb(v1),
          ratio=r2, target=f"≥{TARGETS['P2']}", met=met(r2, TARGETS["P2"]))
    if not verified:
        b.notes.append("P1/P2: a destination was NOT identical to its source (see the JSON).")


# ---------------------------------------------------------------- P3


def read_write_log(path: Path) -> dict[str, list[tuple[int, int, int]]]:
    writes: dict[str, list[tuple[int, int, int]]] = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 4:
                continue
            writes.setdefault(parts[0], []).append((int(parts[1]), int(parts[2]), int(parts[3])))
    return writes


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
    buckets: dict[int, list[float]] = {}
    for t, lat in pairs:
        buckets.setdefault(int((t - t0) / 1e9 / window_s), []).append(lat)
    out = []
    for k in sorted(buckets):
        v = sorted(buckets[k])
        out.append({"from_s": k * window_s, "n": len(v), "p50_ms": percentile(v, 50), "p99_ms": percentile(v, 99)})
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


def p3_sim_args(b: Bench, threads=None, chunk="1GiB"):
    """The P3 workload; `threads` writer threads (0: one per file), by default the mode's;
    each file rotates to a new chunk every `chunk` bytes (by default never, in the run)."""
    threads = int(b.p["p3_writer_threads"] if threads is None else threads)
    return ["--streams", b.p["p3_streams"], "--rate", b.p["p3_rate"], "--frame", "4KiB",
            "--chunk", chunk, "--duration", f"{b.p['p3_seconds']}s",
            *(["--writer-threads", threads] if threads > 0 else [])]


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
    rmtree(src)
    rmtree(pl.dest_root)
    return m


def p3_floor(b: Bench, i: int) -> dict:
    """The same workload through `tailflight floor`: inotify, one read per named file, one TCP message,
    one write + fdatasync of a preallocated ring file per round. No destination files, manifest, acks,
    checksums or window: what this machine allows any tail-and-ship tool, not a peer."""
    d = b.fresh("p3", f"floor-{i}")
    src = b.fresh_src("p3", f"floor-{i}")
    logs = b.fresh_src("p3-logs", f"floor-{i}") if int(b.p["p3_logs_tmpfs"]) else d  # as for tailflight
    settled = settle_disk(d, limit_s=float(b.p["p3_settle"])) if float(b.p["p3_settle"]) else None
    port = free_port()
    limit = f"{int(b.p['p3_seconds']) + 400}s"
    cl = CommitLog(logs / "commit.log")
    land = ship = None
    try:
        land = Proc("land", [b.bin, "floor", "land", "--listen", f"127.0.0.1:{port}", "--ring", d / "ring",
                             "--commit-log", cl.path, "--limit", limit], logs, env=b.env)
        ship = Proc("ship", [b.bin, "floor", "ship", "--src", src, "--to", f"127.0.0.1:{port}",
                             "--limit", limit], logs, env=b.env)
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
    say(f"  floor run {i}: p50 {fmt(summ['p50_ms'], '.2f')} ms, p90 {fmt(summ['p90_ms'], '.2f')}, "
        f"p99 {fmt(summ['p99_ms'], '.2f')}, max {fmt(summ['max_ms'], '.1f')} ms; missing {missing}; "
        f"write -> landed p50 {fmt(wt.get('p50_ms'), '.2f')} ms")
    rmtree(src)
    return summ


ROUND_FIELDS = ("requests", "waited_us", "placing_us", "queued_us", "journal_us", "manifest_us", "sync_us",
                "total_us")


STAGES = ("place", "file_write", "round", "journal")


def commit_rounds(log: Path) -> dict | None:
    """Medians of the sink's commit-round trace (sink::commit=debug), the share of rounds that journaled, and
    the CPU time each sink stage had spent by the last round (its `cpu_totals_us`, one per STAGES)."""
    rows, stage_cpu = [], None
    try:
        with open(log, errors="replace") as f:
            for line in f:
                if "commit round" in line:
                    rows.append(dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", line)))
                    totals = re.search(r"cpu_totals_us=\[([\d, ]+)\]", line)
                    if totals:
                        stage_cpu = [int(x) for x in totals.group(1).split(",")]
    except OSError:
        return None
    if not rows:
        return None
    out = {k: median([r.get(k, 0) for r in rows]) for k in ROUND_FIELDS}
    out["rounds"] = len(rows)
    out["journaled_share"] = sum(1 for r in rows if r.get("journaled", 0) > 0) / len(rows)
    if stage_cpu and len(stage_cpu) == len(STAGES):
        out["stage_cpu_s"] = {k: us / 1e6 for k, us in zip(STAGES, stage_cpu)}
    return out


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
        lat, missing = [], 0
        for name, ws in writes.items():
            h = self.hist.get(name)
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


def rsync_args():
    return ["rsync", "-a", "--inplace", "--append-verify"]


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
    peers: dict[str, list[dict]] = {label: [] for label, _, _ in peer_kinds}
    # Interleaved, a tailflight run then one of each peer: the machine's load
    # drifts over minutes, and the runs of tailflight and of each peer should
    # see the same spread of it.
    for i in range(max(b.p["runs"], b.p["peer_runs"])):
        if i < b.p["runs"]:
            tf_runs.append(p3_tailflight(b, i + 1, extra, sink_extra=sink_extra))
            if int(b.p.get("p3_floor", 0)):
                try:
                    floors.append(p3_floor(b, i + 1))
                except Exception as e:  # the floor failing must not lose the scenario's results
                    say(f"  floor FAILED: {e}")
                    b.results["errors"][f"P3 floor run {i + 1}"] = str(e)
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
           "rotating": rotating, "peers": peers, "floor": floors, "p50_ms": p50, "p99_ms": p99,
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
    if floors:
        f50 = median([r["p50_ms"] for r in floors])
        f99 = median([r["p99_ms"] for r in floors])
        res["floor_medians"] = {"p50_ms": f50, "p99_ms": f99}
        say(f"[P3] floor (inotify → TCP → ring write + fdatasync, nothing else): p50 {fmt(f50, '.2f')} ms, "
            f"p99 {fmt(f99, '.2f')} ms; tailflight is ×{fmt(ratio(p50, f50), '.2f')} (p50), "
            f"×{fmt(ratio(p99, f99), '.2f')} (p99) of it")
        b.row(id="P3", scenario="… the machine's floor on the same workload (`tailflight floor`: inotify → one TCP "
                                 "connection → ring-file write + fdatasync; no placement, manifest or acks): p50 (p99)",
              figure=f"{fmt_ms(p50)} ({fmt_ms(p99)})", peer=f"{fmt_ms(f50)} ({fmt_ms(f99)})",
              ratio_text=f"{fmt(ratio(p50, f50), '.2f')}× ({fmt(ratio(p99, f99), '.2f')}×) the floor",
              target="(info)", met="—")
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


# ---------------------------------------------------------------- P4


class NetNs:
    """A network namespace joined to the host by a veth pair, both ends rate-limited by tbf."""

    def __init__(self, name: str, rate: str):
        self.name = name
        self.host_if = f"h{name}"[:15]
        self.ns_if = f"n{name}"[:15]
        self.rate = rate
        self.host_ip = self.ns_ip = None
        self.created = False

    def _pick_subnet(self) -> str:
        used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        used += subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
        base = os.getpid() % 200
        for k in range(200):
            third = (base + k) % 200 + 20
            prefix = f"10.250.{third}."
            if prefix not in used:
                return prefix
        raise BenchError("no free /30 in 10.250.0.0/16")

    def up(self):
        def run(*cmd):
            cp = subprocess.run(list(cmd), capture_output=True, text=True)
            if cp.returncode != 0:
                raise BenchError(f"{' '.join(cmd)}: {cp.stderr.strip()}")
        prefix = self._pick_subnet()
        self.host_ip, self.ns_ip = prefix + "1", prefix + "2"
        run("ip", "netns", "add", self.name)
        self.created = True
        run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        run("ip", "link", "set", self.ns_if, "netns", self.name)
        run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        run("ip", "link", "set", self.host_if, "up")
        ns = ["ip", "netns", "exec", self.name]
        run(*ns, "ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        run(*ns, "ip", "link", "set", self.ns_if, "up")
        run(*ns, "ip", "link", "set", "lo", "up")
        tbf = ["root", "tbf", "rate", self.rate, "burst", "2mb", "latency", "100ms"]
        run("tc", "qdisc", "add", "dev", self.host_if, *tbf)
        run(*ns, "tc", "qdisc", "add", "dev", self.ns_if, *tbf)

    def down(self):
        if self.created:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
            self.created = False
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)


def iperf_ns(b: Bench, d: Path, ns: NetNs, streams: int) -> float:
    port = free_port()
    server = Proc(f"iperf3-ns-{streams}", ["iperf3", "-s", "-1", "--forceflush", "-B", ns.ns_ip, "-p", port], d,
                  netns=ns.name)
    try:
        wait_log(server, "listening", 10)
        cp = subprocess.run(["iperf3", "-c", ns.ns_ip, "-p", str(port), "-P", str(streams), "-t", "2", "-J"],
                            capture_output=True, text=True, timeout=40)
        data = json.loads(cp.stdout)
        if "error" in data:
            raise BenchError(f"iperf3: {data['error']}")
        return data["end"]["sum_received"]["bits_per_second"] / 8
    finally:
        server.stop(5)


def delay_line(b: Bench, d: Path, name: str, to: str, rtt_ms: int) -> tuple[Proc, int]:
    port = free_port()
    p = Proc(name, [b.bin, "delay-line", "--listen", f"127.0.0.1:{port}", "--to", to,
                    "--rtt", f"{rtt_ms}ms"], d, env=b.env)
    wait_port("127.0.0.1", port, 20, p)
    return p, port


def p4_tailflight(b: Bench, ns: NetNs | None, src: Path, total: int, rtt: int, conns: int, i: int) -> dict:
    d = b.fresh("p4", f"tf{conns}-rtt{rtt}-{i}")
    host = ns.ns_ip if ns else "127.0.0.1"
    os.sync()
    pl = Pipeline(b, d, src, sink_host=host, netns=ns.name if ns else None,
                  watch_extra=["--connections", conns])
    dl = None
    try:
        dl, port = delay_line(b, d, "delay-line", f"{host}:{pl.port}", rtt)
        pl.start_watcher(to=f"http://127.0.0.1:{port}")
        wait_commits(pl.cl, total, 600, f"P4 rtt {rtt} ms", (pl.sink, pl.watcher, dl))
        dl_cpu = dl.cpu_seconds()
        m = pl.finish(total)
    finally:
        pl.kill_all()
        if dl:
            dl.stop(5)
    elapsed = (pl.cl.last_ns - pl.watch_start_ns) / 1e9
    steady = (pl.cl.last_ns - pl.cl.first_ns) / 1e9
    m.update({"rtt_ms": rtt, "connections": conns, "seconds": elapsed, "bytes_per_s": total / elapsed,
              "steady_bytes_per_s": total / steady if steady > 0 else None,
              "first_commit_s": (pl.cl.first_ns - pl.watch_start_ns) / 1e9,
              "delay_line_cpu_s": dl_cpu})
    ok, _ = b.verify(src, pl.dest)
    m["verified"] = ok
    say(f"  tailflight {conns} conn, RTT {rtt:3d} ms: {total / elapsed / 1e6:6.1f} MB/s "
        f"(first byte recorded after {m['first_commit_s']:.2f}s; first-to-last "
        f"{fmt_mb(m['steady_bytes_per_s'])}); verify {'identical' if ok else 'DIFFERENT'}; "
        f"delay line {fmt(dl_cpu, '.1f')} CPU s")
    rmtree(pl.dest_root)
    return m


def p4_rsync(b: Bench, ns: NetNs | None, src: Path, total: int, rtt: int, i: int) -> dict:
    d = b.fresh("p4", f"rsync-rtt{rtt}-{i}")
    dest = d / "dest"
    dest.mkdir()
    host = ns.ns_ip if ns else "127.0.0.1"
    port = free_port()
    conf = d / "rsyncd.conf"
    conf.write_text(f"pid file = {d}/rsyncd.pid\nuse chroot = no\nlog file = {d}/rsyncd-own.log\n"
                    f"[bench]\n    path = {dest}\n    read only = no\n    uid = root\n    gid = root\n")
    os.sync()
    daemon = Proc("rsyncd", ["rsync", "--daemon", "--no-detach", "--config", conf, "--port", port,
                             "--address", host], d, netns=ns.name if ns else None)
    dl = None
    try:
        wait_port(host, port, 20, daemon)
        dl, dport = delay_line(b, d, "delay-line", f"{host}:{port}", rtt)
        t0 = time.monotonic()
        cp = subprocess.run(["rsync", "-a", "--inplace", f"{src}/", f"rsync://127.0.0.1:{dport}/bench/"],
                            capture_output=True, text=True, timeout=900)
        elapsed = time.monotonic() - t0
        if cp.returncode != 0:
            raise BenchError(f"rsync failed: {cp.stderr[-1000:]}")
    finally:
        if dl:
            dl.stop(5)
        daemon.stop(5)
    ok, _ = b.verify(src, dest)
    say(f"  rsync daemon,   RTT {rtt:3d} ms: {total / elapsed / 1e6:6.1f} MB/s; verify "
        f"{'identical' if ok else 'DIFFERENT'}")
    rmtree(dest)
    return {"rtt_ms": rtt, "seconds": elapsed, "bytes_per_s": total / elapsed, "verified": ok}


def scenario_p4(b: Bench):
    d = b.fresh("p4")
    ns = NetNs(b.netns, b.p["p4_rate"])
    res: dict = {"rtts": b.p["p4_rtts"]}
    try:
        ns.up()
        b.netns_up = True
        res["path"] = (f"watcher → loopback → delay line → veth with tbf {b.p['p4_rate']} each way → "
                       f"sink in network namespace {ns.name} ({ns.ns_ip})")
    except BenchError as e:
        ns.down()
        ns = None
        res["path"] = "loopback only (network namespace setup failed: no rate limit)"
        res["netns_error"] = str(e)
        b.notes.append(f"P4: network namespaces failed ({e}); measured on loopback WITHOUT the "
                       f"{b.p['p4_rate']} tbf rate limit.")
    try:
        say(f"[P4] throughput vs RTT {b.p['p4_rtts']} ms; path: {res['path']}")
        if ns:
            link = iperf_ns(b, d, ns, 4)
            res["link_bytes_per_s"] = link
            say(f"  link ceiling (iperf3 -P 4 through the veth+tbf, no delay): {link / 1e6:.0f} MB/s")
        src = b.fresh_src("p4", "src")
        cp = b.tf("sim", "--dir", src, "--streams", 16, "--rate", 0, "--frame", "1MiB", "--chunk", "64MiB",
                  "--total", f"{b.p['p4_total_mib']}MiB")
        total, nfiles = dir_bytes(src)
        res["total_bytes"], res["files"] = total, nfiles
        say(f"  data set: {nfiles} complete files, {total / MiB:.0f} MiB on tmpfs, copied whole by each run")
        runs: dict[str, list[dict]] = {"tf4": [], "tf1": [], "rsync": []}
        for i in range(b.p["p4_runs"]):
            for rtt in b.p["p4_rtts"]:
                runs["tf4"].append(p4_tailflight(b, ns, src, total, rtt, 4, i + 1))
                runs["tf1"].append(p4_tailflight(b, ns, src, total, rtt, 1, i + 1))
                runs["rsync"].append(p4_rsync(b, ns, src, total, rtt, i + 1))
        res["runs"] = runs
        trouble_note(b, "P4", runs["tf4"] + runs["tf1"])
        med = {k: {rtt: median([r["bytes_per_s"] for r in v if r["rtt_ms"] == rtt]) for rtt in b.p["p4_rtts"]}
               for k, v in runs.items()}
        res["medians"] = med
        lo, hi = min(b.p["p4_rtts"]), max(b.p["p4_rtts"])
        r = ratio(med["tf4"][hi], med["tf4"][lo])
        res["ratio_hi_lo"] = r
        say(f"[P4] tailflight at {hi} ms {fmt_mb(med['tf4'][hi])} vs at {lo} ms {fmt_mb(med['tf4'][lo])}: "
            f"x{fmt(r, '.2f')}; single connection at {hi} ms {fmt_mb(med['tf1'][hi])}; "
            f"rsync at {hi} ms {fmt_mb(med['rsync'][hi])}")
        b.row(id="P4", scenario=f"throughput at RTT {hi} ms vs {lo} ms, {b.p['p4_rate']} tbf link"
              + ("" if ns else " (NO rate limit: loopback fallback)"),
              figure=fmt_mb(med["tf4"][hi]), peer=fmt_mb(med["tf4"][lo]), ratio=r,
              target=f"≥{TARGETS['P4']}", met=met(r, TARGETS["P4"]))
        b.row(id="P4", scenario=f"… single connection at {hi} ms (vs tailflight at {lo} ms)",
              figure=fmt_mb(med["tf1"][hi]), peer=fmt_mb(med["tf4"][lo]),
              ratio=ratio(med["tf1"][hi], med["tf4"][lo]), target="(info)", met="—")
        b.row(id="P4", scenario=f"… rsync daemon over the same path at {hi} ms (tailflight ÷ rsync)",
              figure=fmt_mb(med["tf4"][hi]), peer=fmt_mb(med["rsync"][hi]),
              ratio=ratio(med["tf4"][hi], med["rsync"][hi]), target="(info)", met="—")
        rmtree(src)
    finally:
        b.results["scenarios"]["P4"] = res
        if ns:
            Proc.stop_all()
            ns.down()
            b.netns_up = False


# ---------------------------------------------------------------- P5


def p5_writer(argv):
    """Hidden subcommand: one process appending round-robin to many files, once per file per second."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--seconds", type=int, required=True)
    ap.add_argument("--size", type=int, default=4096)
    a = ap.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, a.files + 256)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    per_dir = 1000
    fds = []
    for i in range(a.files):
        sub = os.path.join(a.dir, f"d{i // per_dir:03d}")
        if i % per_dir == 0:
            os.makedirs(sub, exist_ok=True)
        fds.append(os.open(os.path.join(sub, f"f{i:06d}.dat"),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    base = bytearray(os.urandom(a.size))
    print(json.dumps({"created": a.files}), flush=True)
    time.sleep(2)
    slots = 100
    print(json.dumps({"appending": time.time_ns()}), flush=True)
    t0 = time.monotonic()
    written = 0
    max_lag = 0.0
    for second in range(a.seconds):
        for slot in range(slots):
            lo, hi = a.files * slot // slots, a.files * (slot + 1) // slots
            for i in range(lo, hi):
                struct.pack_into("<QQ", base, 0, i, second)
                written += os.write(fds[i], base)
            due = t0 + second + (slot + 1) / slots
            lag = time.monotonic() - due
            if lag < 0:
                time.sleep(-lag)
            else:
                max_lag = max(max_lag, lag)
    for fd in fds:
        os.close(fd)
    print(json.dumps({"done": time.time_ns(), "bytes": written, "max_lag_s": max_lag,
                      "seconds": time.monotonic() - t0}), flush=True)


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
        writer = subprocess.Popen([sys.executable, __file__, "_p5writer", "--dir", str(src),
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


# ---------------------------------------------------------------- P6


def creator(argv):
    """Hidden subcommand: creates N files of SIZE bytes as fast as possible, 1000 per new subfolder."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    a = ap.parse_args(argv)
    buf = bytearray(os.urandom(a.size))
    t0 = time.time_ns()
    for i in range(a.files):
        sub = os.path.join(a.dir, f"d{i // 1000:03d}")
        if i % 1000 == 0:
            os.mkdir(sub)
        struct.pack_into("<Q", buf, 0, i)
        fd = os.open(os.path.join(sub, f"f{i:06d}.dat"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, buf)
        os.close(fd)
    print(json.dumps({"start": t0, "end": time.time_ns(), "files": a.files}), flush=True)


def run_creator(b: Bench, src: Path) -> dict:
    cp = subprocess.run([sys.executable, __file__, "_creator", "--dir", str(src),
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


# ---------------------------------------------------------------- P7


def scenario_p7(b: Bench):
    secs, rate, kills = b.p["p7_seconds"], b.p["p7_rate"], b.p["p7_kills"]
    say(f"[P7] kill -9 of the sink under load ({b.p['p1_streams']} streams × {rate:.0f} MiB/s for {secs}s), "
        f"{kills} times; resume = restart → first increase of placed_bytes (status every 50 ms)")
    d = b.fresh("p7")
    src = b.fresh_src("p7")
    os.sync()
    pl = Pipeline(b, d, src)
    kill_log = []
    try:
        pl.start_watcher()
        time.sleep(0.5)
        sim = b.sim(d, "sim", src, "--streams", b.p["p1_streams"], "--rate", rate, "--frame", "1MiB",
                    "--chunk", "64MiB", "--duration", f"{secs}s")
        time.sleep(min(2.0, secs / 4))
        for k in range(kills):
            before = pl.status()
            pl.sink.kill9()
            t_restart = now_ns()
            pl.restart_sink()
            first, t_first, t_resume, resumed_at = None, None, None, None
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                st = pl.status()
                t = now_ns()
                if st is not None:
                    if first is None:
                        first, t_first = st["placed_bytes"], t
                    elif st["placed_bytes"] > first:
                        t_resume, resumed_at = t, st["placed_bytes"]
                        break
                if not pl.sink.alive():
                    raise BenchError(f"restarted sink exited: {pl.sink.log_tail()}")
                time.sleep(0.05)
            pl.cl.poll()
            later = [r[3] for r in pl.cl.records if r[3] > t_restart]
            t_commit = min(later) if later else None
            entry = {"kill": k + 1, "before_kill_placed": before and before["placed_bytes"],
                     "first_answer_s": t_first and (t_first - t_restart) / 1e9,
                     "resume_s": t_resume and (t_resume - t_restart) / 1e9,
                     "first_commit_after_restart_s": t_commit and (t_commit - t_restart) / 1e9}
            kill_log.append(entry)
            say(f"  kill {k + 1}: sink answers after {fmt(entry['first_answer_s'], '.2f')}s, placed_bytes "
                f"grows after {fmt(entry['resume_s'], '.2f')}s (first commit in the commit log after "
                f"{fmt(entry['first_commit_after_restart_s'], '.3f')}s)")
            time.sleep(1.5)
        if sim.wait(secs + 60) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        total, nfiles = dir_bytes(src)
        deadline = time.monotonic() + 300
        st = None
        while time.monotonic() < deadline:
            st = pl.status()
            if st and st["placed_bytes"] >= total:
                break
            time.sleep(0.2)
        m = pl.finish(total)
    finally:
        pl.kill_all()
    ok, text = b.verify(src, pl.dest)
    audit_cp = b.tf("audit", "--state", pl.sink_state, check=False)
    try:
        audit = json.loads(audit_cp.stdout[audit_cp.stdout.find("{"):])
    except (json.JSONDecodeError, ValueError):
        audit = {"error": audit_cp.stdout + audit_cp.stderr}
    worst = max((e["resume_s"] for e in kill_log if e["resume_s"] is not None), default=None)
    if any(e["resume_s"] is None for e in kill_log):
        worst = None
    placed = (m.get("status") or {}).get("placed_bytes")
    clean = ok and audit.get("overlapping_placements") == 0 and audit.get("record_mismatches") == 0
    m.update({"kills": kill_log, "verified": ok, "verify_report": None if ok else text, "audit": audit,
              "total_bytes": total, "files": nfiles, "worst_resume_s": worst, "placed_bytes": placed})
    b.results["scenarios"]["P7"] = m
    say(f"[P7] worst resume {fmt(worst, '.2f')}s (target ≤{TARGETS['P7_resume_s']}); verify "
        f"{'identical' if ok else 'DIFFERENT'}; audit overlapping_placements "
        f"{audit.get('overlapping_placements')}, record_mismatches {audit.get('record_mismatches')}, "
        f"duplicate_bytes {audit.get('duplicate_bytes')}, rewritten_bytes {audit.get('rewritten_bytes')}; "
        + cpu_line(m))
    b.row(id="P7", scenario=f"sink kill -9 under load → streaming resumes (worst of {kills})",
          figure=f"{fmt(worst, '.2f')} s", peer="—", ratio=None, target=f"≤{TARGETS['P7_resume_s']} s",
          met=met_le(worst, TARGETS["P7_resume_s"]))
    b.row(id="P7", scenario="… bytes lost / recorded twice (verify + audit)",
          figure="0 / 0" if clean else f"verify {'ok' if ok else 'FAILED'}, overlaps "
          f"{audit.get('overlapping_placements')}, mismatches {audit.get('record_mismatches')}",
          peer="—", ratio=None, target="0 / 0", met="yes" if clean else "no")
    rmtree(src)
    rmtree(pl.dest_root)


# ---------------------------------------------------------------- report


def fmt(v, spec):
    return "?" if v is None else format(v, spec)


def fmt_mb(v):
    return "?" if v is None else f"{v / 1e6:.0f} MB/s"


def parse_size(text: str) -> int:
    """Bytes in a size such as `4MiB`, as the simulator reads it."""
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "B": 1}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def fmt_ms(v):
    if v is None:
        return "?"
    if v >= 10000:
        return f"{v / 1000:.1f} s"
    return f"{v:.2f} ms" if v < 100 else f"{v:.0f} ms"


def met(r, target):
    return "?" if r is None else ("yes" if r >= target else "no")


def met_le(v, target):
    return "?" if v is None else ("yes" if v <= target else "no")


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
                         f"{per['place']:.1f} µs, writing journaled ranges into their files {per['file_write']:.1f} µs, "
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
  Destination content is compared with the source at the end. The **floor** (`tailflight floor ship` / `land`)
  runs the same workload after each tailflight run through the least such a tool must do: inotify, one read
  per file with events, one TCP message per read of events, one write + fdatasync of a preallocated ring file
  per round of arrived messages; it places nothing into destination files and keeps no manifest.
- **WAN** (P4): watcher → `tailflight delay-line` on the host (holds each chunk RTT/2 per direction,
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


def make_plots(b: Bench, out: Path, stem: str) -> list[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        b.notes.append("matplotlib missing: no plots.")
        return []
    sc = b.results["scenarios"]
    names = []
    try:
        if "P1" in sc:
            fig, ax = plt.subplots(figsize=(8, 4.5))
            for key, style in (("P1", "-"), ("P2", "--")):
                for r in sc.get(key, {}).get("runs", []):
                    s = r.get("series") or []
                    ax.plot([x for x, _ in s], [y for _, y in s], style, label=f"{key} {r['name']}")
            c = sc.get("ceilings", {})
            if c.get("disk"):
                ax.axhline(c["disk"] / 1e6, color="grey", linestyle=":", label="disk ceiling (fio)")
            if c.get("tcp4") and (not c.get("disk") or c["tcp4"] < 3 * c["disk"]):
                ax.axhline(c["tcp4"] / 1e6, color="black", linestyle=":", label="TCP ceiling (iperf3)")
            ax.set_xlabel("seconds since the simulator started")
            ax.set_ylabel("MB/s recorded by the sink (0.25 s bins)")
            ax.set_title("P1/P2 throughput over time")
            ax.legend(fontsize=7)
            name = f"{stem}-p1-throughput.png"
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            names.append(name)
        if "P3" in sc:
            fig, ax = plt.subplots(figsize=(8, 4.5))
            for i, r in enumerate(sc["P3"]["tailflight"]):
                pts = r.get("cdf") or []
                ax.plot([max(x, 1e-3) for x, _ in pts], [y for _, y in pts], label=f"tailflight run {i + 1}")
            for r in sc["P3"].get("linger0", []):
                pts = r.get("cdf") or []
                ax.plot([max(x, 1e-3) for x, _ in pts], [y for _, y in pts], ":", label="tailflight --linger 0ms")
            for r in sc["P3"].get("journal", []):
                pts = r.get("cdf") or []
                ax.plot([max(x, 1e-3) for x, _ in pts], [y for _, y in pts], "-.", label=NO_JOURNAL_LABEL)
            for r in sc["P3"].get("two_writers", []) + sc["P3"].get("rotating", []):
                pts = r.get("cdf") or []
                ax.plot([max(x, 1e-3) for x, _ in pts], [y for _, y in pts], "--", label=r.get("label"))
            for label, runs in sc["P3"]["peers"].items():
                color = None
                for r in runs:
                    pts = r.get("cdf") or []
                    line, = ax.plot([max(x, 1e-3) for x, _ in pts], [y for _, y in pts], "--", color=color,
                                    label=label if color is None else None)
                    color = line.get_color()
            ax.set_xscale("log")
            ax.set_xlabel("append → durable (tailflight) / visible at destination (peers), ms")
            ax.set_ylabel("fraction of writes")
            ax.set_title("P3 latency CDF")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            name = f"{stem}-p3-latency-cdf.png"
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            names.append(name)
        if "P4" in sc and sc["P4"].get("medians"):
            p4 = sc["P4"]
            fig, ax = plt.subplots(figsize=(8, 4.5))
            rtts = p4["rtts"]
            for key, label in (("tf4", "tailflight, 4 connections"), ("tf1", "tailflight, 1 connection"),
                               ("rsync", "rsync daemon")):
                ax.plot(rtts, [(p4["medians"][key][r] or 0) / 1e6 for r in rtts], "o-", label=label)
            if p4.get("link_bytes_per_s"):
                ax.axhline(p4["link_bytes_per_s"] / 1e6, color="grey", linestyle=":", label="link (iperf3, 0 ms)")
            ax.set_xlabel("emulated RTT, ms")
            ax.set_ylabel("MB/s")
            ax.set_ylim(bottom=0)
            ax.set_title("P4 throughput vs emulated RTT" + (f" ({b.p['p4_rate']} tbf veth)" if p4.get("link_bytes_per_s") else
                                                              " (loopback, no rate limit)"))
            ax.legend(fontsize=8)
            name = f"{stem}-p4-rtt.png"
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            names.append(name)
    except Exception as e:  # plots are a nicety; the tables must still be written
        b.notes.append(f"plotting failed: {e}")
    return names


# ---------------------------------------------------------------- main


SCENARIOS = [("ceilings", scenario_ceilings), ("P1", scenario_p1_p2), ("P3", scenario_p3),
             ("P6", scenario_p6), ("P7", scenario_p7), ("P4", scenario_p4), ("P5", scenario_p5)]


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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
            (tot1, idle1), (tot0, idle0) = cpu_times(), busy0
            if tot1 > tot0:
                b.results.setdefault("machine", {})[name] = {
                    "busy_cores": (1 - (idle1 - idle0) / (tot1 - tot0)) * (os.cpu_count() or 1),
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


if __name__ == "__main__":
    sys.exit(main())
