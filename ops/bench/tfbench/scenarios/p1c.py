"""P1c: the cost of each byte. P1's files (written first, on tmpfs) copied to the disk by the pipeline
(a watcher and a sink on loopback, plaintext and mutual TLS) and, in the same run with the order
rotated each round, by the floors any mover pays for the same bytes:

- `copy_floor` (flight-server's example): pread, N plain TCP connections with a length prefix,
  pwrite and an fdatasync per acknowledgement window; and its TLS 1.3 twin (AES-128-GCM); each
  with the block-aligned middle of every payload written with O_DIRECT, as the sink writes large
  ranges on a local filesystem (the floor the pipeline is held to), and through the page cache
  (for information); and the same frames inside one HTTP/2 stream per connection (`--http2`: the
  h2 crate as hyper and tonic use it, each frame handed to h2 without a copy, each payload copied
  once out of h2's read buffer), plaintext and TLS: the least a mover pays on Arrow Flight's
  transport (for information, with the pipeline's ratio to it); and the bare and the HTTP/2 copy,
  plaintext and TLS, each with `--checksums` (for information): the checks the pipeline makes on every byte, a CRC-32C of
  each payload made by the sender and verified on arrival, and each file's CRC-64/NVME kept on
  both ends and compared, which is the floor of a copy with end-to-end integrity;
- `iperf3 -P N -Z` (sendfile), memory to memory;
- `fio`: the same bytes written with an fdatasync every 8 MiB by N jobs, on the sink's filesystem;
- `tonic_floor` (flight-server's example): a tonic client-streaming call of `bytes` messages per
  connection, memory to memory (what gRPC over h2 costs with nothing of ours).

CPU per GB is counted two ways: the processes' own (user + system time of every process of the
copy) and the machine's (busy time in /proc/stat over the copy, so softirq and the writeback
kworkers count), less what the machine spends at rest (measured before the rounds) for as long.
The pipeline's figures are given as ratios to the copy program's, plaintext and TLS."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

from ..analysis import median, ratio
from ..config import GB, MiB
from ..formatting import fmt, met_le
from ..harness import Bench, BenchError, Pipeline, Proc, dir_bytes, free_port, rmtree, say, wait_commits, wait_log

TARGET = 1.3
# Connections of every mover: the watcher's default.
CONNECTIONS = 4


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of /proc/stat's cpu line; iowait counts as idle."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    total = sum(fields[:8])
    return total - fields[3] - fields[4], total


CLK_TCK = os.sysconf("SC_CLK_TCK")


class MachineCpu:
    """CPU seconds the whole machine was busy between start() and stop()."""

    def start(self):
        self.t0, self.j0 = time.monotonic(), machine_jiffies()
        return self

    def stop(self) -> tuple[float, float]:
        """(busy CPU seconds, wall seconds)."""
        busy1, _ = machine_jiffies()
        return (busy1 - self.j0[0]) / CLK_TCK, time.monotonic() - self.t0


def rest_rate() -> float:
    """Busy CPU seconds per second of the machine at rest (the suite's own polling, the VM's noise)."""
    m = MachineCpu().start()
    time.sleep(2)
    busy, wall = m.stop()
    return busy / wall


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def json_line(text: str, what: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise BenchError(f"{what} printed no JSON line: {text[-800:]}")


def example(b: Bench, name: str) -> Path | None:
    tool = Path(b.bin).parent / "examples" / name
    return tool if tool.exists() else None


def run_pipeline(b: Bench, src: Path, total: int, tls: bool, tag: str) -> dict:
    d = b.fresh("p1c", tag)
    pl = Pipeline(b, d, src, tls=tls)
    try:
        machine = MachineCpu().start()
        pl.start_watcher()
        wait_commits(pl.cl, total, 900, f"{tag} to arrive", (pl.sink, pl.watcher))
        busy, seconds = machine.stop()
        m = pl.finish(total)
    finally:
        pl.kill_all()
    ok, _ = b.verify(src, pl.dest)
    rmtree(pl.dest_root)
    return {"seconds": seconds, "machine_cpu_s": busy, "verified": ok,
            "process_cpu_s": (m.get("watcher_cpu_s") or 0.0) + (m.get("sink_cpu_s") or 0.0),
            "watcher_cpu_s": m.get("watcher_cpu_s"), "sink_cpu_s": m.get("sink_cpu_s")}


def run_floor_pair(server: Proc, client_argv: list, what: str) -> tuple[float, float, dict, dict]:
    """Runs a floor example's client against its server (already started) until both end: (seconds, the
    machine's busy CPU seconds over the client's run, the client's JSON line, the server's)."""
    try:
        wait_log(server, "listening", 30)
        machine = MachineCpu().start()
        cp = subprocess.run([str(a) for a in client_argv], capture_output=True, text=True, timeout=900)
        busy, seconds = machine.stop()
        if cp.returncode != 0:
            raise BenchError(f"{what} failed: {(cp.stdout + cp.stderr)[-1500:]}")
        server.wait(60)
    finally:
        server.kill9()
    client = json_line(cp.stdout, f"{what} (client)")
    served = json_line(server.log_path.read_text(errors="replace"), f"{what} (server)")
    return seconds, busy, client, served


def process_cpu(*lines: dict) -> float:
    return sum(line["user_s"] + line["sys_s"] for line in lines)


def run_copy_floor(b: Bench, src: Path, total: int, tls: bool, direct: bool, tag: str,
                   http2: bool = False, checksums: bool = False) -> dict:
    tool = example(b, "copy_floor")
    d = b.fresh("p1c", tag)
    dest = d / "dest"
    port = free_port()
    tls_args = ((["--tls-dir", d] if tls else []) + (["--http2"] if http2 else [])
                + (["--checksums"] if checksums else []))
    receiver = Proc("copy-receive", [tool, "receive", "--listen", f"127.0.0.1:{port}", "--dest", dest,
                                     "--connections", CONNECTIONS, *tls_args, *(["--direct"] if direct else [])], d)
    files = sorted(src.iterdir())
    seconds, busy, sent, got = run_floor_pair(
        receiver, [tool, "send", "--to", f"127.0.0.1:{port}", "--connections", CONNECTIONS, *tls_args, *files],
        "copy_floor")
    ok, _ = b.verify(src, dest)
    rmtree(dest)
    return {"seconds": seconds, "machine_cpu_s": busy, "verified": ok, "process_cpu_s": process_cpu(sent, got)}


def run_iperf(b: Bench, total: int, tag: str) -> dict:
    d = b.fresh("p1c", tag)
    port = free_port()
    server = Proc("iperf3-z", ["iperf3", "-s", "-1", "--forceflush", "-B", "127.0.0.1", "-p", port], d)
    try:
        wait_log(server, "listening", 10)
        machine = MachineCpu().start()
        cp = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-P", str(CONNECTIONS), "-Z",
                             "-n", str(total), "-J"], capture_output=True, text=True, timeout=300)
        busy, seconds = machine.stop()
        data = json.loads(cp.stdout)
        if "error" in data:
            raise BenchError(f"iperf3: {data['error']}")
    finally:
        server.stop(5)
    # iperf3's utilisation is (user + system) / wall of each end, in percent of one core.
    end = data["end"]
    util = end["cpu_utilization_percent"]
    wall = end["sum_sent"]["seconds"]
    return {"seconds": seconds, "machine_cpu_s": busy, "verified": True,
            "process_cpu_s": (util["host_total"] + util["remote_total"]) / 100 * wall}


def run_fio(b: Bench, total: int, tag: str) -> dict:
    d = b.fresh("p1c", tag)
    cpu0 = children_cpu()
    machine = MachineCpu().start()
    cp = subprocess.run(["fio", "--name=p1c", f"--directory={d}", "--rw=write", "--bs=1M", "--ioengine=psync",
                         f"--numjobs={CONNECTIONS}", f"--size={total // CONNECTIONS}", "--fdatasync=8",
                         "--group_reporting", "--output-format=json"],
                        capture_output=True, text=True, timeout=900)
    busy, seconds = machine.stop()
    if cp.returncode != 0:
        raise BenchError(f"fio failed: {cp.stderr[-800:]}")
    rmtree(d)
    return {"seconds": seconds, "machine_cpu_s": busy, "verified": True, "process_cpu_s": children_cpu() - cpu0}


def run_tonic(b: Bench, total: int, tls: bool, tag: str) -> dict:
    tool = example(b, "tonic_floor")
    d = b.fresh("p1c", tag)
    port = free_port()
    tls_args = ["--tls-dir", d] if tls else []
    server = Proc("tonic-serve", [tool, "serve", "--listen", f"127.0.0.1:{port}", "--streams", CONNECTIONS,
                                  *tls_args], d)
    seconds, busy, pushed, served = run_floor_pair(
        server, [tool, "push", "--to", f"{'https' if tls else 'http'}://127.0.0.1:{port}", "--streams",
                 CONNECTIONS, "--total", total, *tls_args], "tonic_floor")
    return {"seconds": seconds, "machine_cpu_s": busy, "verified": served["bytes"] == pushed["bytes"],
            "process_cpu_s": process_cpu(pushed, served)}


def movers(b: Bench, src: Path, total: int) -> list[tuple[str, callable]]:
    """The copies of one round, by name; those whose tool is missing are left out (and said so)."""
    out = [("pipeline", lambda tag: run_pipeline(b, src, total, False, tag)),
           ("pipeline TLS", lambda tag: run_pipeline(b, src, total, True, tag))]
    if example(b, "copy_floor"):
        out += [("copy floor", lambda tag: run_copy_floor(b, src, total, False, True, tag)),
                ("copy floor TLS", lambda tag: run_copy_floor(b, src, total, True, True, tag)),
                ("copy floor, page cache", lambda tag: run_copy_floor(b, src, total, False, False, tag)),
                ("HTTP/2 copy floor", lambda tag: run_copy_floor(b, src, total, False, True, tag, http2=True)),
                ("HTTP/2 copy floor TLS", lambda tag: run_copy_floor(b, src, total, True, True, tag, http2=True)),
                ("copy floor, checksummed",
                 lambda tag: run_copy_floor(b, src, total, False, True, tag, checksums=True)),
                ("copy floor TLS, checksummed",
                 lambda tag: run_copy_floor(b, src, total, True, True, tag, checksums=True)),
                ("HTTP/2 copy floor, checksummed",
                 lambda tag: run_copy_floor(b, src, total, False, True, tag, http2=True, checksums=True)),
                ("HTTP/2 copy floor TLS, checksummed",
                 lambda tag: run_copy_floor(b, src, total, True, True, tag, http2=True, checksums=True))]
    else:
        b.notes.append("P1c: flight-server's copy_floor example is not built (ops/bench/run.sh builds it): "
                       "no ratio to the floor in this run.")
    if shutil.which("iperf3"):
        out.append(("iperf3 -Z", lambda tag: run_iperf(b, total, tag)))
    if shutil.which("fio"):
        out.append(("fio fdatasync", lambda tag: run_fio(b, total, tag)))
    if example(b, "tonic_floor"):
        out += [("tonic stream", lambda tag: run_tonic(b, total, False, tag)),
                ("tonic stream TLS", lambda tag: run_tonic(b, total, True, tag))]
    return out


def scenario_p1c(b: Bench):
    total_mib = b.p["p1c_total_mib"]
    say(f"[P1c] CPU per GB: {b.p['p1_streams']} files, {total_mib} MiB (tmpfs to disk) by the pipeline and by "
        f"the floors, order rotated, {b.p['runs']} round(s)")
    d = b.fresh("p1c", "sim")
    src = b.fresh_src("p1c", "src")
    sim = b.sim(d, "sim", src, "--streams", b.p["p1_streams"], "--rate", 0, "--frame", "1MiB",
                "--chunk", b.p["p1_chunk"], "--total", f"{total_mib}MiB")
    if sim.wait(600) != 0:
        raise BenchError(f"sim failed: {sim.log_tail()}")
    total, nfiles = dir_bytes(src)
    tools = movers(b, src, total)
    os.sync()
    rest = rest_rate()
    runs: dict[str, list[dict]] = {name: [] for name, _ in tools}
    for round_no in range(b.p["runs"]):
        order = tools[round_no % len(tools):] + tools[:round_no % len(tools)]
        for name, run in order:
            os.sync()
            m = run(f"{name.replace(' ', '-').replace(',', '')}-{round_no + 1}")
            m["machine_net_cpu_s"] = max(0.0, m["machine_cpu_s"] - rest * m["seconds"])
            m["bytes_per_s"] = total / m["seconds"]
            m["process_cpu_s_per_gb"] = m["process_cpu_s"] / (total / GB)
            m["machine_cpu_s_per_gb"] = m["machine_net_cpu_s"] / (total / GB)
            runs[name].append(m)
            say(f"  {name} round {round_no + 1}: {m['bytes_per_s'] / 1e6:.0f} MB/s, CPU s/GB: processes "
                f"{m['process_cpu_s_per_gb']:.2f}, machine {m['machine_cpu_s_per_gb']:.2f}"
                + ("" if m["verified"] else "; verify DIFFERENT"))
    rmtree(src)
    summary = {name: {"runs": rs,
                      "median_bytes_per_s": median([r["bytes_per_s"] for r in rs]),
                      "process_cpu_s_per_gb": median([r["process_cpu_s_per_gb"] for r in rs]),
                      "machine_cpu_s_per_gb": median([r["machine_cpu_s_per_gb"] for r in rs])}
               for name, rs in runs.items()}
    b.results["scenarios"]["P1c"] = {"total_bytes": total, "files": nfiles, "rest_cpu_per_s": rest,
                                     "movers": summary}
    for ours, floor in (("pipeline", "copy floor"), ("pipeline TLS", "copy floor TLS")):
        if floor not in summary:
            continue
        for kind in ("process", "machine"):
            mine, theirs = summary[ours][f"{kind}_cpu_s_per_gb"], summary[floor][f"{kind}_cpu_s_per_gb"]
            r = ratio(mine, theirs)
            b.row(id="P1c", scenario=f"CPU per GB ({kind}{'es' if kind == 'process' else ''}): {ours} vs the "
                  f"minimal {floor}", figure=f"{fmt(mine, '.2f')} s/GB", peer=f"{fmt(theirs, '.2f')} s/GB",
                  ratio=r, target=f"≤{TARGET}×", met=met_le(r, TARGET))
    for ours, floor in (("pipeline", "HTTP/2 copy floor"), ("pipeline TLS", "HTTP/2 copy floor TLS")):
        if floor not in summary:
            continue
        mine, theirs = summary[ours]["process_cpu_s_per_gb"], summary[floor]["process_cpu_s_per_gb"]
        b.row(id="P1c", scenario=f"CPU per GB (processes): {ours} vs the {floor} (the same copy on Arrow "
              f"Flight's transport)", figure=f"{fmt(mine, '.2f')} s/GB", peer=f"{fmt(theirs, '.2f')} s/GB",
              ratio=ratio(mine, theirs), target="(info)", met="—")
    for floor in ("HTTP/2 copy floor", "HTTP/2 copy floor TLS"):
        bare = floor.replace("HTTP/2 ", "")
        if floor in summary and bare in summary:
            mine, theirs = summary[floor]["process_cpu_s_per_gb"], summary[bare]["process_cpu_s_per_gb"]
            b.row(id="P1c", scenario=f"CPU per GB (processes): the {floor} vs the {bare} (what HTTP/2 "
                  f"alone adds)", figure=f"{fmt(mine, '.2f')} s/GB", peer=f"{fmt(theirs, '.2f')} s/GB",
                  ratio=ratio(mine, theirs), target="(info)", met="—")
    for ours, floor in (("pipeline", "copy floor, checksummed"), ("pipeline TLS", "copy floor TLS, checksummed"),
                        ("pipeline", "HTTP/2 copy floor, checksummed"),
                        ("pipeline TLS", "HTTP/2 copy floor TLS, checksummed")):
        if floor not in summary:
            continue
        mine, theirs = summary[ours]["process_cpu_s_per_gb"], summary[floor]["process_cpu_s_per_gb"]
        b.row(id="P1c", scenario=f"CPU per GB (processes): {ours} vs the {floor} (with the pipeline's "
              f"checksums on every byte, made and verified)", figure=f"{fmt(mine, '.2f')} s/GB",
              peer=f"{fmt(theirs, '.2f')} s/GB", ratio=ratio(mine, theirs), target="(info)", met="—")
    for floor in ("copy floor", "copy floor TLS", "HTTP/2 copy floor", "HTTP/2 copy floor TLS"):
        checked = f"{floor}, checksummed"
        if floor in summary and checked in summary:
            mine, theirs = summary[checked]["process_cpu_s_per_gb"], summary[floor]["process_cpu_s_per_gb"]
            b.row(id="P1c", scenario=f"CPU per GB (processes): the {checked} vs the {floor} (what the "
                  f"checksums alone add)", figure=f"{fmt(mine, '.2f')} s/GB", peer=f"{fmt(theirs, '.2f')} s/GB",
                  ratio=ratio(mine, theirs), target="(info)", met="—")
    b.notes.append("P1c CPU s/GB (processes / machine), MB/s: " + "; ".join(
        f"{name} {fmt(s['process_cpu_s_per_gb'], '.2f')} / {fmt(s['machine_cpu_s_per_gb'], '.2f')}, "
        f"{fmt(s['median_bytes_per_s'] / 1e6 if s['median_bytes_per_s'] else None, '.0f')}"
        for name, s in summary.items()))
    if not all(r["verified"] for rs in runs.values() for r in rs):
        b.notes.append("P1c: a destination was NOT identical to its source (see the JSON).")
