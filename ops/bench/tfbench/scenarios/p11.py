"""P11: what metrics cost. P1's throughput run and P3's latency run with `--metrics-listen` on the
watcher and the sink and a scraper asking both for /metrics and /api/status every second (ten
times a usual Prometheus scrape interval), against the same runs without, alternating. Goal: at
most 2 % more watcher + sink CPU per byte and no latency change the runs can tell apart."""

from __future__ import annotations

import threading
import urllib.request

from ..analysis import median, ratio
from ..config import GB
from ..formatting import fmt, fmt_mb, met_le
from ..harness import Bench, free_port, say
from .p1_p2 import throughput_run
from .p3 import p3_tailflight

CPU_TARGET = 1.02


class Scraper:
    """Asks each port for /metrics and /api/status every second until stopped."""

    def __init__(self, ports: list[int]):
        self.ports, self.stop, self.scrapes = ports, threading.Event(), 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.wait(1.0):
            for port in self.ports:
                for path in ("/metrics", "/api/status"):
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                            r.read()
                        self.scrapes += 1
                    except OSError:
                        pass  # not listening yet, or gone

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def with_metrics(b: Bench, on: bool, run):
    """Runs `run(watch_extra, sink_extra)` with metrics listeners and a scraper, or without."""
    if not on:
        return run((), ())
    wport, sport = free_port(), free_port()
    with Scraper([wport, sport]) as scraper:
        m = run(("--metrics-listen", f"127.0.0.1:{wport}"), ("--metrics-listen", f"127.0.0.1:{sport}"))
    m["scrapes"] = scraper.scrapes
    return m


def cpu_per_gb(m: dict) -> float | None:
    gb = m["total_bytes"] / GB if m.get("total_bytes") else None
    cpu = (m.get("watcher_cpu_s") or 0) + (m.get("sink_cpu_s") or 0)
    return cpu / gb if gb else None


def scenario_p11(b: Bench):
    say(f"[P11] metrics on (listeners on both processes, /metrics and /api/status asked every second) vs off: "
        f"P1 and P3, {b.p['runs']} run(s) each, alternating")
    p1 = {False: [], True: []}
    p3 = {False: [], True: []}
    # One unmeasured run first, as in P1: the first run after a quiet spell is the slowest.
    throughput_run(b, "metrics-warm-up", tls=False)
    for i in range(b.p["runs"]):
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            tag = "on" if on else "off"
            p1[on].append(with_metrics(b, on, lambda wx, sx: throughput_run(
                b, f"metrics-{tag}-{i + 1}", tls=False, watch_extra=wx, sink_extra=sx)))
        for on in ((True, False) if i % 2 == 0 else (False, True)):
            tag = "on" if on else "off"
            p3[on].append(with_metrics(b, on, lambda wx, sx: p3_tailflight(
                b, i + 1, wx, f"metrics {tag}", sink_extra=sx)))
    rate = {on: median([m["bytes_per_s"] for m in p1[on]]) for on in (False, True)}
    cpu = {on: median([cpu_per_gb(m) for m in p1[on] if cpu_per_gb(m) is not None]) for on in (False, True)}
    p50 = {on: median([m["p50_ms"] for m in p3[on] if m.get("p50_ms") is not None]) for on in (False, True)}
    p99 = {on: median([m["p99_ms"] for m in p3[on] if m.get("p99_ms") is not None]) for on in (False, True)}
    p3_cpu = {on: median([(m.get("watcher_cpu_s") or 0) + (m.get("sink_cpu_s") or 0) for m in p3[on]])
              for on in (False, True)}
    b.results["scenarios"]["P11"] = {"p1": {"off": p1[False], "on": p1[True]},
                                     "p3": {"off": p3[False], "on": p3[True]}}
    r_cpu = ratio(cpu[True], cpu[False])
    say(f"[P11] P1 {fmt_mb(rate[True])} with metrics vs {fmt_mb(rate[False])} without; watcher + sink CPU "
        f"{fmt(cpu[True], '.2f')} vs {fmt(cpu[False], '.2f')} s/GB: x{fmt(r_cpu, '.3f')}")
    say(f"[P11] P3 p50 {fmt(p50[True], '.2f')} ms with metrics vs {fmt(p50[False], '.2f')} ms without, p99 "
        f"{fmt(p99[True], '.1f')} vs {fmt(p99[False], '.1f')} ms; watcher + sink CPU {fmt(p3_cpu[True], '.1f')} vs "
        f"{fmt(p3_cpu[False], '.1f')} s")
    b.row(id="P11", scenario="P1 watcher + sink CPU per GB with metrics scraped every second — vs without",
          figure=f"{fmt(cpu[True], '.2f')} s/GB", peer=f"{fmt(cpu[False], '.2f')} s/GB", ratio=r_cpu,
          target=f"≤{CPU_TARGET}×", met=met_le(r_cpu, CPU_TARGET))
    b.row(id="P11", scenario="… P1 throughput with metrics — vs without", figure=fmt_mb(rate[True]),
          peer=fmt_mb(rate[False]), ratio=ratio(rate[True], rate[False]), target="(same)", met="—")
    b.row(id="P11", scenario="… P3 append → durable p50 with metrics — vs without",
          figure=f"{fmt(p50[True], '.2f')} ms", peer=f"{fmt(p50[False], '.2f')} ms",
          ratio=ratio(p50[True], p50[False]), target="(same)", met="—")
