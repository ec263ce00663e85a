"""P1 and P2: 16 files written as fast as the simulator can, to a sink on loopback, plaintext (P1)
and with mutual TLS (P2), in ABBA order after one unmeasured run; compared with the TCP and disk
ceilings (P1) and with plaintext (P2)."""

from __future__ import annotations

import os
import resource
import time

from ..analysis import median, ratio
from ..config import GB, TARGETS, MiB
from ..formatting import cpu_line, fmt, fmt_mb, met
from ..harness import (wait_same_names, Bench, BenchError, Pipeline, dir_bytes, now_ns, rmtree, say, trouble_note,
                       wait_commits)


def throughput_run(b: Bench, name: str, tls: bool, watch_extra=(), sink_extra=(), total_mib=None,
                   watch_to=None) -> dict:
    """One P1 run: `total_mib` (by default P1's) in 16 files written as fast as the simulator can.
    `watch_to=""` starts the watcher without --to (it finds its sink through a coordinator)."""
    total_mib = b.p["p1_total_mib"] if total_mib is None else total_mib
    d = b.fresh("p1", name)
    src = b.fresh_src("p1", name)
    os.sync()
    pl = Pipeline(b, d, src, tls=tls, watch_extra=watch_extra, sink_extra=sink_extra)
    try:
        pl.start_watcher(to=watch_to)
        time.sleep(0.5)
        t0 = now_ns()
        # The simulator is the only child reaped while it runs: the change in
        # the children's rusage is its CPU time.
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        sim = b.sim(d, "sim", src, "--streams", b.p["p1_streams"], "--rate", 0, "--frame", "1MiB",
                    "--chunk", b.p["p1_chunk"], "--total", f"{total_mib}MiB")
        if sim.wait(600) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        sim_s = (now_ns() - t0) / 1e9
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        sim_cpu_s = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        total, nfiles = dir_bytes(src)
        wait_commits(pl.cl, total, 900, f"{name} to arrive", (pl.sink, pl.watcher))
        elapsed = (pl.cl.last_ns - t0) / 1e9
        wait_same_names(src, pl.dest, 60)
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
    # of memory (a VM may hand freed pages back to its host), and the run
    # after them was the slowest of every series, always on the plaintext side.
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
