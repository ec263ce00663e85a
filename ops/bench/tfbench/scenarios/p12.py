"""P12: commit → event visible at a Kafka consumer. A real one-node Kafka broker
(ops/kafka/broker.sh); the sink publishes its commit events through its transactional relay
(`--kafka-brokers`) while P3's workload runs, and a read_committed confluent-kafka consumer
records, per event, its arrival minus its record timestamp (the sink's commit time, whole ms).
Beside it, on the same broker in the same run, the broker's own floor: one small message every
10 ms, each in a transaction of its own, from a transactional confluent-kafka producer
(linger.ms=0) to a read_committed consumer, measured the same way, during the workload (the
floor of the target: the relay publishes in transactions) and, for information, alone before
it, also without transactions (an idempotent producer). Goal: range.committed events' p50
≤ 2× the floor's p50. The sink's status says where the relay's time went (relay.phase_us,
summed over its transactions): reported per transaction.

Beside it, the peer of the relay: after the events run, the same workload into a sink that publishes
nothing, while `tools/kafka_latency.py relay` (confluent-kafka, the same librdkafka) makes events at the
rate the sink published them and publishes them in back-to-back transactions of every event waiting, with
the floor beside it again. It keeps no position and checks nothing: what any relay that batches events into
transactions pays on this machine. Reported: the relay's p50 against the peer's (each in its own run).

Then what events cost ingest: P1's workload with events on and off, alternating (as P11).
Goal: ≥ 0.95× the throughput without events.

The Kafka clients are tools/kafka_latency.py, run with the project's venv (confluent-kafka)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from ..analysis import (RANGE_COMMITTED, arrival_batches, event_counts, event_latencies, floor_latencies,
                        latency_summary, median, parse_event_log, parse_floor_log, ratio, tailflight_latencies)
from ..config import REPO
from ..formatting import fmt, fmt_mb, fmt_ms, met, met_le
from ..harness import (CLK_TCK, Bench, BenchError, Pipeline, Proc, dir_bytes, read_write_log, rmtree, say,
                       wait_commits, wait_log)
from .p11 import cpu_per_gb
from .p1_p2 import throughput_run
from .p3_workload import p3_sim_args
from .p8 import TOOLS, first_file

LATENCY_TARGET = 2.0  # × the floor's p50
INGEST_TARGET = 0.95
BROKER = REPO / "ops" / "kafka" / "broker.sh"
TOOL = TOOLS / "kafka_latency.py"
TOPIC = "tfbench.p12.events"
# Unmeasured messages a floor client sends first: its connections and metadata, and the JIT of a
# broker that has just started.
FLOOR_WARMUP_S = 2
# The peer relay's record size: the sink's CloudEvents are 450-500 bytes (docs/events/examples.jsonl).
PEER_EVENT_BYTES = 480


def kafka_python() -> str:
    """The project's venv (ops/test.sh and run.sh give it confluent-kafka)."""
    venv = os.environ.get("TAILFLIGHT_PY_VENV") or str(Path.home() / ".cache" / "tailflight" / "py-venv")
    return str(Path(venv) / "bin" / "python")


