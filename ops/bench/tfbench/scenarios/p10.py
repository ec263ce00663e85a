"""P10: fan-out. P1's workload (16 files written as fast as the simulator can) with 8 pyarrow
consumers following every file, against the same workload with none, alternating: ingest must
keep ≥0.85× of its rate, and each consumer must keep up (it has every byte soon after ingest)."""

from __future__ import annotations

import json
import time

from ..analysis import median, ratio
from ..config import MiB
from ..formatting import fmt, fmt_mb, met
from ..harness import Bench, BenchError, Pipeline, dir_bytes, rmtree, say, wait_commits
from .p8 import first_file, start_follower

TARGET = 0.85


def run(b: Bench, name: str, consumers: int, total_mib: int) -> dict:
    d = b.fresh("p10", name)
    src = b.fresh_src("p10", name)
    pl = Pipeline(b, d, src)
    followers = []
    try:
        pl.start_watcher()
        endpoint = first_file(pl, src)
        for i in range(consumers):
            out = d / f"consumer-{i}.json"
            followers.append((out, start_follower(endpoint, total_mib * MiB, out)))
        t0 = time.monotonic()
        sim = b.sim(d, "sim", src, "--streams", 16, "--rate", 0, "--frame", "1MiB", "--chunk", "64MiB",
                    "--total", f"{total_mib}MiB")
        if sim.wait(600) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        total, _ = dir_bytes(src)
        wait_commits(pl.cl, total, 900, f"{name} to arrive", (pl.sink, pl.watcher))
        ingest_s = time.monotonic() - t0
        behind_s = []
        for out, proc in followers:
            proc.wait(600)
            got = json.loads(out.read_text().strip().splitlines()[-1])
            if got["bytes"] < total_mib * MiB:
                raise BenchError(f"{name}: a consumer got {got['bytes']} of {total_mib * MiB} bytes")
            # The consumer's clock started about when the simulator's did.
            behind_s.append(max(0.0, got["seconds"] - ingest_s))
    finally:
        for _, proc in followers:
            if proc.poll() is None:
                proc.kill()
        pl.kill_all()
    m = {"name": name, "consumers": consumers, "total_bytes": total, "ingest_bytes_per_s": total / ingest_s,
         "consumers_done_after_ingest_s": behind_s}
    say(f"  {name}: {consumers} consumer(s), ingest {total / ingest_s / 1e6:.0f} MB/s"
        + (f"; consumers had every byte {max(behind_s):.2f} s after ingest at most" if behind_s else ""))
    rmtree(src)
    rmtree(pl.dest_root)
    return m


def scenario_p10(b: Bench):
    total_mib = b.p["p10_total_mib"]
    say(f"[P10] {total_mib} MiB in 16 files with 8 following consumers vs none, {b.p['runs']} run(s) each, "
        f"alternating")
    alone, fanned = [], []
    for i in range(b.p["runs"]):
        for consumers in ((0, 8) if i % 2 == 0 else (8, 0)):
            (fanned if consumers else alone).append(run(b, f"{consumers}-consumers-{i + 1}", consumers, total_mib))
    v0 = median([r["ingest_bytes_per_s"] for r in alone])
    v8 = median([r["ingest_bytes_per_s"] for r in fanned])
    lag = max((max(r["consumers_done_after_ingest_s"]) for r in fanned), default=None)
    b.results["scenarios"]["P10"] = {"alone": alone, "fanned": fanned}
    r = ratio(v8, v0)
    say(f"[P10] ingest with 8 consumers {fmt_mb(v8)} vs alone {fmt_mb(v0)}: x{fmt(r, '.2f')}; "
        f"consumers done {fmt(lag, '.2f')} s after ingest at most")
    b.row(id="P10", scenario="ingest of P1's workload with 8 pyarrow consumers following — vs with none",
          figure=fmt_mb(v8), peer=fmt_mb(v0), ratio=r, target=f"≥{TARGET}×", met=met(r, TARGET))
    b.row(id="P10", scenario="… the slowest consumer had every byte this long after ingest ended",
          figure=f"{fmt(lag, '.2f')} s", peer="—", ratio=None, target="(keeps up)", met="—")
