"""P8: one pyarrow consumer of a live-tail subscription (Flight DoGet). 16 files are written as
fast as the simulator can while a consumer follows them; once they are in, a second consumer
reads every durable byte from the beginning. Its rate is compared with the same client's DoGet
from a minimal in-memory pyarrow Flight server (tools/flight_memory_server.py): the ceiling for
this client on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ..analysis import median, ratio
from ..config import SOURCE, MiB
from ..formatting import fmt, fmt_mb, met
from ..harness import Bench, BenchError, Pipeline, Proc, dir_bytes, free_port, rmtree, say, wait_commits, wait_port

TOOLS = Path(__file__).resolve().parents[2] / "tools"
TARGET = 0.7


def read_flight(endpoint: str, ticket: str, until: int = 0, timeout: float = 600) -> dict:
    cp = subprocess.run([sys.executable, TOOLS / "flight_read.py", endpoint, ticket, "--until", str(until)],
                        capture_output=True, text=True, timeout=timeout)
    if cp.returncode != 0:
        raise BenchError(f"flight_read failed: {cp.stderr[-2000:]}")
    return json.loads(cp.stdout.strip().splitlines()[-1])


FIRST = b"the source exists before a consumer subscribes\n"


def first_file(pl: Pipeline, src: Path) -> str:
    """Writes a first file and waits until the sink has it (a subscription names a source the
    sink knows); returns the sink's endpoint for pyarrow."""
    (src / "first.dat").write_bytes(FIRST)
    deadline = time.monotonic() + 60
    while not (pl.status() or {}).get("files"):
        if time.monotonic() > deadline:
            raise BenchError("the first file never reached the sink")
        time.sleep(0.1)
    return pl.endpoint.replace("http://", "grpc://")


def wait_subscribed(pl: Pipeline, count: int, procs) -> None:
    """Waits until the sink serves `count` subscriptions (a consumer still importing pyarrow
    would see the first writes late, and that is not the sink's latency)."""
    deadline = time.monotonic() + 60
    while len((pl.status() or {}).get("subscriptions") or []) < count:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise BenchError(f"fewer than {count} consumer(s) subscribed")
        time.sleep(0.1)


def start_follower(endpoint: str, until: int, out: Path) -> subprocess.Popen:
    """A consumer following the simulator's files until it has `until` bytes; its JSON to `out`."""
    ticket = json.dumps({"source": SOURCE, "globs": [f"{SOURCE}/*.xtc2*"], "follow": True})
    return subprocess.Popen([sys.executable, TOOLS / "flight_read.py", endpoint, ticket, "--until", str(until)],
                            stdout=open(out, "w"), stderr=subprocess.STDOUT)


def ceiling_run(b: Bench, total: int) -> float:
    d = b.fresh("p8", "ceiling")
    port = free_port()
    server = Proc("flight-memory-server", [sys.executable, TOOLS / "flight_memory_server.py",
                                           "--port", port, "--bytes", total], d)
    try:
        wait_port("127.0.0.1", port, 60, server)
        got = read_flight(f"grpc://127.0.0.1:{port}", "any")
    finally:
        server.stop()
    return got["bytes"] / got["seconds"]


def tailflight_run(b: Bench, name: str, total_mib: int) -> dict:
    d = b.fresh("p8", name)
    src = b.fresh_src("p8", name)
    pl = Pipeline(b, d, src)
    follower = None
    try:
        pl.start_watcher()
        endpoint = first_file(pl, src)
        follower_out = d / "follower.json"
        follower = start_follower(endpoint, total_mib * MiB, follower_out)
        t0 = time.monotonic()
        sim = b.sim(d, "sim", src, "--streams", 16, "--rate", 0, "--frame", "1MiB", "--chunk", "64MiB",
                    "--total", f"{total_mib}MiB")
        if sim.wait(600) != 0:
            raise BenchError(f"sim failed: {sim.log_tail()}")
        total, nfiles = dir_bytes(src)
        wait_commits(pl.cl, total, 900, f"{name} to arrive", (pl.sink, pl.watcher))
        ingest_s = time.monotonic() - t0
        follower.wait(600)
        followed = json.loads(follower_out.read_text().strip().splitlines()[-1])
        catch_up = read_flight(endpoint, json.dumps({"source": SOURCE, "globs": [f"{SOURCE}/*.xtc2*"]}))
    finally:
        if follower and follower.poll() is None:
            follower.kill()
        pl.kill_all()
    m = {"name": name, "total_bytes": total, "files": nfiles, "ingest_bytes_per_s": total / ingest_s,
         "followed_bytes": followed["bytes"], "followed_bytes_per_s": followed["bytes"] / followed["seconds"],
         "catch_up_bytes": catch_up["bytes"], "catch_up_bytes_per_s": catch_up["bytes"] / catch_up["seconds"]}
    say(f"  {name}: ingest {m['ingest_bytes_per_s'] / 1e6:.0f} MB/s; following consumer "
        f"{m['followed_bytes_per_s'] / 1e6:.0f} MB/s ({followed['bytes'] / MiB:.0f} MiB); catching up "
        f"{m['catch_up_bytes_per_s'] / 1e6:.0f} MB/s ({catch_up['bytes'] / MiB:.0f} MiB)")
    rmtree(src)
    rmtree(pl.dest_root)
    return m


def scenario_p8(b: Bench):
    total_mib = b.p["p8_total_mib"]
    say(f"[P8] a pyarrow consumer of {total_mib} MiB in 16 growing files vs pyarrow DoGet from an "
        f"in-memory Flight server, {b.p['runs']} run(s) each, alternating")
    ceilings, runs = [], []
    for i in range(b.p["runs"]):
        ceilings.append(ceiling_run(b, total_mib * MiB))
        runs.append(tailflight_run(b, f"run-{i + 1}", total_mib))
    ceiling = median(ceilings)
    catch_up = median([r["catch_up_bytes_per_s"] for r in runs])
    followed = median([r["followed_bytes_per_s"] for r in runs])
    ingest = median([r["ingest_bytes_per_s"] for r in runs])
    b.results["scenarios"]["P8"] = {"runs": runs, "ceilings": ceilings, "ceiling_bytes_per_s": ceiling}
    r = ratio(catch_up, ceiling)
    say(f"[P8] catching up {fmt_mb(catch_up)} vs in-memory Flight {fmt_mb(ceiling)}: x{fmt(r, '.2f')}; "
        f"following {fmt_mb(followed)} while ingest ran at {fmt_mb(ingest)}")
    b.row(id="P8", scenario="one pyarrow consumer reading 16 files' durable bytes (DoGet) — vs pyarrow DoGet "
          "from an in-memory Flight server", figure=fmt_mb(catch_up), peer=fmt_mb(ceiling), ratio=r,
          target=f"≥{TARGET}×", met=met(r, TARGET))
    b.row(id="P8", scenario="… the same consumer following the files while they are written — vs ingest",
          figure=fmt_mb(followed), peer=fmt_mb(ingest), ratio=ratio(followed, ingest),
          target="(info: bounded by ingest)", met="—")
