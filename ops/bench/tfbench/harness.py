"""What every scenario runs on: child processes and their logs, scratch folders on disk and tmpfs,
waiting for ports, logs and commits, the sink's commit log, one sink + watcher pipeline, the
network namespace of P4, and cleaning up after a run.

Bench holds a run's parameters, results, table rows and notes; the scenarios fill them in."""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from .analysis import (commit_series, parse_commit_line, parse_set_value, parse_write_log, ratio,
                       summarize_commit_rounds, trouble_totals)
from .config import GB, MODES, SOURCE, MiB
from .formatting import strip_ansi


CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(Exception):
    pass


def say(msg: str = "") -> None:
    print(msg, flush=True)


def now_ns() -> int:
    return time.time_ns()


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

    After the suite wrote or deleted gigabytes (P1, a peer's run), a VM's
    disk can stop completing writes for a while, its host writing back what
    the guest flushed (see the results' Method). A latency run started then
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
            record = parse_commit_line(line.decode(errors="replace"))
            if record is None:
                continue
            _, _, length, nanos, _ = record
            self.records.append(record)
            self.bytes += length
            if self.first_ns is None or nanos < self.first_ns:
                self.first_ns = nanos
            if self.last_ns is None or nanos > self.last_ns:
                self.last_ns = nanos

    def series(self, t0_ns: int, bin_s=0.25):
        """(seconds since t0, MB/s) per bin, from the commit times."""
        return commit_series(self.records, t0_ns, bin_s)


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


def wait_same_names(src: Path, dest: Path, timeout: float) -> bool:
    """Waits until every file under `src` exists under `dest` by the same name: the commit log counts
    bytes, and a chunk's rename from .inprogress can still be on its way when the last byte is in
    (a watcher stopped then never sends it, and verify finds the final name missing). False on
    timeout; verify then says what differs."""
    def names(root: Path) -> set[str]:
        return {str(Path(d, f).relative_to(root)) for d, _, fs in os.walk(root) for f in fs}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if names(src) <= names(dest):
            return True
        time.sleep(0.05)
    return False


def read_write_log(path: Path) -> dict[str, list[tuple[int, int, int]]]:
    """The simulator's --write-log: per file, (offset, length, write time ns) of every write."""
    with open(path) as f:
        return parse_write_log(f)


def commit_rounds(log: Path) -> dict | None:
    """The sink's commit-round trace in its log, summed up (see analysis.summarize_commit_rounds)."""
    try:
        with open(log, errors="replace") as f:
            return summarize_commit_rounds(f)
    except OSError:
        return None


def rsync_args():
    return ["rsync", "-a", "--inplace", "--append-verify"]


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
        # The benchmark-only tools (floor, delay-line), built beside it.
        self.bench_bin = str(Path(self.bin).parent / "tailflight-bench")
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
        """to: the sink's endpoint (by default this pipeline's); "" gives no --to."""
        self.watch_start_ns = now_ns()
        target = [] if to == "" else ["--to", to or self.endpoint]
        self.watcher = Proc("watcher", nofile=self.nofile, argv=[
            self.b.bin, "watch", "--dir", self.src, "--source", SOURCE,
            *target, "--state", self.d / "watch-state",
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


def trouble_note(b: "Bench", scenario: str, runs) -> None:
    """Turns errors seen in the logs and re-sent bytes into a note of the results."""
    totals, dup = trouble_totals(runs)
    if totals or dup:
        parts = [f"{k} ×{n}" for k, n in totals.items()]
        if dup:
            parts.append(f"{dup / MiB:.0f} MiB of duplicate (re-sent) bytes at the sink")
        b.notes.append(f"{scenario}: the logs show " + ", ".join(parts) + " (see the JSON `log_events`).")


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
