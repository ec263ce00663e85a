"""P9: append → visible at a consumer. P3's workload (many files, small appends at a fixed rate)
with a pyarrow consumer following every file: the latency from each write's return until a data
row holding its last byte reached the consumer, beside append → durable at the sink (its commit
log) in the same run. Goal: visible p50 within 1 ms of durable p50."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from ..analysis import latency_summary, tailflight_latencies
from ..formatting import fmt_ms, met_le
from ..harness import Bench, BenchError, Pipeline, dir_bytes, read_write_log, rmtree, say, wait_commits
from .p3_workload import p3_sim_args
from .p8 import FIRST, TOOLS, first_file

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


def scenario_p9(b: Bench):
    say(f"[P9] append → visible at a pyarrow consumer, {b.p['p3_streams']} files × {b.p['p3_rate']:.0f}/s "
        f"× 4 KiB, {b.p['p3_seconds']} s, beside append → durable")
    d = b.fresh("p9", "run")
    src = b.fresh_src("p9", "run")
    logs = b.fresh_src("p9-logs", "run")
    pl = Pipeline(b, d, src, logdir=logs)
    consumer = None
    try:
        pl.start_watcher()
        endpoint = first_file(pl, src)
        ticket = json.dumps({"source": "bench", "globs": ["bench/*.xtc2*"], "follow": True})
        consumer = subprocess.Popen([sys.executable, TOOLS / "flight_read.py", endpoint, ticket,
                                     "--arrivals", logs / "arrivals.log"],
                                    stdout=subprocess.DEVNULL, stderr=open(logs / "consumer.log", "w"))
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
        if consumer and consumer.poll() is None:
            consumer.terminate()
            consumer.wait(10)
        pl.kill_all()
    writes = read_write_log(logs / "writes.log")
    durable, missing_d = tailflight_latencies(writes, pl.cl.records)
    visible, missing_v = tailflight_latencies(writes, read_arrivals(logs / "arrivals.log"))
    sd, sv = latency_summary(durable, missing_d), latency_summary(visible, missing_v)
    b.results["scenarios"]["P9"] = {"durable": sd, "visible": sv}
    gap = (sv["p50_ms"] - sd["p50_ms"]) if sv["p50_ms"] is not None and sd["p50_ms"] is not None else None
    say(f"[P9] append → visible p50 {fmt_ms(sv['p50_ms'])} p99 {fmt_ms(sv['p99_ms'])} (missing {missing_v}); "
        f"append → durable p50 {fmt_ms(sd['p50_ms'])} p99 {fmt_ms(sd['p99_ms'])} (missing {missing_d})")
    b.row(id="P9", scenario="append → visible at a following pyarrow consumer, p50 — vs append → durable p50 "
          "(same run)", figure=fmt_ms(sv["p50_ms"]), peer=fmt_ms(sd["p50_ms"]), ratio=None,
          target=f"within {TARGET_MS} ms", met=met_le(gap, TARGET_MS))
    b.row(id="P9", scenario="… p99", figure=fmt_ms(sv["p99_ms"]), peer=fmt_ms(sd["p99_ms"]), ratio=None,
          target="(report)", met="—")
    rmtree(src)
    rmtree(pl.dest_root)
