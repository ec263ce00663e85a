"""P4: throughput of a data set copied whole at emulated RTTs (`tailflight-bench delay-line`) over a
rate-limited veth to a sink in a network namespace, with 4 connections and 1, against tailflight
at the lowest RTT and an rsync daemon behind the same path."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from ..analysis import medians_by_rtt, ratio
from ..ceilings import iperf_ns
from ..config import TARGETS, MiB
from ..formatting import fmt, fmt_mb, met
from ..harness import (Bench, BenchError, NetNs, Pipeline, Proc, dir_bytes, free_port, rmtree, say, trouble_note,
                       wait_commits, wait_port)


def delay_line(b: Bench, d: Path, name: str, to: str, rtt_ms: int) -> tuple[Proc, int]:
    port = free_port()
    p = Proc(name, [b.bench_bin, "delay-line", "--listen", f"127.0.0.1:{port}", "--to", to,
                    "--rtt", f"{rtt_ms}ms"], d, env=b.env)
    wait_port("127.0.0.1", port, 20, p)
    return p, port


def p4_tailflight(b: Bench, ns: NetNs | None, src: Path, total: int, rtt: int, conns: int, i: int) -> dict:
    d = b.fresh("p4", f"tf{conns}-rtt{rtt}-{i}")
    host = ns.ns_ip if ns else "127.0.0.1"
    os.sync()
    pl = Pipeline(b, d, src, sink_host=host, netns=ns.name if ns else None,
                  watch_extra=["--connections", conns])
    dl = None
    try:
        dl, port = delay_line(b, d, "delay-line", f"{host}:{pl.port}", rtt)
        pl.start_watcher(to=f"http://127.0.0.1:{port}")
        wait_commits(pl.cl, total, 600, f"P4 rtt {rtt} ms", (pl.sink, pl.watcher, dl))
        dl_cpu = dl.cpu_seconds()
        m = pl.finish(total)
    finally:
        pl.kill_all()
        if dl:
            dl.stop(5)
    elapsed = (pl.cl.last_ns - pl.watch_start_ns) / 1e9
    steady = (pl.cl.last_ns - pl.cl.first_ns) / 1e9
    m.update({"rtt_ms": rtt, "connections": conns, "seconds": elapsed, "bytes_per_s": total / elapsed,
              "steady_bytes_per_s": total / steady if steady > 0 else None,
              "first_commit_s": (pl.cl.first_ns - pl.watch_start_ns) / 1e9,
              "delay_line_cpu_s": dl_cpu})
    ok, _ = b.verify(src, pl.dest)
    m["verified"] = ok
    say(f"  tailflight {conns} conn, RTT {rtt:3d} ms: {total / elapsed / 1e6:6.1f} MB/s "
        f"(first byte recorded after {m['first_commit_s']:.2f}s; first-to-last "
        f"{fmt_mb(m['steady_bytes_per_s'])}); verify {'identical' if ok else 'DIFFERENT'}; "
        f"delay line {fmt(dl_cpu, '.1f')} CPU s")
    rmtree(pl.dest_root)
    return m


def p4_rsync(b: Bench, ns: NetNs | None, src: Path, total: int, rtt: int, i: int) -> dict:
    d = b.fresh("p4", f"rsync-rtt{rtt}-{i}")
    dest = d / "dest"
    dest.mkdir()
    host = ns.ns_ip if ns else "127.0.0.1"
    port = free_port()
    conf = d / "rsyncd.conf"
    conf.write_text(f"pid file = {d}/rsyncd.pid\nuse chroot = no\nlog file = {d}/rsyncd-own.log\n"
                    f"[bench]\n    path = {dest}\n    read only = no\n    uid = root\n    gid = root\n")
    os.sync()
    daemon = Proc("rsyncd", ["rsync", "--daemon", "--no-detach", "--config", conf, "--port", port,
                             "--address", host], d, netns=ns.name if ns else None)
    dl = None
    try:
        wait_port(host, port, 20, daemon)
        dl, dport = delay_line(b, d, "delay-line", f"{host}:{port}", rtt)
        t0 = time.monotonic()
        cp = subprocess.run(["rsync", "-a", "--inplace", f"{src}/", f"rsync://127.0.0.1:{dport}/bench/"],
                            capture_output=True, text=True, timeout=900)
        elapsed = time.monotonic() - t0
        if cp.returncode != 0:
            raise BenchError(f"rsync failed: {cp.stderr[-1000:]}")
    finally:
        if dl:
            dl.stop(5)
        daemon.stop(5)
    ok, _ = b.verify(src, dest)
    say(f"  rsync daemon,   RTT {rtt:3d} ms: {total / elapsed / 1e6:6.1f} MB/s; verify "
        f"{'identical' if ok else 'DIFFERENT'}")
    rmtree(dest)
    return {"rtt_ms": rtt, "seconds": elapsed, "bytes_per_s": total / elapsed, "verified": ok}


def scenario_p4(b: Bench):
    d = b.fresh("p4")
    ns = NetNs(b.netns, b.p["p4_rate"])
    res: dict = {"rtts": b.p["p4_rtts"]}
    try:
        ns.up()
        b.netns_up = True
        res["path"] = (f"watcher → loopback → delay line → veth with tbf {b.p['p4_rate']} each way → "
                       f"sink in network namespace {ns.name} ({ns.ns_ip})")
    except BenchError as e:
        ns.down()
        ns = None
        res["path"] = "loopback only (network namespace setup failed: no rate limit)"
        res["netns_error"] = str(e)
        b.notes.append(f"P4: network namespaces failed ({e}); measured on loopback WITHOUT the "
                       f"{b.p['p4_rate']} tbf rate limit.")
    try:
        say(f"[P4] throughput vs RTT {b.p['p4_rtts']} ms; path: {res['path']}")
        if ns:
            link = iperf_ns(b, d, ns, 4)
            res["link_bytes_per_s"] = link
            say(f"  link ceiling (iperf3 -P 4 through the veth+tbf, no delay): {link / 1e6:.0f} MB/s")
        src = b.fresh_src("p4", "src")
        cp = b.tf("sim", "--dir", src, "--streams", 16, "--rate", 0, "--frame", "1MiB", "--chunk", "64MiB",
                  "--total", f"{b.p['p4_total_mib']}MiB")
        total, nfiles = dir_bytes(src)
        res["total_bytes"], res["files"] = total, nfiles
        say(f"  data set: {nfiles} complete files, {total / MiB:.0f} MiB on tmpfs, copied whole by each run")
        runs: dict[str, list[dict]] = {"tf4": [], "tf1": [], "rsync": []}
        for i in range(b.p["p4_runs"]):
            for rtt in b.p["p4_rtts"]:
                runs["tf4"].append(p4_tailflight(b, ns, src, total, rtt, 4, i + 1))
                runs["tf1"].append(p4_tailflight(b, ns, src, total, rtt, 1, i + 1))
                runs["rsync"].append(p4_rsync(b, ns, src, total, rtt, i + 1))
        res["runs"] = runs
        trouble_note(b, "P4", runs["tf4"] + runs["tf1"])
        med = medians_by_rtt(runs, b.p["p4_rtts"])
        res["medians"] = med
        lo, hi = min(b.p["p4_rtts"]), max(b.p["p4_rtts"])
        r = ratio(med["tf4"][hi], med["tf4"][lo])
        res["ratio_hi_lo"] = r
        say(f"[P4] tailflight at {hi} ms {fmt_mb(med['tf4'][hi])} vs at {lo} ms {fmt_mb(med['tf4'][lo])}: "
            f"x{fmt(r, '.2f')}; single connection at {hi} ms {fmt_mb(med['tf1'][hi])}; "
            f"rsync at {hi} ms {fmt_mb(med['rsync'][hi])}")
        b.row(id="P4", scenario=f"throughput at RTT {hi} ms vs {lo} ms, {b.p['p4_rate']} tbf link"
              + ("" if ns else " (NO rate limit: loopback fallback)"),
              figure=fmt_mb(med["tf4"][hi]), peer=fmt_mb(med["tf4"][lo]), ratio=r,
              target=f"≥{TARGETS['P4']}", met=met(r, TARGETS["P4"]))
        b.row(id="P4", scenario=f"… single connection at {hi} ms (vs tailflight at {lo} ms)",
              figure=fmt_mb(med["tf1"][hi]), peer=fmt_mb(med["tf4"][lo]),
              ratio=ratio(med["tf1"][hi], med["tf4"][lo]), target="(info)", met="—")
        b.row(id="P4", scenario=f"… rsync daemon over the same path at {hi} ms (tailflight ÷ rsync)",
              figure=fmt_mb(med["tf4"][hi]), peer=fmt_mb(med["rsync"][hi]),
              ratio=ratio(med["tf4"][hi], med["rsync"][hi]), target="(info)", met="—")
        rmtree(src)
    finally:
        b.results["scenarios"]["P4"] = res
        if ns:
            Proc.stop_all()
            ns.down()
            b.netns_up = False
