#!/usr/bin/env python3
"""The soak: simulator -> watcher -> sink for many cycles, each
cycle killing (-9) the sink, the watcher or both at a random moment, or
cutting the network for a few seconds; then verify (byte-identical), audit
(manifest vs files) and a summary with the processes' memory and descriptors.

Started by ops/soak.sh (which builds the binary); Python 3.11 standard
library only. Run `ops/soak.sh --help` for the options.

Layout of the work dir (kept after the run, minus the bulky data on success):
    bin/tailflight      the binary, copied at start so a rebuild meanwhile
                        cannot change it under the run
    source/ dest/       the simulator's files and the sink's root
    sink-state/ watch-state/
    logs/{sink,watcher,sim}.log
    samples.csv         one row per process per sampling tick
    cycles.csv          one row per cycle
    summary.md          what the run found
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("kill-sink", "kill-watcher", "kill-both", "cut")
SOURCE_NAME = "soak"
RUN = "r0001"
# A work dir is only ever wiped if it holds this marker: a mistyped
# --workdir must not delete someone's files.
MARKER = ".tailflight-soak"
NETNS_PREFIX = "tfsoak"
# The sink's own counts of what it holds in memory, recorded per cycle.
HELD_FIELDS = ("held_bytes", "placements_waiting", "placements_running", "journal_backlog_bytes",
               "manifest_memory_bytes", "heap_live_bytes", "heap_peak_bytes", "resident_bytes",
               "anonymous_bytes")


def held_figures(status: dict) -> dict:
    """The HELD_FIELDS of a sink status; the heap's (by the program's allocator count, in
    status.process.heap) as heap_live_bytes and heap_peak_bytes, and the resident memory the
    kernel counts (status.process.memory) as resident_bytes and anonymous_bytes."""
    process = status.get("process") or {}
    heap = process.get("heap") or {}
    memory = process.get("memory") or {}
    flat = dict(status, heap_live_bytes=heap.get("live_bytes", 0), heap_peak_bytes=heap.get("peak_bytes", 0),
                resident_bytes=memory.get("resident_bytes", 0), anonymous_bytes=memory.get("anonymous_bytes", 0))
    return {key: flat.get(key, 0) for key in HELD_FIELDS}


# Seconds of readings after a cut whose median is the sink's memory after it
# (with --memory-bound).
MEMORY_READING_S = 3.0
# Quarters of fewer than two cycles each say nothing about growth.
MIN_CYCLES_TO_JUDGE = 8


def log(message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[soak {stamp}] {message}", flush=True)


class SoakFailure(Exception):
    """A check failed: the run ends, is summarised and exits non-zero."""


# --------------------------------------------------------------------------
# Arguments


def parse_duration(text: str) -> float:
    """'900', '900s', '15m', '1h' -> seconds."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 15m, 1h)")
    value = float(match.group(1))
    return value * {"ms": 0.001, None: 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ops/soak.sh",
        description="Soak the pipeline: kill -9 the sink, the watcher or both, "
        "and cut the network, at random moments, then verify and audit.",
    )
    parser.add_argument("--cycles", type=int, default=None,
                        help="cycles to run (default 100; with --duration alone, as many as fit)")
    parser.add_argument("--duration", type=parse_duration, default=None,
                        help="start no new cycle after this long (e.g. 20m); with --cycles, whichever comes first")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the random choices (printed; default: from the clock)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="work dir (default: $TMPDIR/tailflight-soak); wiped at start if it is a soak's")
    parser.add_argument("--binary", type=Path, required=True, help="the tailflight binary (copied into the work dir)")
    parser.add_argument("--summary", type=Path, default=None,
                        help="also write the summary here (e.g. ops/soak/results/DATE.md)")
    parser.add_argument("--quick", action="store_true",
                        help="small workload and short delays (the CI run); other flags still win")
    parser.add_argument("--memory-bound", type=float, default=None, metavar="RATIO",
                        help="fail unless the sink's RSS once bytes flow again after the last cut (the median of "
                             "3 s of readings from its status) is within RATIO x that after the first (e.g. 1.5 "
                             "with --faults cut); both are reported "
                             "either way, beside the heap by the program's own count")
    parser.add_argument("--warmup", type=parse_duration, default=None,
                        help="let the workload run this long before the first fault (default 0; with "
                             "--memory-bound, one burst period of the default workload, 65s, or 15s with "
                             "--quick), so the first cut's figure is taken at the working set, not before it")
    parser.add_argument("--loopback", action="store_true",
                        help="plain loopback even as root (cuts become a SIGSTOP freeze of the sink)")
    parser.add_argument("--keep-data", action="store_true",
                        help="keep source/ and dest/ after a clean run (kept anyway on failure)")
    parser.add_argument("--faults", default=",".join(KINDS),
                        help=f"the kinds of fault to draw from, comma-separated (default {','.join(KINDS)}); "
                        "e.g. `--faults cut` keeps one sink and one watcher alive through every cut, "
                        "which shows a leak within a process's life")
    parser.add_argument("--strict-growth", action="store_true",
                        help="also fail when the no-growth judgement says RSS or descriptors grew")
    # Timing and workload: defaults depend on --quick (filled in below).
    parser.add_argument("--delay", type=float, nargs=2, metavar=("MIN", "MAX"),
                        help="seconds before each cycle's fault, uniform (default 2 8; quick 1 2.5)")
    parser.add_argument("--cut", type=float, nargs=2, metavar=("MIN", "MAX"),
                        help="seconds the link stays down (default 2 6; quick 1 2)")
    parser.add_argument("--down", type=float, nargs=2, metavar=("MIN", "MAX"),
                        help="seconds between a kill and the restart (default 0 0.5)")
    parser.add_argument("--sample-every", type=float, default=None,
                        help="seconds between RSS/descriptor samples (default 1; quick 0.5)")
    parser.add_argument("--recover-timeout", type=parse_duration, default=parse_duration("120s"),
                        help="bytes must flow again within this after each fault (default 120s)")
    parser.add_argument("--drain-timeout", type=parse_duration, default=parse_duration("300s"),
                        help="every file sealed and identical within this after the simulator stops (default 300s)")
    parser.add_argument("--sim", default=None,
                        help="simulator flags, one string (default: 4 streams, 40 Hz, 16KiB frames, "
                        "8MiB chunks, a 4x burst of 5 s every 60 s; quick: 2 streams, 50 Hz, 1MiB chunks)")
    args = parser.parse_args(argv)

    if args.cycles is None:
        # --duration alone: as many cycles as fit (still a bounded count).
        args.cycles = 100_000 if args.duration is not None else 100
    args.faults = [kind.strip() for kind in args.faults.split(",") if kind.strip()]
    unknown = [kind for kind in args.faults if kind not in KINDS]
    if unknown or not args.faults:
        parser.error(f"--faults: unknown kind(s) {unknown}; choose from {', '.join(KINDS)}")
    if args.cycles < 1:
        parser.error("--cycles must be at least 1")
    quick = args.quick
    args.delay = args.delay or ([1.0, 2.5] if quick else [2.0, 8.0])
    args.cut = args.cut or ([1.0, 2.0] if quick else [2.0, 6.0])
    args.down = args.down or [0.0, 0.5]
    for name in ("delay", "cut", "down"):
        low, high = getattr(args, name)
        if low < 0 or high < low:
            parser.error(f"--{name}: need 0 <= MIN <= MAX")
    args.sample_every = args.sample_every or (0.5 if quick else 1.0)
    if args.warmup is None:
        args.warmup = 0.0 if args.memory_bound is None else (15.0 if quick else 65.0)
    if args.sim is None:
        args.sim = (
            "--streams 2 --rate 50 --frame 16KiB --chunk 1MiB"
            if quick
            else "--streams 4 --rate 40 --frame 16KiB --chunk 8MiB "
            "--burst-every 60s --burst-len 5s --burst-factor 4"
        )
    if args.seed is None:
        args.seed = time.time_ns() % (1 << 32)
    if args.workdir is None:
        args.workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "tailflight-soak"
    args.workdir = args.workdir.resolve()
    return args