def start_broker(d: Path) -> str:
    """A fresh one-node broker in d; returns its bootstrap address."""
    try:
        cp = subprocess.run([BROKER, "start", d], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        stop_broker(d)
        raise BenchError("the Kafka broker did not start within 180 s")
    lines = cp.stdout.strip().splitlines()
    if cp.returncode != 0 or not lines:
        raise BenchError(f"broker.sh start failed ({cp.returncode}): {cp.stderr[-1500:]}")
    return lines[-1].strip()


def stop_broker(d: Path) -> None:
    cp = subprocess.run([BROKER, "stop", d], capture_output=True, text=True, timeout=90)
    if cp.returncode != 0:
        say(f"  broker.sh stop: {cp.stderr.strip()[-500:]}")


def broker_cpu_s(d: Path) -> float | None:
    """user+sys CPU seconds of the broker started in d (its JVM shares the machine's cores)."""
    try:
        pid = int((d / "broker.pid").read_text())
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (OSError, ValueError):
        return None
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_delta(before, after):
    return None if before is None or after is None else after - before


def last_json(proc: Proc) -> dict:
    """The JSON summary a kafka_latency.py process printed last."""
    for line in reversed(proc.log_path.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise BenchError(f"{proc.name} printed no summary: {proc.log_tail()}")


def start_floor(brokers: str, logs: Path, name: str, seconds: float, transactional=False, spread=False) -> Proc:
    """A floor client measuring for `seconds` after its warm-up; returns once it measures. `spread`: every
    other transaction writes one message to each partition (the shape of the relay's transactions)."""
    proc = Proc(name, [kafka_python(), TOOL, "floor", "--bootstrap", brokers, "--topic", f"tfbench.p12.{name}",
                       "--seconds", seconds, "--warmup-s", FLOOR_WARMUP_S,
                       "--log", logs / f"{name}-messages.log", *(["--transactional"] if transactional else []),
                       *(["--spread"] if spread else [])],
                logs)
    wait_log(proc, "measuring", 90)
    return proc


def floor_result(proc: Proc, logs: Path, first_ns=None, last_ns=None) -> dict:
    """The floor's latencies (record timestamp → arrival, as the events'; and exact, from the send time),
    of the messages sent alone in their transaction between first_ns and last_ns; under `spread`, those
    of the transactions spread over every partition."""
    got = last_json(proc)
    with open(logs / f"{proc.name}-messages.log") as f:
        records = parse_floor_log(f)
    by_ts, exact = floor_latencies(records, first_ns, last_ns, spread=False)
    spread_by_ts, _ = floor_latencies(records, first_ns, last_ns, spread=True)
    out = latency_summary(by_ts, got["sent"] - got["received"])
    out.update({"exact": latency_summary(exact, 0), "sent": got["sent"], "received": got["received"],
                "spread": latency_summary(spread_by_ts, 0) if spread_by_ts else None,
                "transactional": got["transactional"], "delivery_errors": got["delivery_errors"]})
    return out


def floor_alone(b: Bench, brokers: str, transactional: bool) -> dict:
    name = "floor-alone-txn" if transactional else "floor-alone"
    d = b.fresh("p12", name)
    proc = start_floor(brokers, d, name, b.p["p12_floor_seconds"], transactional)
    if proc.wait(b.p["p12_floor_seconds"] + 90) != 0:
        raise BenchError(f"{name} failed: {proc.log_tail()}")
    out = floor_result(proc, d)
    say(f"  broker floor alone{', one transaction per message' if transactional else ''}: "
        f"p50 {fmt_ms(out['p50_ms'])}, p99 {fmt_ms(out['p99_ms'])} ({out['n']} messages, lost "
        f"{out['missing']}); exact send → arrival p50 {fmt_ms(out['exact']['p50_ms'])}")
    return out


def events_run(b: Bench, brokers: str, broker_dir: Path) -> dict:
    """P3's workload into a sink publishing its events, a consumer of them, and the floor during it."""
    seconds = b.p["p12_seconds"]
    d = b.fresh("p12", "events")
    src = b.fresh_src("p12", "events")
    logs = b.fresh_src("p12-logs", "events")  # tmpfs, moved beside the run afterwards (as in P3 and P9)
    consumer = Proc("events-consumer", [kafka_python(), TOOL, "events", "--bootstrap", brokers, "--topic", TOPIC,
                                        "--log", logs / "events.log", "--timeout", seconds + 600], logs)
    floor = None
    pl = None
    try:
        wait_log(consumer, "assigned", 90)
        pl = Pipeline(b, d, src, sink_extra=("--kafka-brokers", brokers, "--kafka-topic", TOPIC), logdir=logs)
        pl.start_watcher()
        first_file(pl, src)
        # The relay's first transaction (producer id, partitions added to it) and the consumer's first
        # fetch happen before the workload: they are not its latency.
        wait_events(logs / "events.log", 1, 60, consumer)
        floor = start_floor(brokers, logs, "floor", seconds + 2, transactional=True, spread=True)
        broker_cpu0 = broker_cpu_s(broker_dir)
        sim = b.sim(logs, "sim", src, *p3_sim_args(b, seconds=seconds), "--write-log", logs / "writes.log")
        if sim.wait(seconds + 60) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        # Over the workload, as in the peer's run.
        broker_cpu = cpu_delta(broker_cpu0, broker_cpu_s(broker_dir))
        total, _ = dir_bytes(src)
        wait_commits(pl.cl, total, 300, "P12 data to arrive", (pl.sink, pl.watcher))
        published = wait_published(pl, 120)
        relay = ((pl.status() or {}).get("events") or {}).get("relay") or {}
        wait_events(logs / "events.log", published, 60, consumer)
        if floor.wait(seconds + 90) != 0:
            raise BenchError(f"the floor failed: {floor.log_tail()}")
        consumer_cpu_s = consumer.cpu_seconds()
        consumer.stop()
        m = pl.finish(total)
    finally:
        stop_all(pl, consumer, floor)
    writes, first_ns, last_ns = write_window(logs)
    with open(logs / "events.log") as f:
        records = parse_event_log(f)
    since_ms = first_ns // 1_000_000
    events = latency_summary(event_latencies(records, RANGE_COMMITTED, since_ms), 0)
    durable, missing = tailflight_latencies(writes, pl.cl.records)
    m.update({"events": events, "event_counts": event_counts(records, since_ms),
              "arrivals": arrival_batches(records, since_ms),
              "events_consumer": last_json(consumer), "events_consumer_cpu_s": consumer_cpu_s,
              "floor": floor_result(floor, logs, first_ns, last_ns), "durable": latency_summary(durable, missing),
              "writes": sum(len(ws) for ws in writes.values()), "seconds": seconds, "published_events": published,
              "broker_cpu_s": broker_cpu,
              "relay_phases": relay_phases(relay)})
    for log in logs.iterdir():
        shutil.move(log, d / log.name)
    rmtree(src)
    rmtree(pl.dest_root)
    fl = m["floor"]
    say(f"  commit → range.committed event at the consumer: p50 {fmt_ms(events['p50_ms'])}, p99 "
        f"{fmt_ms(events['p99_ms'])}, max {fmt_ms(events['max_ms'])} ({events['n']} events; all types "
        f"{sum(m['event_counts'].values())}); broker floor during the run p50 {fmt_ms(fl['p50_ms'])}, p99 "
        f"{fmt_ms(fl['p99_ms'])} ({fl['n']} messages, lost {fl['missing']}); append → durable p50 "
        f"{fmt_ms(m['durable']['p50_ms'])} (missing {missing}); CPU: events consumer {fmt(consumer_cpu_s, '.1f')} s, "
        f"broker {fmt(broker_cpu, '.1f')} s")
    if m["relay_phases"]:
        say(f"    the relay's transactions, mean ms each: {phases_text(m['relay_phases'])}")
    if m["arrivals"]:
        ab = m["arrivals"]
        say(f"    the events arrived in {ab['batches']} batches (about one per relay transaction) of p50 "
            f"{ab['events_p50']} events (max {ab['events_max']}), p50 {fmt_ms(ab['gap_p50_ms'])} apart "
            f"(p90 {fmt_ms(ab['gap_p90_ms'])}, max {fmt_ms(ab['gap_max_ms'])})")
    return m


PHASES = ("waited", "read", "begin", "produce", "deliver", "commit", "confirm")


def relay_phases(relay: dict) -> dict | None:
    """Mean ms per transaction of each part of the relay's work, from its status (relay.phase_us sums
    them over `transactions`); confirm (reading the last records back) is not per transaction but about
    once a second on a thread of its own beside publishing, its mean spread over the transactions
    likewise and left out of the cycle."""
    n = relay.get("transactions") or 0
    sums = relay.get("phase_us") or {}
    if not n or not sums:
        return None
    out = {k: sums.get(k, 0) / n / 1000 for k in PHASES}
    out["transactions"] = n
    out["events_per_transaction"] = (relay.get("published_events") or 0) / n
    out["cycle_ms"] = sum(out[k] for k in PHASES if k not in ("waited", "confirm"))
    return out


def peer_run(b: Bench, brokers: str, rate: float, broker_dir: Path) -> dict:
    """P3's workload into a sink that publishes nothing, beside the peer relay at `rate` events a second
    and the floor (both during the workload)."""
    seconds = b.p["p12_seconds"]
    d = b.fresh("p12", "peer")
    src = b.fresh_src("p12", "peer")
    logs = b.fresh_src("p12-logs", "peer")
    peer = floor = pl = None
    try:
        pl = Pipeline(b, d, src, logdir=logs)
        pl.start_watcher()
        first_file(pl, src)
        peer = Proc("peer-relay", [kafka_python(), TOOL, "relay", "--bootstrap", brokers, "--topic",
                                   "tfbench.p12.peer", "--seconds", seconds + 2, "--warmup-s", FLOOR_WARMUP_S,
                                   "--rate", f"{rate:.0f}", "--size", PEER_EVENT_BYTES,
                                   "--log", logs / "peer-relay-messages.log"], logs)
        wait_log(peer, "measuring", 90)
        floor = start_floor(brokers, logs, "floor", seconds + 2, transactional=True, spread=True)
        broker_cpu0 = broker_cpu_s(broker_dir)
        sim = b.sim(logs, "sim", src, *p3_sim_args(b, seconds=seconds), "--write-log", logs / "writes.log")
        if sim.wait(seconds + 60) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        broker_cpu = cpu_delta(broker_cpu0, broker_cpu_s(broker_dir))
        total, _ = dir_bytes(src)
        wait_commits(pl.cl, total, 300, "P12 peer run's data to arrive", (pl.sink, pl.watcher))
        for proc in (peer, floor):
            if proc.wait(seconds + 90) != 0:
                raise BenchError(f"{proc.name} failed: {proc.log_tail()}")
        pl.finish(total)
    finally:
        stop_all(pl, peer, floor)
    _, first_ns, last_ns = write_window(logs)
    out = {"rate": rate, "peer": floor_result(peer, logs, first_ns, last_ns),
           "floor": floor_result(floor, logs, first_ns, last_ns), "broker_cpu_s": broker_cpu}
    out["peer"]["transactions"] = last_json(peer).get("transactions")
    for log in logs.iterdir():
        shutil.move(log, d / log.name)
    rmtree(src)
    rmtree(pl.dest_root)
    pe, fl = out["peer"], out["floor"]
    say(f"  peer relay at {rate:.0f} events/s: p50 {fmt_ms(pe['p50_ms'])}, p99 {fmt_ms(pe['p99_ms'])} "
        f"({pe['n']} events, lost {pe['missing']}, {pe['transactions']} transactions); the broker's floor during "
        f"it p50 {fmt_ms(fl['p50_ms'])}; the broker's CPU over the workload {fmt(broker_cpu, '.1f')} s")
    return out


def stop_all(pl: Pipeline | None, *procs: Proc | None) -> None:
    for proc in procs:
        if proc is not None:
            proc.stop()
    if pl is not None:
        pl.kill_all()


def write_window(logs: Path) -> tuple[dict, int, int]:
    """The simulator's writes (its --write-log in logs) and the times of the first and the last."""
    writes = read_write_log(logs / "writes.log")
    times = [t for ws in writes.values() for _, _, t in ws]
    return writes, min(times), max(times)


def phases_text(p: dict) -> str:
    parts = ", ".join(f"{k} {p[k]:.1f}" for k in PHASES)
    return (f"{parts} (cycle without waiting {p['cycle_ms']:.1f} ms; {p['transactions']} transactions of "
            f"{p['events_per_transaction']:.0f} events)")


def wait_events(path: Path, count: int, timeout: float, consumer: Proc) -> None:
    """Waits until the events consumer has logged `count` events."""
    deadline = time.monotonic() + timeout
    got = 0
    while time.monotonic() < deadline:
        try:
            with open(path, "rb") as f:
                got = sum(1 for _ in f)
        except FileNotFoundError:
            got = 0
        if got >= count:
            return
        if not consumer.alive():
            raise BenchError(f"the events consumer exited: {consumer.log_tail()}")
        time.sleep(0.1)
    raise BenchError(f"the events consumer had {got} of {count} events after {timeout:.0f} s")


def wait_published(pl: Pipeline, timeout: float) -> int:
    """Waits until the sink's relay has published every recorded event; returns how many it published."""
    deadline = time.monotonic() + timeout
    ev = {}
    while time.monotonic() < deadline:
        ev = (pl.status() or {}).get("events") or {}
        if ev and ev.get("depth_events") == 0 and ev.get("recorded_through") == ev.get("published_through"):
            return (ev.get("relay") or {}).get("published_events") or 0
        time.sleep(0.2)
    raise BenchError(f"the relay had not published every event after {timeout:.0f} s: {json.dumps(ev)}")


def ingest_run(b: Bench, name: str, brokers: str | None, broker_dir: Path) -> dict:
    """One P1 run, with the sink publishing events to brokers, or without events (the broker idle)."""
    extra = ("--kafka-brokers", brokers, "--kafka-topic", TOPIC) if brokers else ()
    cpu0 = broker_cpu_s(broker_dir)
    m = throughput_run(b, name, tls=False, sink_extra=extra, total_mib=b.p["p12_total_mib"])
    # Over the whole run (the simulator, the commits, the verify): the broker's share of the cores.
    m["broker_cpu_s"] = cpu_delta(cpu0, broker_cpu_s(broker_dir))
    ev = (m.get("status") or {}).get("events")
    say(f"    broker CPU over the run {fmt(m['broker_cpu_s'], '.2f')} s"
        + (f"; at the last commit the relay had published {(ev.get('relay') or {}).get('published_events')} "
           f"events, {ev.get('depth_events')} waited" if ev else ""))
    return m


def scenario_p12(b: Bench):
    say(f"[P12] commit → event visible at a Kafka consumer: P3's workload ({b.p['p3_streams']} files × "
        f"{b.p['p3_rate']:.0f}/s × 4 KiB) for {b.p['p12_seconds']} s with the sink publishing to a local broker, "
        f"beside the broker's floor; then P1's workload ({b.p['p12_total_mib']} MiB) with events on vs off, "
        f"{b.p['runs']} run(s) each, alternating")
    py = kafka_python()
    if subprocess.run([py, "-c", "import confluent_kafka"], capture_output=True).returncode != 0:
        raise BenchError(f"{py} cannot import confluent_kafka: run ops/bench/run.sh (or ops/test.sh), which "
                         "installs it in the project's venv (TAILFLIGHT_PY_VENV)")
    # On the sink's disk by default, as a broker on this one machine would be; `p12_broker_tmpfs=1` puts
    # its log in memory, to tell the disk's share of the latencies from the CPU's.
    broker_dir = b.fresh_src("p12", "kafka") if b.p["p12_broker_tmpfs"] else b.fresh("p12", "kafka")
    t = time.monotonic()
    brokers = start_broker(broker_dir)
    res: dict = {"brokers": brokers, "broker_start_s": time.monotonic() - t, "floor_alone": {}}
    b.results["scenarios"]["P12"] = res
    say(f"  broker at {brokers}, ready after {res['broker_start_s']:.1f} s")
    failure = None
    p1 = {False: [], True: []}
    try:
        for txn in (False, True):
            try:
                res["floor_alone"]["transactional" if txn else "idempotent"] = floor_alone(b, brokers, txn)
            except Exception as e:  # information only: must not lose the scenario
                say(f"  floor alone FAILED: {e}")
                b.results["errors"][f"P12 floor alone{' (transactional)' if txn else ''}"] = str(e)
        try:
            res["run"] = events_run(b, brokers, broker_dir)
        except Exception as e:  # the ingest comparison still runs; the scenario fails at the end
            failure = e
            say(f"  events run FAILED: {e}")
        published = (res.get("run") or {}).get("published_events")
        if published:
            try:
                res["peer_run"] = peer_run(b, brokers, published / b.p["p12_seconds"], broker_dir)
            except Exception as e:  # information only: must not lose the scenario
                say(f"  peer relay run FAILED: {e}")
                b.results["errors"]["P12 peer relay"] = str(e)
        # One unmeasured run first, as in P1 and P11.
        ingest_run(b, "events-warm-up", None, broker_dir)
        for i in range(b.p["runs"]):
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                p1[on].append(ingest_run(b, f"events-{'on' if on else 'off'}-{i + 1}", brokers if on else None,
                                         broker_dir))
    finally:
        stop_broker(broker_dir)
        # Its segment files end in .log, which the suite keeps: only broker.log is worth keeping.
        rmtree(broker_dir / "data")
    res["p1"] = {"off": p1[False], "on": p1[True]}

    run = res.get("run") or {}
    ev, fl = run.get("events") or {}, run.get("floor") or {}
    alone = res["floor_alone"].get("idempotent") or {}
    txn = res["floor_alone"].get("transactional") or {}
    r50, r99 = ratio(ev.get("p50_ms"), fl.get("p50_ms")), ratio(ev.get("p99_ms"), fl.get("p99_ms"))
    res.update({"events_p50_ms": ev.get("p50_ms"), "events_p99_ms": ev.get("p99_ms"),
                "floor_p50_ms": fl.get("p50_ms"), "floor_p99_ms": fl.get("p99_ms"), "x_floor_p50": r50})
    rate = {on: median([m["bytes_per_s"] for m in p1[on]]) for on in (False, True)}
    cpu = {on: median([cpu_per_gb(m) for m in p1[on] if cpu_per_gb(m) is not None]) for on in (False, True)}
    r_rate = ratio(rate[True], rate[False])
    broker = {on: median([m.get("broker_cpu_s") for m in p1[on]]) for on in (False, True)}
    res.update({"ingest_on_bytes_per_s": rate[True], "ingest_off_bytes_per_s": rate[False], "x_ingest": r_rate})
    say(f"[P12] commit → range.committed event p50 {fmt_ms(ev.get('p50_ms'))}, p99 {fmt_ms(ev.get('p99_ms'))}; "
        f"the broker's floor during the run p50 {fmt_ms(fl.get('p50_ms'))}, p99 {fmt_ms(fl.get('p99_ms'))}: "
        f"x{fmt(r50, '.2f')} (p50, target ≤{LATENCY_TARGET}x); alone p50 {fmt_ms(alone.get('p50_ms'))}, "
        f"one transaction per message {fmt_ms(txn.get('p50_ms'))}")
    say(f"[P12] ingest with events {fmt_mb(rate[True])} vs without {fmt_mb(rate[False])}: x{fmt(r_rate, '.2f')} "
        f"(target ≥{INGEST_TARGET}x); watcher + sink CPU {fmt(cpu[True], '.2f')} vs {fmt(cpu[False], '.2f')} s/GB; "
        f"the broker's CPU over a run {fmt(broker[True], '.2f')} vs {fmt(broker[False], '.2f')} s")
    b.row(id="P12", scenario=f"commit → range.committed event visible at a read_committed Kafka consumer, p50, "
          f"P3's workload ({b.p['p12_seconds']} s) — vs the broker's floor in the same run (confluent-kafka "
          "transactional producer → read_committed consumer, 1 message / 10 ms, one transaction each, during "
          "the workload), p50",
          figure=fmt_ms(ev.get("p50_ms")), peer=fmt_ms(fl.get("p50_ms")), ratio=r50,
          target=f"≤{LATENCY_TARGET}× the floor", met=met_le(r50, LATENCY_TARGET))
    fls = fl.get("spread") or {}
    r_spread = ratio(ev.get("p50_ms"), fls.get("p50_ms"))
    res.update({"floor_spread_p50_ms": fls.get("p50_ms"), "x_floor_spread_p50": r_spread})
    b.row(id="P12", scenario="… vs the broker's floor for a transaction of the relay's shape, in the same run (the "
          "same floor client: every other transaction writes one message to each of the topic's partitions, "
          "as each relay transaction does), p50",
          figure=fmt_ms(ev.get("p50_ms")), peer=fmt_ms(fls.get("p50_ms")), ratio=r_spread,
          target=f"≤{LATENCY_TARGET}× (restated)", met=met_le(r_spread, LATENCY_TARGET))
    pr = res.get("peer_run") or {}
    pe, pfl = pr.get("peer") or {}, pr.get("floor") or {}
    r_peer = ratio(ev.get("p50_ms"), pe.get("p50_ms"))
    pfls = pfl.get("spread") or {}
    res.update({"peer_p50_ms": pe.get("p50_ms"), "x_peer_p50": r_peer,
                "peer_x_floor_p50": ratio(pe.get("p50_ms"), pfl.get("p50_ms")),
                "peer_x_floor_spread_p50": ratio(pe.get("p50_ms"), pfls.get("p50_ms"))})
    b.row(id="P12", scenario="… vs a plain transactional relay (the peer: tools/kafka_latency.py relay, "
          "confluent-kafka, events made at the rate the sink published them, back-to-back transactions of every "
          "event waiting, no position kept) during the same workload in a run of its own, p50 (the broker's "
          f"floor during that run: {fmt_ms(pfl.get('p50_ms'))}, the peer {fmt(res['peer_x_floor_p50'], '.2f')}× "
          f"it; of the relay's shape {fmt_ms(pfls.get('p50_ms'))}, the peer "
          f"{fmt(res['peer_x_floor_spread_p50'], '.2f')}× it)",
          figure=fmt_ms(ev.get("p50_ms")), peer=fmt_ms(pe.get("p50_ms")), ratio=r_peer,
          target="(report)", met="—")
    b.row(id="P12", scenario="… p99", figure=fmt_ms(ev.get("p99_ms")), peer=fmt_ms(fl.get("p99_ms")), ratio=r99,
          target="(report)", met="—")
    du = run.get("durable") or {}
    b.row(id="P12", scenario="… append → durable (the sink's commit log) in the same run, p50 (p99)",
          figure=f"{fmt_ms(du.get('p50_ms'))} ({fmt_ms(du.get('p99_ms'))})", peer="—", ratio=None,
          target="(info)", met="—")
    ph = run.get("relay_phases")
    b.row(id="P12", scenario="… where the relay's time goes, mean ms per transaction (the sink's relay.phase_us): "
          "waited = the oldest event's wait for the transaction before it; read = the outbox; begin, produce, "
          "deliver, commit = commit_transaction; confirm = reading the last records back (~1/s, beside publishing)", figure=phases_text(ph) if ph else "—", peer="—", ratio=None,
          target="(info)", met="—")
    ab = run.get("arrivals") or {}
    b.row(id="P12", scenario="… how the events reached the consumer: batches (one per fetch that found some, "
          "about one per relay transaction), p50 events per batch, p50 (p90) time between batches",
          figure=f"{ab.get('batches', '?')} batches, {ab.get('events_p50', '?')} events, "
                 f"{fmt_ms(ab.get('gap_p50_ms'))} ({fmt_ms(ab.get('gap_p90_ms'))}) apart",
          peer="—", ratio=None, target="(info)", met="—")
    b.row(id="P12", scenario="… the broker's floor with nothing else running, p50 (p99): idempotent producer; "
          "in the peer column one transaction per message (as the floor during the run)",
          figure=f"{fmt_ms(alone.get('p50_ms'))} ({fmt_ms(alone.get('p99_ms'))})",
          peer=f"{fmt_ms(txn.get('p50_ms'))} ({fmt_ms(txn.get('p99_ms'))})", ratio=None, target="(floor)", met="—")
    b.row(id="P12", scenario=f"ingest of P1's workload ({b.p['p12_total_mib']} MiB) with commit events published "
          "to Kafka — vs without events", figure=fmt_mb(rate[True]), peer=fmt_mb(rate[False]), ratio=r_rate,
          target=f"≥{INGEST_TARGET}×", met=met(r_rate, INGEST_TARGET))
    b.row(id="P12", scenario="… watcher + sink CPU per GB with events — vs without",
          figure=f"{fmt(cpu[True], '.2f')} s/GB", peer=f"{fmt(cpu[False], '.2f')} s/GB",
          ratio=ratio(cpu[True], cpu[False]), target="(info)", met="—")
    b.row(id="P12", scenario="… the Kafka broker's CPU over a run (on this machine's cores too), with events — vs "
          "without (idle)", figure=f"{fmt(broker[True], '.2f')} s", peer=f"{fmt(broker[False], '.2f')} s",
          ratio=None, target="(info)", met="—")
    b.notes.append("P12: event latency = arrival at the consumer − the record's timestamp, which is the sink's "
                   "commit time in whole ms taken as the round is recorded (before its manifest write); the "
                   "floor is measured the same way (timestamp = send time in whole ms), so both carry the "
                   "truncation (0–1 ms). The relay and the floor during the run both publish in transactions. "
                   "The broker (one JVM, its log on the sink's disk) runs on the same cores as the simulator, "
                   "the watcher and the sink: what it costs them is in the ingest ratio.")
    if failure is not None:
        raise failure
