"""P9: append → visible at a consumer. P3's workload (many files, small appends at a fixed rate)
with a pyarrow consumer following every file: the latency from each write's return until a data
row holding its last byte reached the consumer, beside append → durable at the sink (its commit
log) in the same run. Goal: visible p50 within 1 ms of durable p50.

Beside them, the floor of the last hop on this machine under the same load: one row every 10 ms
from a pyarrow Flight server with nothing behind it (tools/flight_tick.py) to the same client."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

from ..analysis import latency_summary, tailflight_latencies
from ..formatting import fmt_ms, met_le
from ..harness import (Bench, BenchError, Pipeline, Proc, dir_bytes, free_port, read_write_log, rmtree, say,
                       wait_commits, wait_port)
from .p3_workload import p3_sim_args
from .p8 import FIRST, TOOLS, first_file, wait_subscribed

TARGET_MS = 1.0


def read_arrivals(path) -> list[tuple[str, int, int, int, int]]:
    """The consumer's --arrivals log as records tailflight_latencies takes."""
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4:
                out.append((parts[0], int(parts[1]), int(parts[2]), int(parts[3]), 0))
    return out


def tick_floor(path, writes) -> dict:
    """The tick reader's delays for ticks sent while the simulator wrote."""
    times = [at for ws in writes.values() for _, _, at in ws]
    first, last = min(times), max(times)
    delays = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and first <= int(parts[0]) <= last:
                delays.append(float(parts[1]))
    return latency_summary(delays, 0)


def scenario_p9(b: Bench):
    say(f"[P9] append → visible at a pyarrow consumer, {b.p['p3_streams']} files × {b.p['p3_rate']:.0f}/s "
        f"× 4 KiB, {b.p['p3_seconds']} s, beside append → durable")
    d = b.fresh("p9", "run")
    src = b.fresh_src("p9", "run")
    logs = b.fresh_src("p9-logs", "run")
    pl = Pipeline(b, d, src, logdir=logs)
    consumer = tick_reader = None
    tick_port = free_port()
    ticks = b.p["p3_seconds"] * 100
    tick_server = Proc("flight-tick-server", [sys.executable, TOOLS / "flight_tick.py", "serve", "--port",
                                              tick_port, "--count", ticks], logs)
    try:
        wait_port("127.0.0.1", tick_port, 60, tick_server)
        pl.start_watcher()
        endpoint = first_file(pl, src)
        ticket = json.dumps({"source": "bench", "globs": ["bench/*.xtc2*"], "follow": True})
        consumer = subprocess.Popen([sys.executable, TOOLS / "flight_read.py", endpoint, ticket,
                                     "--arrivals", logs / "arrivals.log"],
                                    stdout=subprocess.DEVNULL, stderr=open(logs / "consumer.log", "w"))
        # Started before the simulator, so that its start-up is not the run's; only the
        # ticks sent while the simulator wrote count.
        tick_reader = subprocess.Popen([sys.executable, TOOLS / "flight_tick.py", "read",
                                        f"grpc://127.0.0.1:{tick_port}"],
                                       stdout=open(logs / "ticks.log", "w"), stderr=subprocess.STDOUT)
        wait_subscribed(pl, 1, [consumer])
        sim = b.sim(logs, "sim", src, *p3_sim_args(b), "--write-log", logs / "writes.log")
        if sim.wait(b.p["p3_seconds"] + 60) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        total, _ = dir_bytes(src)
        wait_commits(pl.cl, total, 300, "P9 data to arrive", (pl.sink, pl.watcher))
        # The consumer is a moment behind the commits it reads of.
        deadline = time.monotonic() + 30
        while (time.monotonic() < deadline
               and sum(r[2] for r in read_arrivals(logs / "arrivals.log")) < total - len(FIRST)):
            time.sleep(0.2)
    finally:
        for proc in (consumer, tick_reader):
            if proc and proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        tick_server.stop()
        pl.kill_all()
    writes = read_write_log(logs / "writes.log")
    floor = tick_floor(logs / "ticks.log", writes)
    durable, missing_d = tailflight_latencies(writes, pl.cl.records)
    visible, missing_v = tailflight_latencies(writes, read_arrivals(logs / "arrivals.log"))
    sd, sv = latency_summary(durable, missing_d), latency_summary(visible, missing_v)
    b.results["scenarios"]["P9"] = {"durable": sd, "visible": sv, "flight_floor": floor}
    gap = (sv["p50_ms"] - sd["p50_ms"]) if sv["p50_ms"] is not None and sd["p50_ms"] is not None else None
    say(f"[P9] append → visible p50 {fmt_ms(sv['p50_ms'])} p99 {fmt_ms(sv['p99_ms'])} (missing {missing_v}); "
        f"append → durable p50 {fmt_ms(sd['p50_ms'])} p99 {fmt_ms(sd['p99_ms'])} (missing {missing_d}); "
        f"the last hop's floor p50 {fmt_ms(floor['p50_ms'])} p99 {fmt_ms(floor['p99_ms'])}")
    b.row(id="P9", scenario="append → visible at a following pyarrow consumer, p50 — vs append → durable p50 "
          "(same run)", figure=fmt_ms(sv["p50_ms"]), peer=fmt_ms(sd["p50_ms"]), ratio=None,
          target=f"within {TARGET_MS} ms", met=met_le(gap, TARGET_MS))
    b.row(id="P9", scenario="… p99", figure=fmt_ms(sv["p99_ms"]), peer=fmt_ms(sd["p99_ms"]), ratio=None,
          target="(report)", met="—")
    b.row(id="P9", scenario="… the floor of the last hop here: a row from a pyarrow Flight server with nothing "
          "behind it to the same client, during the run, p50 (p99)",
          figure=f"{fmt_ms(floor['p50_ms'])} ({fmt_ms(floor['p99_ms'])})", peer="—", ratio=None,
          target="(floor)", met="—")
    for log in logs.iterdir():
        shutil.move(log, d / log.name)
    rmtree(src)
    rmtree(pl.dest_root)