# --------------------------------------------------------------------------
# Child processes

def _die_with_parent_prefix() -> list[str]:
    """`setpriv --pdeathsig KILL`, which execs the command with the kernel's
    parent-death signal set: if the soak itself is killed (even with -9,
    when no cleanup can run), its children die with it instead of streaming
    on as orphans. (Not Popen's preexec_fn: unsafe with the sampler thread.)
    Children are only started from the main thread, whose exit the kernel
    watches."""
    if shutil.which("setpriv"):
        return ["setpriv", "--pdeathsig", "KILL"]
    return []


DIE_WITH_PARENT = _die_with_parent_prefix()


class Proc:
    """One of sink, watcher, simulator: restartable, each start a new
    incarnation, output appended to logs/<name>.log."""

    def __init__(self, name: str, argv: list[str], logfile: Path, prefix: list[str] | None = None):
        self.name = name
        self.argv = argv
        self.prefix = prefix or []
        self.logfile = logfile
        self.popen: subprocess.Popen | None = None
        self.incarnation = 0
        self.lock = threading.Lock()  # the sampler reads pid/incarnation

    def start(self, cycle: int) -> None:
        assert self.popen is None, f"{self.name} is already running"
        with self.lock:
            self.incarnation += 1
            with open(self.logfile, "a") as out:
                out.write(f"\n=== soak: {self.name} incarnation {self.incarnation} "
                          f"(cycle {cycle}) at {time.strftime('%H:%M:%S')} ===\n")
                out.flush()
                env = dict(os.environ, TAILFLIGHT_LOG=os.environ.get("TAILFLIGHT_LOG", "info"))
                # A session of its own: Ctrl-C at the terminal reaches the
                # soak only, which then stops everything in order.
                self.popen = subprocess.Popen(
                    DIE_WITH_PARENT + self.prefix + self.argv, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=out, env=env, start_new_session=True,
                )

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        with self.lock:
            if self.popen is not None:
                if self.popen.poll() is None:
                    self.popen.kill()
                self.popen.wait(timeout=30)
                self.popen = None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code."""
        with self.lock:
            if self.popen is None:
                return None
            code = self.popen.poll()
            if code is None:
                self.popen.terminate()
                try:
                    code = self.popen.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    log(f"{self.name} did not stop within {timeout:.0f}s of SIGTERM: SIGKILL")
                    self.popen.kill()
                    code = self.popen.wait(timeout=30)
            self.popen = None
            return code

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.kill(self.popen.pid, sig)


# --------------------------------------------------------------------------
# The network: a namespace for the sink, joined to the host by a veth pair


def ip(*args: str, check: bool = True) -> bool:
    result = subprocess.run(["ip", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if check and result.returncode != 0:
        raise SoakFailure(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result.returncode == 0


class Network:
    """Where the sink listens and how the link is cut. As root: a namespace
    `tfsoak<pid>` with the sink inside, `10.253.N.2`, reached through the
    veth pair whose host end is taken down to cut the link. Otherwise plain
    loopback, and a cut is a SIGSTOP freeze of the sink (its sockets stay
    open and silent, as behind a dead link)."""

    def __init__(self, use_netns: bool):
        self.use_netns = use_netns
        self.made = False
        pid = os.getpid()
        self.name = f"{NETNS_PREFIX}{pid}"
        self.host_if = f"tfsoakh{pid}"[:15]
        self.ns_if = f"tfsoakn{pid}"[:15]
        # 10.253/16: the tests' namespaces use 10.252/16.
        self.subnet = f"10.253.{pid % 250 + 1}"
        self.link_up = True

    @property
    def host(self) -> str:
        return f"{self.subnet}.2" if self.use_netns else "127.0.0.1"

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name] if self.use_netns else []

    @staticmethod
    def sweep_stale() -> None:
        """Removes namespaces (and their veths) of earlier soaks that died
        without cleaning up (killed -9): their pid in the name is gone."""
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for line in listing.splitlines()[:1000]:
            match = re.match(rf"({NETNS_PREFIX}(\d+))\b", line)
            if match and not Path(f"/proc/{match.group(2)}").exists():
                log(f"removing a stale namespace of a dead soak: {match.group(1)}")
                ip("netns", "del", match.group(1), check=False)
                ip("link", "del", f"tfsoakh{match.group(2)}"[:15], check=False)

    def create(self) -> None:
        if not self.use_netns:
            return
        self.sweep_stale()
        ip("netns", "del", self.name, check=False)
        ip("netns", "add", self.name)
        self.made = True
        ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        ip("link", "set", self.ns_if, "netns", self.name)
        ip("addr", "add", f"{self.subnet}.1/24", "dev", self.host_if)
        ip("link", "set", self.host_if, "up")
        ip("netns", "exec", self.name, "ip", "addr", "add", f"{self.subnet}.2/24", "dev", self.ns_if)
        ip("netns", "exec", self.name, "ip", "link", "set", self.ns_if, "up")
        ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")
        log(f"network: sink in namespace {self.name} at {self.host}, "
            f"reached through veth {self.host_if} <-> {self.ns_if}")

    def set_link(self, up: bool) -> None:
        ip("link", "set", self.host_if, "up" if up else "down")
        self.link_up = up

    def remove(self) -> None:
        if self.made:
            ip("netns", "del", self.name, check=False)
            # Deleting the namespace deletes the pair; this is in case not.
            ip("link", "del", self.host_if, check=False)
            self.made = False


# --------------------------------------------------------------------------
# Sampling RSS and descriptors


def read_proc(pid: int) -> tuple[int, int, int, int, int] | None:
    """(VmHWM, VmRSS, RssAnon, RssFile in KiB, open descriptors), or None if
    the process is gone or a zombie (killed, not yet reaped). RssAnon is the
    heap and stacks: a leak grows it; RssFile is mapped files (the binary,
    RocksDB's files), which the kernel may drop."""
    fields = {"VmHWM:": None, "VmRSS:": None, "RssAnon:": None, "RssFile:": None}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                name = line.split(maxsplit=1)[0] if line.strip() else ""
                if name in fields:
                    fields[name] = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if fields["VmHWM:"] is None or fields["VmRSS:"] is None:
        return None
    return (fields["VmHWM:"], fields["VmRSS:"], fields["RssAnon:"] or 0, fields["RssFile:"] or 0, fds)


@dataclass
class Sample:
    elapsed: float
    cycle: int
    process: str
    incarnation: int
    pid: int
    hwm_kib: int
    rss_kib: int
    anon_kib: int
    file_kib: int
    fds: int


class Sampler(threading.Thread):
    """Samples the sink and the watcher every `every` seconds into
    samples.csv, tagged with the cycle under way."""

    def __init__(self, procs: list[Proc], every: float, path: Path, t0: float):
        super().__init__(daemon=True, name="sampler")
        self.procs = procs
        self.every = every
        self.t0 = t0
        self.cycle = 0
        self.samples: list[Sample] = []
        self.stopping = threading.Event()
        self.file = open(path, "w", newline="")
        self.writer = csv.writer(self.file)
        self.writer.writerow(["elapsed_s", "cycle", "process", "incarnation", "pid",
                              "vm_hwm_kib", "vm_rss_kib", "rss_anon_kib", "rss_file_kib", "fds"])

    def run(self) -> None:
        while not self.stopping.wait(self.every):
            self.tick()

    def tick(self) -> None:
        for proc in self.procs:
            with proc.lock:
                pid, incarnation = proc.pid, proc.incarnation
            if pid is None:
                continue
            got = read_proc(pid)
            if got is None:
                continue
            sample = Sample(round(time.monotonic() - self.t0, 2), self.cycle, proc.name,
                            incarnation, pid, *got)
            self.samples.append(sample)
            self.writer.writerow([sample.elapsed, sample.cycle, sample.process, sample.incarnation,
                                  sample.pid, sample.hwm_kib, sample.rss_kib, sample.anon_kib,
                                  sample.file_kib, sample.fds])
        self.file.flush()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)
        self.file.close()


