"""P10: fan-out. P1's workload (16 files written as fast as the simulator can) with 8 pyarrow
consumers following every file, against the same workload with none, alternating: ingest must
keep ≥0.85× of its rate, and each consumer must keep up (it has every byte soon after ingest).

The ceiling on this machine: consumers that keep up do their work within the ingest, on the same
cores. The CPU that no sink can save (the simulator's, the consumers' own, and the watcher's and
sink's for ingest alone) divided by the cores is the least time the fanned-out run can take;
the run alone over that time is the most the ratio can be here."""

from __future__ import annotations

import json
import os
import resource
import time

from ..analysis import median, ratio
from ..config import MiB
from ..formatting import fmt, fmt_mb, met
from ..harness import Bench, BenchError, Pipeline, dir_bytes, rmtree, say, wait_commits
from .p8 import first_file, start_follower, wait_subscribed

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
        wait_subscribed(pl, consumers, [proc for _, proc in followers])
        t0 = time.monotonic()
        # The simulator is the only child reaped while it runs: the change in
        # the children's rusage is its CPU time.
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        sim = b.sim(d, "sim", src, "--streams", 16, "--rate", 0, "--frame", "1MiB", "--chunk", "64MiB",
                    "--total", f"{total_mib}MiB")
        if sim.wait(600) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        sim_cpu_s = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        total, _ = dir_bytes(src)
        wait_commits(pl.cl, total, 900, f"{name} to arrive", (pl.sink, pl.watcher))
        ingest_s = time.monotonic() - t0
        watcher_cpu_s, sink_cpu_s = pl.watcher.cpu_seconds(), pl.sink.cpu_seconds()
        behind_s, consumers_cpu_s = [], 0.0
        for out, proc in followers:
            proc.wait(600)
            got = json.loads(out.read_text().strip().splitlines()[-1])
            if got["bytes"] < total_mib * MiB:
                raise BenchError(f"{name}: a consumer got {got['bytes']} of {total_mib * MiB} bytes")
            # The consumer's clock started about when the simulator's did.
            behind_s.append(max(0.0, got["seconds"] - ingest_s))
            consumers_cpu_s += got.get("cpu_s") or 0.0
    finally:
        for _, proc in followers:
            if proc.poll() is None:
                proc.kill()
        pl.kill_all()
    m = {"name": name, "consumers": consumers, "total_bytes": total, "ingest_bytes_per_s": total / ingest_s,
         "ingest_s": ingest_s, "consumers_done_after_ingest_s": behind_s,
         "cpu_s": {"sim": sim_cpu_s, "watcher": watcher_cpu_s, "sink": sink_cpu_s, "consumers": consumers_cpu_s}}
    say(f"  {name}: {consumers} consumer(s), ingest {total / ingest_s / 1e6:.0f} MB/s"
        + (f"; consumers had every byte {max(behind_s):.2f} s after ingest at most" if behind_s else "")
        + f"; CPU s: sim {sim_cpu_s:.1f}, watcher {watcher_cpu_s or 0:.1f}, sink {sink_cpu_s or 0:.1f}, "
          f"consumers {consumers_cpu_s:.1f}")
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
    r = ratio(v8, v0)
    # The ceiling: the unavoidable CPU of the fanned-out run over the cores, against the run alone.
    ncpu = os.cpu_count() or 1
    unavoidable = median([r0["cpu_s"]["sim"] + (r0["cpu_s"]["watcher"] or 0) + (r0["cpu_s"]["sink"] or 0)
                          for r0 in alone])
    consumers_cpu = median([r8["cpu_s"]["consumers"] for r8 in fanned])
    serving_cpu = median([(r8["cpu_s"]["sink"] or 0) - (r0["cpu_s"]["sink"] or 0) for r8, r0 in zip(fanned, alone)])
    t0 = median([r0["ingest_s"] for r0 in alone])
    least_s = (unavoidable + consumers_cpu) / ncpu
    ceiling = min(1.0, t0 / least_s) if least_s else None
    b.results["scenarios"]["P10"] = {"alone": alone, "fanned": fanned, "ceiling": ceiling,
                                     "consumers_cpu_s": consumers_cpu, "sink_serving_cpu_s": serving_cpu}
    say(f"[P10] ceiling here: ingest alone {t0:.2f} s; the fanned-out run needs at least "
        f"({unavoidable:.1f} s ingest CPU + {consumers_cpu:.1f} s consumers' CPU) / {ncpu} cores = {least_s:.2f} s "
        f"→ at most x{fmt(ceiling, '.2f')}; the sink spent {serving_cpu:.1f} s more CPU serving them")
    say(f"[P10] ingest with 8 consumers {fmt_mb(v8)} vs alone {fmt_mb(v0)}: x{fmt(r, '.2f')}; "
        f"consumers done {fmt(lag, '.2f')} s after ingest at most")
    b.row(id="P10", scenario="ingest of P1's workload with 8 pyarrow consumers following — vs with none",
          figure=fmt_mb(v8), peer=fmt_mb(v0), ratio=r, target=f"≥{TARGET}×", met=met(r, TARGET))
    b.row(id="P10", scenario=f"… the most this machine allows with consumers that keep up: the run alone over "
          f"the unavoidable CPU of the fanned-out run (simulator, watcher and sink for ingest, consumers) on "
          f"{ncpu} cores", figure=f"{fmt(ceiling, '.2f')}×", peer="—", ratio=None, target="(ceiling)", met="—")
    served_gb = median([r8["total_bytes"] * r8["consumers"] for r8 in fanned]) / 1e9
    per_gb_served = serving_cpu / served_gb if served_gb else None
    b.results["scenarios"]["P10"]["sink_serving_cpu_s_per_gb_served"] = per_gb_served
    b.row(id="P10", scenario="… the sink's own CPU per GB it served to the consumers (its CPU with 8 consumers "
          "less its CPU alone, over the bytes all 8 received)",
          figure=f"{fmt(per_gb_served, '.2f')} s/GB", peer="—", ratio=None, target="(info)", met="—")
    b.row(id="P10", scenario="… the slowest consumer had every byte this long after ingest ended",
          figure=f"{fmt(lag, '.2f')} s", peer="—", ratio=None, target="(keeps up)", met="—")
