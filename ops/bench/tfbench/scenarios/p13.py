"""P13: a fleet's takeover time. A real 3-member etcd cluster on loopback (Debian's etcd-server),
one sink identity with two processes (an active and a standby) sharing its state directory, a
watcher that finds the identity through etcd, and the simulator writing all along. Each cycle
kills (-9) the active and measures, from the kill, when bytes of the identity's files are durable
again through the standby, with its parts from the standby's log and commit log: detect (the
lease expires and the standby claims the key), lock (the state directory's lock is free), replay
(the journal written back, the sink listening) and reconnect (the first range durable after it).
The killed process is started again as the next standby. Goal: p99 ≤ TTL + 2 s (TTL 5 s).

P13c: planned handovers (`tailflight fleet handover`): from the request to bytes durable through
the new active, over N handovers back and forth. Goal: p99 ≤ 1 s.

P13b: what a coordinator costs ingest: P1's workload through a sink identity and a watcher routing
through etcd, against the same without, alternating. Goal: ≥ 0.97× the throughput without."""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from ..analysis import median, ratio
from ..formatting import fmt, fmt_mb, met, met_le
from ..harness import Bench, BenchError, CommitLog, Proc, free_port, say, wait_log
from .p1_p2 import throughput_run

TTL_S = 5
INGEST_TARGET = 0.97
CLUSTER = "tfbench"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Etcd:
    """A 3-member etcd cluster on loopback, its data and logs under d."""

    def __init__(self, b: Bench, d: Path, size: int = 3):
        d.mkdir(parents=True, exist_ok=True)
        binary = shutil.which("etcd")
        if binary is None:
            raise BenchError("etcd is not installed (apt-get install etcd-server)")
        ports = [(free_port(), free_port()) for _ in range(size)]
        initial = ",".join(f"e{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
        self.procs = []
        for i, (client, peer) in enumerate(ports):
            self.procs.append(Proc(f"etcd-e{i}", [
                binary, "--name", f"e{i}", "--data-dir", d / f"e{i}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--listen-client-urls", f"http://127.0.0.1:{client}",
                "--advertise-client-urls", f"http://127.0.0.1:{client}",
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--heartbeat-interval", "100", "--election-timeout", "1000"], d, env=b.env))
        self.url = "etcd://" + ",".join(f"127.0.0.1:{client}" for client, _ in ports)
        self.endpoints = ",".join(f"http://127.0.0.1:{client}" for client, _ in ports)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            cp = subprocess.run(["etcdctl", f"--endpoints={self.endpoints}", "endpoint", "health"],
                                capture_output=True, text=True, env=dict(os.environ, ETCDCTL_API="3"))
            if cp.returncode == 0:
                return
            time.sleep(0.2)
        raise BenchError("etcd did not become healthy within 60 s")

    def stop(self):
        for proc in self.procs:
            proc.kill9()


def log_time(proc: Proc, text: str, after_ns: int) -> int | None:
    """Unix ns of the first line of proc's log containing text, logged after after_ns."""
    try:
        lines = proc.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        line = ANSI.sub("", line)
        if text not in line:
            continue
        stamp = line.split(" ", 1)[0]
        try:
            when = datetime.datetime.strptime(stamp[:26] + "Z", "%Y-%m-%dT%H:%M:%S.%fZ")
        except ValueError:
            continue
        ns = int(when.replace(tzinfo=datetime.timezone.utc).timestamp() * 1e9)
        if ns >= after_ns:
            return ns
    return None


def first_commit_after(cl: CommitLog, after_ns: int) -> int | None:
    cl.poll()
    later = [record[3] for record in cl.records if record[3] > after_ns]
    return min(later) if later else None


def verify_within(b: Bench, src: Path, dest: Path, seconds: float):
    """Waits up to `seconds` for everything the simulator wrote to arrive, identical."""
    deadline = time.monotonic() + seconds
    while True:
        ok, text = b.verify(src, dest)
        if ok or time.monotonic() > deadline:
            return ok, text
        time.sleep(1.0)


def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def scenario_p13(b: Bench):
    kills = b.p["p13_kills"]
    say(f"[P13] takeover time: kill -9 of an active sink → bytes durable again through its standby, "
        f"{kills} kills, lease TTL {TTL_S} s, a 3-member etcd cluster on loopback")
    d = b.fresh("p13")
    src = b.fresh_src("p13", "src")
    etcd = Etcd(b, d / "etcd")
    state = d / "shared" / "state"
    dest = d / "shared" / "dest"
    procs: list[Proc] = []
    cycles = []
    try:
        def sink(name: str) -> tuple[Proc, CommitLog]:
            log = d / f"{name}-commit.log"
            proc = Proc(name, [b.bin, "sink", "--identity", "p13", "--cluster", CLUSTER, "--coordinator", etcd.url,
                               "--lease-ttl", f"{TTL_S}s", "--state", state, "--root", dest,
                               "--listen", f"127.0.0.1:{free_port()}", "--commit-log", log], d,
                        # The parts of a takeover are read from its info lines.
                        env=dict(b.env, TAILFLIGHT_LOG="info"))
            procs.append(proc)
            return proc, CommitLog(log)

        sinks = [sink("sink-h1")]
        wait_log(sinks[0][0], "sink serving", 60)
        sinks.append(sink("sink-h2"))
        wait_log(sinks[1][0], "standby", 60)
        watcher = Proc("watcher", [b.bin, "watch", "--dir", src, "--source", "bench", "--state", d / "watch-state",
                                   "--coordinator", etcd.url, "--cluster", CLUSTER], d, env=b.env)
        procs.append(watcher)
        sim = b.sim(d, "sim", src, "--streams", 4, "--rate", 100, "--frame", "64KiB", "--chunk", "16MiB",
                    "--duration", f"{(kills + 1) * (TTL_S + 8)}s")
        procs.append(sim)
        active, standby = 0, 1
        for cycle in range(kills):
            # Bytes flowing through the active first.
            deadline = time.monotonic() + 60
            mark = time.time_ns()
            while first_commit_after(sinks[active][1], mark) is None:
                if time.monotonic() > deadline:
                    raise BenchError(f"no bytes through {sinks[active][0].name}: {sinks[active][0].log_tail()}")
                time.sleep(0.1)
            time.sleep(1.0)
            killed_ns = time.time_ns()
            sinks[active][0].kill9()
            proc, cl = sinks[standby]
            deadline = time.monotonic() + TTL_S * 4 + 30
            resumed = None
            while resumed is None:
                if time.monotonic() > deadline:
                    raise BenchError(f"{proc.name} did not take over: {proc.log_tail(5)}")
                time.sleep(0.05)
                resumed = first_commit_after(cl, killed_ns)
            claimed = log_time(proc, "now active for the identity", killed_ns)
            opening = log_time(proc, "opening its state", killed_ns)
            serving = log_time(proc, "sink serving", killed_ns)
            part = lambda a, z: (z - a) / 1e9 if a is not None and z is not None else None
            cycles.append({"takeover_s": (resumed - killed_ns) / 1e9, "detect_s": part(killed_ns, claimed),
                           "lock_s": part(claimed, opening), "replay_s": part(opening, serving),
                           "reconnect_s": part(serving, resumed)})
            say(f"  kill {cycle + 1}: bytes again after {cycles[-1]['takeover_s']:.2f} s (detect "
                f"{fmt(cycles[-1]['detect_s'], '.2f')}, lock {fmt(cycles[-1]['lock_s'], '.2f')}, replay "
                f"{fmt(cycles[-1]['replay_s'], '.2f')}, reconnect {fmt(cycles[-1]['reconnect_s'], '.2f')} s)")
            # The killed process comes back as the next standby.
            sinks[active][0].start()
            wait_log(sinks[active][0], "standby", 60)
            active, standby = standby, active
        sim.stop()
        ok, text = verify_within(b, src, dest / "bench", 180)
    finally:
        for proc in reversed(procs):
            proc.stop()
        etcd.stop()
    takeovers = [c["takeover_s"] for c in cycles]
    p50, p99 = median(takeovers), percentile(takeovers, 0.99)
    goal = TTL_S + 2.0
    parts = {k: median([c[k] for c in cycles if c[k] is not None]) for k in
             ("detect_s", "lock_s", "replay_s", "reconnect_s")}
    b.results["scenarios"]["P13"] = {"ttl_s": TTL_S, "kills": kills, "cycles": cycles, "p50_s": p50,
                                     "p99_s": p99, "parts_median_s": parts, "verified": ok,
                                     "verify_report": None if ok else text}
    say(f"[P13] takeover p50 {fmt(p50, '.2f')} s, p99 {fmt(p99, '.2f')} s (goal ≤ {goal:.0f} s); medians: "
        + ", ".join(f"{k[:-2]} {fmt(v, '.2f')} s" for k, v in parts.items())
        + f"; verify {'identical' if ok else 'DIFFERENT'}")
    b.row(id="P13", scenario=f"takeover after kill -9 of an active sink (TTL {TTL_S} s), p99 of {kills}",
          figure=f"{fmt(p99, '.2f')} s", peer="—", ratio=None, target=f"≤{goal:.0f} s", met=met_le(p99, goal))
    b.row(id="P13", scenario="… its parts (medians): detect / lock / replay / reconnect",
          figure=" / ".join(fmt(v, '.2f') for v in parts.values()) + " s", peer="—", ratio=None,
          target="(report)", met="—")
    b.row(id="P13", scenario="… every byte arrived (verify)", figure="identical" if ok else "DIFFERENT",
          peer="—", ratio=None, target="identical", met="yes" if ok else "no")

    # P13b: P1 through a coordinated identity against P1 without, alternating.
    say(f"[P13b] P1 with a coordinator (sink identity, watcher routing through etcd) vs without, "
        f"{b.p['runs']} run(s) each, alternating")
    etcd = Etcd(b, b.fresh("p13b", "etcd"))
    runs = {False: [], True: []}
    try:
        # One unmeasured run first, as in P1: the first run after a quiet spell is the slowest.
        throughput_run(b, "p13b-warm-up", tls=False)
        for i in range(b.p["runs"]):
            for coordinated in ((False, True) if i % 2 == 0 else (True, False)):
                if coordinated:
                    cluster = f"p13b-{i}"
                    sink_extra = ("--identity", f"p13b-{i}", "--cluster", cluster, "--coordinator", etcd.url,
                                  "--lease-ttl", f"{TTL_S}s")
                    watch_extra = ("--coordinator", etcd.url, "--cluster", cluster)
                    runs[True].append(throughput_run(b, f"coordinated-{i + 1}", tls=False, sink_extra=sink_extra,
                                                     watch_extra=watch_extra, watch_to=""))
                else:
                    runs[False].append(throughput_run(b, f"uncoordinated-{i + 1}", tls=False))
    finally:
        etcd.stop()
    rate = {k: median([m["bytes_per_s"] for m in v]) for k, v in runs.items()}
    r = ratio(rate[True], rate[False])
    b.results["scenarios"]["P13b"] = {"runs": {str(k): v for k, v in runs.items()}, "ratio": r}
    say(f"[P13b] with a coordinator {fmt_mb(rate[True])}, without {fmt_mb(rate[False])}: {fmt(r, '.3f')}× "
        f"(goal ≥ {INGEST_TARGET})")
    b.row(id="P13b", scenario="P1 through a sink identity and etcd routing vs without",
          figure=fmt_mb(rate[True]), peer=fmt_mb(rate[False]), ratio=r, target=f"≥{INGEST_TARGET}×",
          met=met(r, INGEST_TARGET))


def scenario_p13c(b: Bench):
    """P13c: planned handovers. One sink identity with two processes, the watcher routing through
    etcd and the simulator writing all along; each cycle runs `tailflight fleet handover` and
    measures, from the request, when bytes of the identity's files are durable again through the
    process that took it over (its commit log), and the command's own report (request → the new
    active serving). The handed-over process stands by again, so the identity goes back and forth.
    Goal: p99 ≤ 1 s (nothing waits for a TTL)."""
    handovers = b.p["p13c_handovers"]
    say(f"[P13c] planned handover: `tailflight fleet handover` → bytes durable again through the new active, "
        f"{handovers} handovers, a 3-member etcd cluster on loopback")
    d = b.fresh("p13c")
    src = b.fresh_src("p13c", "src")
    etcd = Etcd(b, d / "etcd")
    state = d / "shared" / "state"
    dest = d / "shared" / "dest"
    procs: list[Proc] = []
    cycles = []
    ok, text = False, "not run"
    try:
        logs = {}
        for name in ("sink-h1", "sink-h2"):
            log = d / f"{name}-commit.log"
            proc = Proc(name, [b.bin, "sink", "--identity", "p13c", "--cluster", CLUSTER, "--coordinator",
                               etcd.url, "--lease-ttl", f"{TTL_S}s", "--state", state, "--root", dest,
                               "--node-name", name, "--listen", f"127.0.0.1:{free_port()}", "--commit-log", log],
                        d, env=dict(b.env, TAILFLIGHT_LOG="info"))
            procs.append(proc)
            logs[name] = CommitLog(log)
            wait_log(proc, "sink serving" if name == "sink-h1" else "standby", 60)
        watcher = Proc("watcher", [b.bin, "watch", "--dir", src, "--source", "bench", "--state", d / "watch-state",
                                   "--coordinator", etcd.url, "--cluster", CLUSTER], d, env=b.env)
        procs.append(watcher)
        sim = b.sim(d, "sim", src, "--streams", 4, "--rate", 100, "--frame", "64KiB", "--chunk", "16MiB",
                    "--duration", f"{handovers * 4 + 20}s")
        procs.append(sim)
        active = "sink-h1"
        for cycle in range(handovers):
            deadline = time.monotonic() + 60
            mark = time.time_ns()
            while first_commit_after(logs[active], mark) is None:
                if time.monotonic() > deadline:
                    raise BenchError(f"no bytes through {active}")
                time.sleep(0.1)
            time.sleep(1.0)
            asked_ns = time.time_ns()
            cp = subprocess.run([str(b.bin), "fleet", "handover", "p13c", "--coordinator", etcd.url,
                                 "--cluster", CLUSTER, "--json"], capture_output=True, text=True,
                                env=dict(b.env, TAILFLIGHT_LOG="warn"), timeout=120)
            if cp.returncode != 0:
                raise BenchError(f"handover {cycle + 1} failed: {cp.stdout}{cp.stderr}")
            report = json.loads(cp.stdout.strip().splitlines()[-1])
            taker = report["to"]["host"]
            deadline = time.monotonic() + 60
            resumed = None
            while resumed is None:
                if time.monotonic() > deadline:
                    raise BenchError(f"no bytes through {taker} after handover {cycle + 1}")
                time.sleep(0.02)
                resumed = first_commit_after(logs[taker], asked_ns)
            cycles.append({"bytes_again_s": (resumed - asked_ns) / 1e9, "serving_s": report["seconds"],
                           "from": active, "to": taker})
            say(f"  handover {cycle + 1} ({active} → {taker}): new active serving after "
                f"{report['seconds']:.3f} s, bytes durable through it after {cycles[-1]['bytes_again_s']:.3f} s")
            active = taker
        sim.stop()
        ok, text = verify_within(b, src, dest / "bench", 180)
    finally:
        for proc in reversed(procs):
            proc.stop()
        etcd.stop()
    again = [c["bytes_again_s"] for c in cycles]
    serving = [c["serving_s"] for c in cycles]
    p50, p99 = median(again), percentile(again, 0.99)
    b.results["scenarios"]["P13c"] = {"handovers": handovers, "cycles": cycles, "p50_s": p50, "p99_s": p99,
                                      "serving_p50_s": median(serving), "serving_p99_s": percentile(serving, 0.99),
                                      "verified": ok, "verify_report": None if ok else text}
    say(f"[P13c] bytes again after a handover: p50 {fmt(p50, '.3f')} s, p99 {fmt(p99, '.3f')} s (goal ≤ 1 s); "
        f"new active serving p50 {fmt(median(serving), '.3f')} s; verify {'identical' if ok else 'DIFFERENT'}")
    b.row(id="P13c", scenario=f"planned handover → bytes durable through the new active, p99 of {handovers}",
          figure=f"{fmt(p99, '.3f')} s", peer="—", ratio=None, target="≤1 s", met=met_le(p99, 1.0))
    b.row(id="P13c", scenario="… the request → the new active serving (p50 / p99)",
          figure=f"{fmt(median(serving), '.3f')} / {fmt(percentile(serving, 0.99), '.3f')} s", peer="—",
          ratio=None, target="(report)", met="—")
    b.row(id="P13c", scenario="… every byte arrived (verify)", figure="identical" if ok else "DIFFERENT",
          peer="—", ratio=None, target="identical", met="yes" if ok else "no")
