"""P14: a one-shot copy of P1's 16 files (already written, on tmpfs) to the disk, by
`tailflight send` to a sink on loopback, beside XRootD's xrdcp to an xrootd server on the same
loopback and rsync, in the same run, the order rotated each round. Every copy is timed until its
bytes are durable: tailflight acknowledges a range only after fdatasync and exits once every
file is sealed; the peers are followed by a syncfs of their destination. CPU per GB counts every
process of the copy (client and server)."""

from __future__ import annotations

import os
import pwd
import resource
import shutil
import subprocess
import time
from pathlib import Path

from ..analysis import median, ratio
from ..config import GB, MiB
from ..formatting import fmt, fmt_mb, met
from ..harness import Bench, BenchError, Pipeline, Proc, dir_bytes, free_port, rmtree, say, wait_port

TARGET = 1.0


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def syncfs(path: Path) -> None:
    subprocess.run(["sync", "-f", str(path)], check=True)


def timed(argv, what: str) -> tuple[float, float]:
    """Runs a client to its end: (seconds, its CPU seconds)."""
    cpu0, t0 = children_cpu(), time.monotonic()
    cp = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=1800)
    seconds, cpu = time.monotonic() - t0, children_cpu() - cpu0
    if cp.returncode != 0:
        raise BenchError(f"{what} failed ({cp.returncode}): {(cp.stdout + cp.stderr)[-1500:]}")
    return seconds, cpu


def run_send(b: Bench, src: Path, round_no: int) -> dict:
    d = b.fresh("p14", f"send-{round_no}")
    pl = Pipeline(b, d, src)
    try:
        sink_cpu0 = pl.sink.cpu_seconds() or 0.0
        seconds, client_cpu = timed([b.bin, "send", "-r", "-q", "-P", 4, "--settle", "0s", f"{src}/",
                                     f"{pl.endpoint}/p14"], "tailflight send")
        server_cpu = (pl.sink.cpu_seconds() or 0.0) - sink_cpu0
    finally:
        pl.kill_all()
    ok, _ = b.verify(src, pl.dest_root / "p14")
    rmtree(pl.dest_root)
    return {"tool": "tailflight send", "seconds": seconds, "client_cpu_s": client_cpu,
            "server_cpu_s": server_cpu, "verified": ok}


def xrootd_available() -> bool:
    return shutil.which("xrootd") is not None and shutil.which("xrdcp") is not None


XROOTD_STARTS = 3


def start_xrootd(d: Path, dest: Path, admin: Path) -> tuple[int, Proc]:
    """Starts xrootd serving dest on a free port: (the port, the server).

    The port is free when chosen, but xrootd binds it on every address a moment later, and any
    connection opened meanwhile on this busy machine may have taken it as its local port (xrootd then
    exits with "address already in use"). A fresh port is tried then, a few times."""
    errors = []
    for attempt in range(1, XROOTD_STARTS + 1):
        port = free_port()
        cfg = d / "xrootd.cfg"
        cfg.write_text(f"all.export /\noss.localroot {dest}\nall.adminpath {admin}\nall.pidpath {admin}\n"
                       f"xrd.port {port}\n")
        # xrootd refuses to run as root.
        server = Proc("xrootd", ["xrootd", "-R", "nobody", "-c", cfg, "-l", d / "xrootd.log", "-n", "p14"], d)
        try:
            wait_port("127.0.0.1", port, 30, server)
            return port, server
        except BenchError as e:
            server.stop()
            errors.append(f"attempt {attempt} on port {port}: {e} {xrootd_log_tail(d)}")
    raise BenchError("xrootd did not start: " + "; ".join(errors))


def xrootd_log_tail(d: Path, lines: int = 3) -> str:
    """The end of xrootd's own log: with -n NAME it writes <dir of -l>/NAME/<file of -l>."""
    try:
        text = (d / "p14" / "xrootd.log").read_text(errors="replace").splitlines()
    except OSError:
        return "(no xrootd log)"
    return " | ".join(line.strip()[:300] for line in text[-lines:])


def run_xrdcp(b: Bench, src: Path, round_no: int) -> dict:
    d = b.fresh("p14", f"xrdcp-{round_no}")
    dest, admin = d / "dest", d / "admin"
    for path in (dest / "p14", admin):
        path.mkdir(parents=True)
    nobody = pwd.getpwnam("nobody")
    for path in (d, dest, dest / "p14", admin):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    port, server = start_xrootd(d, dest, admin)
    try:
        server_cpu0 = server.cpu_seconds() or 0.0
        t0 = time.monotonic()
        seconds, client_cpu = timed(["xrdcp", "--parallel", 4, "-r", "--silent", f"{src}/",
                                     f"root://127.0.0.1:{port}//p14/"], "xrdcp")
        syncfs(dest)
        seconds = time.monotonic() - t0
        server_cpu = (server.cpu_seconds() or 0.0) - server_cpu0
    finally:
        server.stop()
    # xrdcp -r puts the source directory's own name under the target.
    landed = dest / "p14" / src.name
    ok, _ = b.verify(src, landed if landed.is_dir() else dest / "p14")
    rmtree(dest)
    return {"tool": "xrdcp", "seconds": seconds, "client_cpu_s": client_cpu, "server_cpu_s": server_cpu,
            "verified": ok}