# --------------------------------------------------------------------------
# The soak


@dataclass
class Cycle:
    number: int
    kind: str
    delay_s: float
    outage_s: float
    recovery_s: float | None = None
    # Per process: max VmRSS / VmHWM (KiB) and max descriptors in the cycle.
    metrics: dict = field(default_factory=dict)
    # What the sink holds in memory by its own count, once bytes flow again.
    held: dict = field(default_factory=dict)
    # The sink's VmRSS and RssAnon (KiB) at that moment.
    rss_after_kib: int | None = None
    anon_after_kib: int | None = None


class Soak:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rng = random.Random(args.seed)
        self.dir: Path = args.workdir
        self.t0 = time.monotonic()
        self.use_netns = os.geteuid() == 0 and not args.loopback and shutil.which("ip") is not None
        self.net = Network(self.use_netns)
        self.procs: list[Proc] = []
        self.sampler: Sampler | None = None
        self.cycles: list[Cycle] = []
        self.failures: list[str] = []
        self.results: dict = {}

    # ---- setup

    def prepare_dir(self) -> None:
        d = self.dir
        if d.exists() and any(d.iterdir()) and not (d / MARKER).exists():
            raise SoakFailure(f"{d} is not empty and not a soak's work dir: choose another --workdir")
        if d.exists():
            shutil.rmtree(d)
        for sub in ("bin", "source", "dest", "logs"):
            (d / sub).mkdir(parents=True)
        (d / MARKER).write_text("a tailflight soak's work dir: ops/soak.sh may wipe it\n")
        self.bin = d / "bin" / "tailflight"
        # The run uses one binary throughout, whatever is rebuilt meanwhile.
        shutil.copy2(self.args.binary, self.bin)

    def tf(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin), *args], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, TAILFLIGHT_LOG="warn"))

    def start_pipeline(self) -> None:
        d = self.dir
        port = 50_000 + self.rng.randrange(10_000) if self.use_netns else free_port()
        self.endpoint = f"http://{self.net.host}:{port}"
        self.sink = Proc("sink", [str(self.bin), "sink", "--root", str(d / "dest"),
                                  "--state", str(d / "sink-state"), "--listen", f"{self.net.host}:{port}"],
                         d / "logs" / "sink.log", prefix=self.net.prefix)
        self.watcher = Proc("watcher", [str(self.bin), "watch", "--dir", str(d / "source"),
                                        "--source", SOURCE_NAME, "--to", self.endpoint,
                                        "--state", str(d / "watch-state"),
                                        # Seal and rescan quickly, as the tests do, so
                                        # the drain at the end is short.
                                        "--seal-idle", "1s", "--rescan", "1s"],
                            d / "logs" / "watcher.log")
        # Long enough to outlast every cycle; stopped (SIGTERM) when they end,
        # which makes it rename its last chunks and write its end marker.
        self.sim = Proc("sim", [str(self.bin), "sim", "--dir", str(d / "source"), "--run", RUN,
                                "--seed", str(self.args.seed), *self.args.sim.split(), "--duration", "86400s"],
                        d / "logs" / "sim.log")
        self.procs = [self.sink, self.watcher, self.sim]
        self.sink.start(0)
        self.wait_status("the sink answers", 60)
        self.sim.start(0)
        self.watcher.start(0)
        self.sampler = Sampler([self.sink, self.watcher], self.args.sample_every, d / "samples.csv", self.t0)
        self.sampler.start()
        started = time.monotonic()
        self.wait_placed_beyond(0, self.args.recover_timeout, "the first bytes are placed")
        log(f"bytes flow ({time.monotonic() - started:.1f}s after start)")

    # ---- status

    def status(self) -> dict | None:
        try:
            result = self.tf("status", "--to", self.endpoint, timeout=20)
        except subprocess.TimeoutExpired:
            return None
        if result.returncode != 0:
            return None
        start = result.stdout.find("{")
        try:
            return json.loads(result.stdout[start:].splitlines()[0]) if start >= 0 else None
        except (json.JSONDecodeError, IndexError):
            return None

    def wait_status(self, what: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None:
                return status
            self.check_alive()
            time.sleep(0.2)
        raise SoakFailure(f"timed out after {timeout:.0f}s waiting for: {what}")

    def wait_placed_beyond(self, placed: int, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None and status.get("placed_bytes", 0) > placed:
                return
            self.check_alive()
            time.sleep(0.2)
        raise SoakFailure(f"timed out after {timeout:.0f}s waiting for: {what}")

    def check_alive(self) -> None:
        """A process that died by itself (not killed by us) is a failure."""
        for proc in self.procs:
            if proc.popen is not None and proc.popen.poll() is not None:
                raise SoakFailure(f"{proc.name} exited by itself with code {proc.popen.returncode} "
                                  f"(see {proc.logfile})")

    # ---- cycles

    def deck(self):
        """The faults in blocks, each chosen kind once per block in random
        order: random moments and order, balanced counts."""
        while True:
            block = list(self.args.faults)
            self.rng.shuffle(block)
            yield from block

    def run_cycles(self) -> None:
        deck = self.deck()
        if self.args.warmup > 0:
            log(f"warm-up: the workload runs {self.args.warmup:.0f}s before the first fault")
            until = time.monotonic() + self.args.warmup
            while time.monotonic() < until:
                self.check_alive()
                time.sleep(min(1.0, max(0.0, until - time.monotonic())))
        for number in range(1, self.args.cycles + 1):
            elapsed = time.monotonic() - self.t0
            if self.args.duration is not None and elapsed >= self.args.duration:
                log(f"--duration reached after {number - 1} cycles")
                break
            kind = next(deck)
            delay = self.rng.uniform(*self.args.delay)
            outage = self.rng.uniform(*(self.args.cut if kind == "cut" else self.args.down))
            cycle = Cycle(number, kind, round(delay, 2), round(outage, 2))
            self.cycles.append(cycle)
            self.sampler.cycle = number
            time.sleep(delay)
            self.check_alive()
            self.fault(kind, outage)
            # Recovery: the sink answers and places new bytes again (from the
            # restart or the link's return).
            back = time.monotonic()
            status = self.wait_status(f"the sink answers after cycle {number} ({kind})",
                                      self.args.recover_timeout)
            self.wait_placed_beyond(status.get("placed_bytes", 0),
                                    max(1.0, self.args.recover_timeout - (time.monotonic() - back)),
                                    f"bytes flow again after cycle {number} ({kind})")
            cycle.recovery_s = round(time.monotonic() - back, 2)
            now = self.status() or {}
            cycle.held = held_figures(now)
            # The sink's own status says its resident memory; /proc where an
            # older binary does not. For a memory bound, the median over the
            # seconds after: one reading lands on a moment of the catch-up
            # (how many threads are busy), the median on its level.
            if cycle.held.get("resident_bytes"):
                readings = [cycle.held]
                until = time.monotonic() + (MEMORY_READING_S if self.args.memory_bound is not None else 0)
                while time.monotonic() < until:
                    time.sleep(0.2)
                    more = held_figures(self.status() or {})
                    if more.get("resident_bytes"):
                        readings.append(more)
                cycle.rss_after_kib = statistics.median(r["resident_bytes"] for r in readings) // 1024
                cycle.anon_after_kib = statistics.median(r["anonymous_bytes"] for r in readings) // 1024
            else:
                with self.sink.lock:
                    sink_pid = self.sink.pid
                got = read_proc(sink_pid) if sink_pid else None
                if got is not None:
                    cycle.rss_after_kib, cycle.anon_after_kib = got[1], got[2]
            log(f"cycle {number}/{self.args.cycles}: {kind:<12} after {delay:4.1f}s, "
                f"{'down' if kind != 'cut' else 'cut'} {outage:3.1f}s, bytes flow again in {cycle.recovery_s:.1f}s; "
                + ", ".join(f"{key} {value}" for key, value in cycle.held.items()))
        self.sampler.cycle = len(self.cycles) + 1  # the drain

    def fault(self, kind: str, outage: float) -> None:
        number = len(self.cycles)
        if kind == "cut":
            if self.use_netns:
                self.net.set_link(False)
                time.sleep(outage)
                self.net.set_link(True)
            else:
                # Loopback cannot be cut: freeze the sink instead.
                self.sink.signal(signal.SIGSTOP)
                time.sleep(outage)
                self.sink.signal(signal.SIGCONT)
            return
        victims = {"kill-sink": [self.sink], "kill-watcher": [self.watcher],
                   "kill-both": [self.watcher, self.sink]}[kind]
        if kind == "kill-both":
            self.rng.shuffle(victims)
        for proc in victims:
            proc.kill9()
        time.sleep(outage)
        # The sink first, so a restarted watcher finds it.
        for proc in (self.sink, self.watcher):
            if proc in victims:
                proc.start(number)

    # ---- the end

    def finish(self) -> None:
        """Stop the simulator, let the pipeline finish, then verify and audit."""
        log("stopping the simulator (SIGTERM: it renames its last chunks and writes its end marker)")
        code = self.sim.stop(timeout=60)
        marker = self.dir / "source" / f"{RUN}.end.json"
        if not marker.exists():
            raise SoakFailure(f"the simulator wrote no end marker (exit code {code}); see {self.sim.logfile}")
        end = json.loads(marker.read_text())
        expected_files = len(end.get("files", [])) + 1  # the chunks and the marker itself
        self.results["source_files"] = expected_files
        self.results["source_bytes"] = end.get("bytes")
        log(f"the simulator wrote {expected_files} files, {end.get('bytes', 0) / 2**20:.0f} MiB; "
            "waiting for the sink to seal them all")
        drain_start = time.monotonic()
        deadline = drain_start + self.args.drain_timeout
        last = None
        while time.monotonic() < deadline:
            self.check_alive()
            last = self.status() or last
            if last is not None and last.get("sealed_files", 0) >= expected_files:
                break
            time.sleep(0.5)
        else:
            raise SoakFailure(f"the sink sealed {last and last.get('sealed_files')} of {expected_files} files "
                              f"within {self.args.drain_timeout:.0f}s (last status {last})")
        # Sealed is recorded; identical may lag a moment behind the renames.
        verify = None
        while time.monotonic() < deadline:
            verify = self.verify()
            if verify["ok"]:
                break
            time.sleep(0.5)
        self.results["drain_s"] = round(time.monotonic() - drain_start, 1)
        self.results["final_status"] = last
        log(f"drained in {self.results['drain_s']}s; stopping the watcher and the sink")
        self.sampler.stop()
        self.results["watcher_exit"] = self.watcher.stop()
        self.results["sink_exit"] = self.sink.stop()
        # Once more with both stopped: nothing may change after the fact.
        verify = self.verify()
        self.results["verify"] = verify
        if not verify["ok"]:
            raise SoakFailure(f"verify: source and destination differ: {verify['text'][:2000]}")
        if verify["files"] != expected_files:
            raise SoakFailure(f"verify compared {verify['files']} files, the simulator wrote {expected_files}")
        self.audit(expected_files)
        if last and last.get("poisoned"):
            raise SoakFailure(f"the sink poisoned itself: {last['poisoned']}")

    def verify(self) -> dict:
        result = self.tf("verify", "--json", str(self.dir / "source"), str(self.dir / "dest" / SOURCE_NAME),
                         timeout=600)
        report = {}
        try:
            report = json.loads(result.stdout[result.stdout.find("{"):])
        except json.JSONDecodeError:
            pass
        return {
            "ok": result.returncode == 0 and not report.get("diffs"),
            "files": report.get("files_compared"),
            "identical": report.get("identical"),
            "bytes": report.get("bytes_compared"),
            "text": (result.stdout + result.stderr).strip(),
        }

    def audit(self, expected_files: int) -> None:
        """`tailflight audit --files`: no range recorded twice, records match
        their audit logs; then the manifest against the files: every live
        record sealed, placed as one range [0, size) equal to its seal, and
        its destination file exactly that size; every destination file with
        a record."""
        result = self.tf("audit", "--files", "--state", str(self.dir / "sink-state"), timeout=600)
        start = result.stdout.find("{")
        if start < 0:
            raise SoakFailure(f"audit printed no report: {result.stdout}{result.stderr}")
        report = json.loads(result.stdout[start:])
        problems = list(report.get("examples", []))
        dest_root = self.dir / "dest"
        recorded = set()
        for file_id, record in report.get("records", []):
            if record.get("superseded"):
                continue
            path = dest_root / record["dest_path"]
            recorded.add(path)
            placed = [tuple(r) for r in record["placed"]["ranges"]]
            sealed = record.get("sealed")
            size = path.stat().st_size if path.exists() else None
            name = f"{file_id['source']}/{file_id['key']} gen {file_id['generation']}"
            if size is None:
                problems.append(f"{name}: {record['dest_path']} does not exist")
            elif placed != [(0, size)]:
                problems.append(f"{name}: placed {placed}, the file holds {size} bytes")
            if sealed is None:
                problems.append(f"{name}: not sealed")
            elif size is not None and sealed["size"] != size:
                problems.append(f"{name}: sealed at {sealed['size']} bytes, the file holds {size}")
        # The root's mark (which root the manifest was written with) is the sink's own.
        unrecorded = [str(p.relative_to(dest_root)) for p in dest_root.rglob("*")
                      if p.is_file() and p not in recorded and p != dest_root / ".tailflight-root-id"]
        problems += [f"{p}: a destination file without a record" for p in unrecorded[:20]]
        self.results["audit"] = {
            "exit": result.returncode,
            "files": report.get("files"),
            "sealed_files": report.get("sealed_files"),
            "placements": report.get("placements"),
            "placed_bytes": report.get("placed_bytes"),
            "duplicate_bytes": report.get("duplicate_bytes"),
            "rewritten_bytes": report.get("rewritten_bytes"),
            "overlapping_placements": report.get("overlapping_placements"),
            "record_mismatches": report.get("record_mismatches"),
            "redone_journal_rounds": report.get("redone_journal_rounds"),
            "manifest_vs_files_problems": len(problems),
            "examples": problems[:20],
        }
        clean = (result.returncode == 0 and report.get("overlapping_placements") == 0
                 and report.get("record_mismatches") == 0 and not problems)
        self.results["audit"]["clean"] = clean
        if not clean:
            raise SoakFailure(f"audit is not clean: {json.dumps(self.results['audit'])}")
        if report.get("sealed_files") != expected_files:
            raise SoakFailure(f"the manifest holds {report.get('sealed_files')} sealed files, "
                              f"the simulator wrote {expected_files}")

    # ---- cleanup

    def cleanup(self) -> None:
        """Every process we started, then the namespace: always, whatever
        happened (called from `finally`, also on Ctrl-C and SIGTERM)."""
        if self.sampler is not None and self.sampler.is_alive():
            self.sampler.stop()
        for proc in self.procs:
            try:
                if proc.popen is not None and proc.popen.poll() is None:
                    # A frozen sink would not die of SIGTERM: SIGKILL works on it.
                    proc.kill9()
                else:
                    proc.popen = None
            except Exception as error:  # keep cleaning the others
                log(f"could not stop {proc.name}: {error}")
        self.net.remove()

    # ---- summary

    def summarise(self, elapsed: float) -> str:
        args = self.args
        samples = self.sampler.samples if self.sampler else []
        per_cycle: dict[tuple[int, str], list[Sample]] = {}
        for s in samples:
            per_cycle.setdefault((s.cycle, s.process), []).append(s)
        for cycle in self.cycles:
            for process in ("sink", "watcher"):
                got = per_cycle.get((cycle.number, process), [])
                if got:
                    cycle.metrics[process] = {
                        "rss_kib": max(s.rss_kib for s in got),
                        "hwm_kib": max(s.hwm_kib for s in got),
                        "anon_kib": max(s.anon_kib for s in got),
                        "fds": max(s.fds for s in got),
                    }
        self.write_cycles_csv()

        counts = {kind: sum(1 for c in self.cycles if c.kind == kind) for kind in KINDS}
        ok = not self.failures
        lines = [
            f"# Soak: {len(self.cycles)} cycles — {'PASSED' if ok else 'FAILED'}",
            "",
            f"- Date: {time.strftime('%Y-%m-%d %H:%M %Z')}; host: {os.uname().nodename}, "
            f"{os.cpu_count()} CPUs; binary: `{self.bin_version}`",
            f"- Command: `ops/soak.sh {' '.join(self.argv_shown)}`",
            f"- Seed: {args.seed} (`--seed {args.seed}` repeats the choices of faults, delays and "
            "outages; the moments relative to the data differ run to run)",
            f"- Network: " + (f"sink in network namespace `{self.net.name}` ({self.net.host}) "
                              "behind a veth pair; a cut takes the host end down"
                              if self.use_netns else
                              "plain loopback (not root, or --loopback): a cut is a SIGSTOP freeze of the sink"),
            f"- Workload: `tailflight sim {args.sim}`",
            f"- Timing: warm-up {args.warmup:g} s before the first fault; "
            f"fault after {args.delay[0]:g}–{args.delay[1]:g} s; kill→restart "
            f"{args.down[0]:g}–{args.down[1]:g} s; link down {args.cut[0]:g}–{args.cut[1]:g} s; "
            f"samples every {args.sample_every:g} s",
            f"- Duration: {elapsed / 60:.1f} min ({elapsed:.0f} s), drain after the simulator stopped: "
            f"{self.results.get('drain_s', '—')} s",
            "",
            "## Faults",
            "",
            "| kind | count | bytes flowing again after (median / max, s) |",
            "|---|---|---|",
        ]
        for kind in KINDS:
            rec = [c.recovery_s for c in self.cycles if c.kind == kind and c.recovery_s is not None]
            figures = f"{statistics.median(rec):.1f} / {max(rec):.1f}" if rec else "—"
            lines.append(f"| {kind} | {counts[kind]} | {figures} |")
        lines.append(f"| **all** | {len(self.cycles)} | |")
        lines.append("")
        lines.append("Recovery is timed from the restart (or the link's return) to the sink's "
                     "`placed_bytes` growing again, polled with `tailflight status` (~0.2–0.5 s resolution).")
        lines += ["", "## Checks", ""]
        verify = self.results.get("verify")
        if verify:
            lines.append(f"- verify (byte-identical, after both stopped): "
                         f"{'**identical**' if verify['ok'] else '**DIFFERENT**'} — "
                         f"{verify['identical']}/{verify['files']} files, "
                         f"{(verify['bytes'] or 0) / 2**20:.1f} MiB compared")
        else:
            lines.append("- verify: not reached")
        audit = self.results.get("audit")
        if audit:
            lines.append(f"- audit (manifest, then manifest vs files): {'**clean**' if audit['clean'] else '**NOT CLEAN**'} — "
                         f"{audit['files']} files, {audit['sealed_files']} sealed, {audit['placements']} placements, "
                         f"overlapping placements {audit['overlapping_placements']}, record mismatches "
                         f"{audit['record_mismatches']}, manifest-vs-files problems {audit['manifest_vs_files_problems']}, "
                         f"redone journal rounds {audit['redone_journal_rounds']}")
            lines.append(f"- bytes: placed {(audit['placed_bytes'] or 0) / 2**20:.1f} MiB, received again and "
                         f"recognised as duplicates {(audit['duplicate_bytes'] or 0) / 2**20:.1f} MiB "
                         f"(re-delivery after the faults), rewritten {audit['rewritten_bytes']} B (written by a sink "
                         "before its kill but not yet recorded, so written again with the same bytes)")
            for example in audit["examples"]:
                lines.append(f"  - {example}")
        else:
            lines.append("- audit: not reached")
        if "source_files" in self.results:
            lines.append(f"- source: {self.results['source_files']} files (chunks and end marker), "
                         f"{(self.results.get('source_bytes') or 0) / 2**20:.1f} MiB")
        lines.append(f"- watcher log: {self.count_in_log('watcher', 'connection lost')} 'connection lost'; "
                     f"panics in any log: {sum(self.count_in_log(p, 'panicked') for p in ('sink', 'watcher', 'sim'))}")
        lines.append(f"- incarnations: sink {self.sink.incarnation if self.procs else 0}, "
                     f"watcher {self.watcher.incarnation if self.procs else 0}")
        if self.failures:
            lines += ["", "## Failures", ""] + [f"- {f}" for f in self.failures]

        lines += ["", "## Memory and descriptors", ""]
        lines += self.memory_bound_lines()
        growth = self.growth_table()
        lines += growth
        lines += ["", "## Per cycle", "",
                  "Max over the cycle's samples (any incarnation): RSS, peak RSS (VmHWM) and anonymous RSS in MiB, open descriptors.", "",
                  "| cycle | fault | after s | outage s | back in s | sink RSS | sink HWM | sink anon | sink fds "
                  "| watcher RSS | watcher HWM | watcher anon | watcher fds |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in self.cycles:
            def m(process: str, key: str) -> str:
                value = c.metrics.get(process, {}).get(key)
                if value is None:
                    return "—"
                return f"{value / 1024:.0f}" if key != "fds" else str(value)
            lines.append(f"| {c.number} | {c.kind} | {c.delay_s} | {c.outage_s} | "
                         f"{c.recovery_s if c.recovery_s is not None else '—'} | "
                         f"{m('sink', 'rss_kib')} | {m('sink', 'hwm_kib')} | {m('sink', 'anon_kib')} | {m('sink', 'fds')} | "
                         f"{m('watcher', 'rss_kib')} | {m('watcher', 'hwm_kib')} | {m('watcher', 'anon_kib')} | "
                         f"{m('watcher', 'fds')} |")
        lines += ["", f"Raw data in the work dir: `samples.csv` ({len(samples)} samples), `cycles.csv`, `logs/`.", ""]
        return "\n".join(lines)

    def memory_after_cuts(self) -> tuple["Cycle", "Cycle"] | None:
        """The first and the last cut cycles with the sink's RSS taken after them."""
        cuts = [c for c in self.cycles if c.kind == "cut" and c.rss_after_kib]
        return (cuts[0], cuts[-1]) if len(cuts) >= 2 else None

    def memory_bound_lines(self) -> list[str]:
        pair = self.memory_after_cuts()
        if pair is None:
            return []
        first, last = pair
        ratio = last.rss_after_kib / first.rss_after_kib
        self.results["memory_after_cuts"] = {"first": first.rss_after_kib, "last": last.rss_after_kib,
                                             "ratio": round(ratio, 2)}
        mib = lambda kib: f"{kib / 1024:.0f}"  # noqa: E731
        heap = lambda c: (f"{c.held.get('heap_live_bytes', 0) / 2**20:.1f} MiB live, "  # noqa: E731
                          f"{c.held.get('heap_peak_bytes', 0) / 2**20:.1f} MiB peak")
        bound = self.args.memory_bound
        verdict = ("" if bound is None else
                   f" — bound {bound}×: **{'within' if ratio <= bound else 'EXCEEDED'}**")
        reading = "" if bound is None else f" (median of {MEMORY_READING_S:g} s of readings)"
        return [f"Sink RSS{reading} once bytes flow again after the first cut (cycle {first.number}) and after the last "
                f"(cycle {last.number}): **{mib(first.rss_after_kib)} → {mib(last.rss_after_kib)} MiB, "
                f"{ratio:.2f}×**{verdict} (anonymous {mib(first.anon_after_kib)} → {mib(last.anon_after_kib)} MiB). "
                f"The heap by the program's own count then: {heap(first)} → {heap(last)}; the manifest's "
                f"RocksDB {first.held.get('manifest_memory_bytes', 0) / 2**20:.1f} → "
                f"{last.held.get('manifest_memory_bytes', 0) / 2**20:.1f} MiB.", ""]

    def growth_table(self) -> list[str]:
        """First vs last cycle, the max, and the judgement: the last
        quarter's max against the first quarter's (RSS may exceed it by 25%
        plus 16 MiB, descriptors by 8: restarts and the simulator's bursts
        move both; a leak grows past any fixed allowance over 100 cycles).
        Also the longest-lived incarnation of each, start vs end: a leak
        within a process's life shows there first."""
        cycles = [c for c in self.cycles if c.metrics]
        self.results["growth"] = {}
        if len(cycles) < MIN_CYCLES_TO_JUDGE:
            return [f"{len(cycles)} cycles with samples: too few for a growth judgement "
                    f"(it needs {MIN_CYCLES_TO_JUDGE}); figures in the per-cycle table."]
        q = max(1, len(cycles) // 4)
        first, last = cycles[:q], cycles[-q:]
        lines = [f"Quarters: cycles {first[0].number}–{first[-1].number} vs {last[0].number}–{last[-1].number}.", "",
                 "| process | figure | first cycle | last cycle | max | first-quarter max | last-quarter max | growth? |",
                 "|---|---|---|---|---|---|---|---|"]
        for process in ("sink", "watcher"):
            for key, label, slack in (("rss_kib", "RSS MiB", None), ("hwm_kib", "peak RSS (VmHWM) MiB", None),
                                      ("anon_kib", "anonymous RSS (heap) MiB", None),
                                      ("fds", "open fds", 8)):
                def values(cs):
                    return [c.metrics[process][key] for c in cs if process in c.metrics]
                every, fq, lq = values(cycles), values(first), values(last)
                if not every or not fq or not lq:
                    continue
                fmax, lmax = max(fq), max(lq)
                allowed = fmax * 1.25 + 16 * 1024 if slack is None else fmax + slack
                grew = lmax > allowed
                self.results["growth"][f"{process} {key}"] = grew
                fmt = (lambda v: f"{v / 1024:.0f}") if key != "fds" else str
                lines.append(f"| {process} | {label} | {fmt(every[0])} | {fmt(every[-1])} | {fmt(max(every))} | "
                             f"{fmt(fmax)} | {fmt(lmax)} | {'**GREW**' if grew else 'no'} |")
        # The longest-lived incarnation of each process.
        lines += ["", "| process | longest-lived incarnation | lived s | RSS MiB at 10 s → max → end "
                  "| anonymous RSS MiB at 10 s → max → end | fds at 10 s → max → end |",
                  "|---|---|---|---|---|---|"]
        samples = self.sampler.samples
        for process in ("sink", "watcher"):
            by_inc: dict[int, list[Sample]] = {}
            for s in samples:
                if s.process == process:
                    by_inc.setdefault(s.incarnation, []).append(s)
            if not by_inc:
                continue
            inc, got = max(by_inc.items(), key=lambda item: item[1][-1].elapsed - item[1][0].elapsed)
            lived = got[-1].elapsed - got[0].elapsed
            settled = next((s for s in got if s.elapsed - got[0].elapsed >= 10), got[0])
            def arc(key: str, scale: float) -> str:
                at = [getattr(s, key) for s in got]
                return " → ".join(f"{v / scale:.0f}" for v in (getattr(settled, key), max(at), at[-1]))
            lines.append(f"| {process} | {inc} | {lived:.0f} | {arc('rss_kib', 1024)} | {arc('anon_kib', 1024)} | "
                         f"{arc('fds', 1)} |")
        grew = [k for k, v in self.results["growth"].items() if v]
        lines += ["", "Judgement: " + (f"**growth** in {', '.join(grew)}" if grew else
                                        "**no growth** (last-quarter max within the first quarter's max "
                                        "+25% +16 MiB for RSS, +8 for descriptors)")]
        return lines

    def write_cycles_csv(self) -> None:
        with open(self.dir / "cycles.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["cycle", "kind", "delay_s", "outage_s", "recovery_s",
                             "sink_rss_kib", "sink_hwm_kib", "sink_anon_kib", "sink_fds",
                             "watcher_rss_kib", "watcher_hwm_kib", "watcher_anon_kib", "watcher_fds",
                             *(f"sink_{key}" for key in HELD_FIELDS)])
            for c in self.cycles:
                row = [c.number, c.kind, c.delay_s, c.outage_s, c.recovery_s]
                for process in ("sink", "watcher"):
                    m = c.metrics.get(process, {})
                    row += [m.get("rss_kib"), m.get("hwm_kib"), m.get("anon_kib"), m.get("fds")]
                row += [c.held.get(key) for key in HELD_FIELDS]
                writer.writerow(row)

    def count_in_log(self, name: str, needle: str) -> int:
        path = self.dir / "logs" / f"{name}.log"
        if not path.exists():
            return 0
        count = 0
        with open(path, errors="replace") as f:
            for line in f:
                count += needle in line
        return count


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    soak = Soak(args)
    soak.argv_shown = [a for a in argv if a != "--binary" and a != str(args.binary)]
    soak.bin_version = "?"

    # Ctrl-C, SIGTERM and SIGHUP end the run through `finally` (cleanup).
    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    # SIGINT too: a shell without job control starts background commands
    # with SIGINT ignored, and Python then leaves it so.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupted)

    log(f"seed {args.seed} (repeat with --seed {args.seed}); {args.cycles if args.cycles < 100_000 else 'unbounded'} "
        f"cycles{f', at most {args.duration:.0f}s' if args.duration else ''}; work dir {args.workdir}")
    if not soak.use_netns:
        reason = "--loopback" if args.loopback else "not root (or no `ip`)"
        log(f"network: plain loopback ({reason}): cuts are SIGSTOP freezes of the sink instead of link cuts")
    code = 0
    interrupted_by = None
    try:
        soak.prepare_dir()
        soak.bin_version = soak.tf("--version", timeout=30).stdout.strip()
        soak.net.create()
        soak.start_pipeline()
        soak.run_cycles()
        soak.finish()
    except SoakFailure as failure:
        soak.failures.append(str(failure))
        log(f"FAILED: {failure}")
        code = 1
    except KeyboardInterrupt as stop:
        interrupted_by = str(stop) or "Ctrl-C"
        soak.failures.append(f"interrupted ({interrupted_by}) after {len(soak.cycles)} cycles")
        log(f"interrupted ({interrupted_by}): cleaning up")
        code = 130
    finally:
        # Ignore further Ctrl-C while cleaning up: a half-cleaned namespace
        # is worse than a second's wait.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        soak.cleanup()
    elapsed = time.monotonic() - soak.t0
    if (soak.dir / MARKER).exists():
        summary = soak.summarise(elapsed)
        grew = [k for k, v in soak.results.get("growth", {}).items() if v]
        if code == 0 and grew and args.strict_growth:
            soak.failures.append(f"growth in {', '.join(grew)} (--strict-growth)")
            summary = soak.summarise(elapsed)
            code = 3
        after_cuts = soak.results.get("memory_after_cuts")
        if code == 0 and args.memory_bound is not None and after_cuts and after_cuts["ratio"] > args.memory_bound:
            soak.failures.append(f"the sink's RSS after the last cut is {after_cuts['ratio']}× that after the "
                                 f"first (--memory-bound {args.memory_bound})")
            summary = soak.summarise(elapsed)
            code = 3
        (soak.dir / "summary.md").write_text(summary)
        if args.summary:
            args.summary.parent.mkdir(parents=True, exist_ok=True)
            args.summary.write_text(summary)
        print(summary)
        if code == 0 and not args.keep_data:
            # The bulky part; logs, CSVs and the state stay for a look.
            for sub in ("source", "dest"):
                shutil.rmtree(soak.dir / sub, ignore_errors=True)
        log(f"summary: {soak.dir / 'summary.md'}" + (f" and {args.summary}" if args.summary else ""))
    log("PASSED" if code == 0 else f"FAILED (exit {code}); work dir kept: {soak.dir}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