def run_rsync(b: Bench, src: Path, round_no: int) -> dict:
    d = b.fresh("p14", f"rsync-{round_no}")
    dest = d / "dest"
    t0 = time.monotonic()
    # rsync's local copy runs a sender and a receiver process over a pipe: both are its children.
    _, cpu = timed(["rsync", "-a", "--whole-file", f"{src}/", f"{dest}/"], "rsync")
    syncfs(dest)
    seconds = time.monotonic() - t0
    ok, _ = b.verify(src, dest)
    rmtree(dest)
    return {"tool": "rsync", "seconds": seconds, "client_cpu_s": cpu, "server_cpu_s": 0.0, "verified": ok}


def scenario_p14(b: Bench):
    total_mib = b.p["p1_total_mib"]
    say(f"[P14] one-shot copy of {b.p['p1_streams']} files, {total_mib} MiB (tmpfs to disk): tailflight send "
        f"beside xrdcp --parallel 4 to xrootd on loopback and rsync, order rotated, {b.p['runs']} round(s)")
    d = b.fresh("p14", "sim")
    src = b.fresh_src("p14", "src")
    sim = b.sim(d, "sim", src, "--streams", b.p["p1_streams"], "--rate", 0, "--frame", "1MiB",
                "--chunk", b.p["p1_chunk"], "--total", f"{total_mib}MiB")
    if sim.wait(600) != 0:
        raise BenchError(f"sim failed: {sim.log_tail()}")
    total, nfiles = dir_bytes(src)
    tools = [("tailflight send", run_send), ("rsync", run_rsync)]
    if xrootd_available():
        tools.insert(1, ("xrdcp", run_xrdcp))
    else:
        b.notes.append("P14: xrootd/xrdcp not installed (Debian's xrootd-server and xrootd-client): "
                       "no XRootD peer in this run.")
    runs: dict[str, list[dict]] = {name: [] for name, _ in tools}
    for round_no in range(b.p["runs"]):
        order = tools[round_no % len(tools):] + tools[:round_no % len(tools)]
        for name, run in order:
            os.sync()
            m = run(b, src, round_no + 1)
            m.update({"bytes_per_s": total / m["seconds"],
                      "cpu_s_per_gb": (m["client_cpu_s"] + m["server_cpu_s"]) / (total / GB)})
            runs[name].append(m)
            say(f"  {name} round {round_no + 1}: {total / MiB:.0f} MiB in {m['seconds']:.2f}s = "
                f"{m['bytes_per_s'] / 1e6:.0f} MB/s, {m['cpu_s_per_gb']:.2f} CPU s/GB (client "
                f"{m['client_cpu_s']:.2f} s, server {m['server_cpu_s']:.2f} s); verify "
                f"{'identical' if m['verified'] else 'DIFFERENT'}")
    rmtree(src)
    summary = {name: {"runs": rs, "median_bytes_per_s": median([r["bytes_per_s"] for r in rs]),
                      "median_cpu_s_per_gb": median([r["cpu_s_per_gb"] for r in rs])}
               for name, rs in runs.items()}
    b.results["scenarios"]["P14"] = {"total_bytes": total, "files": nfiles, "tools": summary}
    ours = summary["tailflight send"]
    for name, peer in summary.items():
        if name == "tailflight send":
            continue
        r = ratio(ours["median_bytes_per_s"], peer["median_bytes_per_s"])
        b.row(id="P14", scenario=f"one-shot copy of P1's files (durable) — tailflight send vs {name}",
              figure=fmt_mb(ours["median_bytes_per_s"]), peer=fmt_mb(peer["median_bytes_per_s"]), ratio=r,
              target=f"≥{TARGET}×", met=met(r, TARGET))
    b.notes.append("P14 CPU s/GB (client + server): " + ", ".join(
        f"{name} {fmt(s['median_cpu_s_per_gb'], '.2f')}" for name, s in summary.items()))
    if not all(r["verified"] for rs in runs.values() for r in rs):
        b.notes.append("P14: a destination was NOT identical to its source (see the JSON).")
