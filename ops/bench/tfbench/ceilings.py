"""The ceilings every figure is compared with, measured in the same run: loopback TCP (iperf3),
the disk (fio sequential writes + fdatasync, O_DIRECT, 4 KiB write + fdatasync latency), how fast
the machine fills new memory, the TLS cipher on one core, and the link of P4's namespace."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

from .analysis import fio_sync_latency_ms, fio_write_bytes_per_s, median
from .config import MiB
from .harness import Bench, BenchError, NetNs, Proc, free_port, say, wait_log


def iperf_loopback(b: Bench, d: Path, streams: int) -> float:
    port = free_port()
    server = Proc(f"iperf3-s-{streams}", ["iperf3", "-s", "-1", "--forceflush", "-B", "127.0.0.1", "-p", port], d)
    try:
        wait_log(server, "listening", 10)
        cp = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-P", str(streams),
                             "-t", str(b.p["iperf_seconds"]), "-J"],
                            capture_output=True, text=True, timeout=b.p["iperf_seconds"] + 30)
        data = json.loads(cp.stdout)
        if "error" in data:
            raise BenchError(f"iperf3: {data['error']}")
        return data["end"]["sum_received"]["bits_per_second"] / 8
    finally:
        server.stop(5)


def disk_ceiling(b: Bench, d: Path) -> dict:
    """Sequential write with fdatasync on the sink root's filesystem."""
    target = d / "fio.tmp"
    size = b.p["fio_mib"]
    try:
        if shutil.which("fio"):
            cp = subprocess.run(["fio", "--name=seq", f"--filename={target}", "--rw=write", "--bs=4M",
                                 f"--size={size}M", "--end_fsync=1", "--fdatasync=8",
                                 "--output-format=json"],
                                capture_output=True, text=True, timeout=600)
            data = json.loads(cp.stdout[cp.stdout.find("{"):])
            return {"tool": "fio", "bytes_per_s": fio_write_bytes_per_s(data),
                    "fio_bw_bytes": data["jobs"][0]["write"]["bw_bytes"], "mib": size}
        count = size // 4
        t0 = time.monotonic()
        subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=4M", f"count={count}",
                        "conv=fdatasync"], check=True, capture_output=True, timeout=600)
        return {"tool": "dd", "bytes_per_s": count * 4 * MiB / (time.monotonic() - t0), "mib": size}
    finally:
        target.unlink(missing_ok=True)


def direct_disk_ceiling(b: Bench, d: Path) -> float | None:
    """The device without the page cache: fio 4 MiB O_DIRECT writes, then an fsync, on the sink root's
    filesystem: what the disk itself takes when no new memory has to be filled on the way (the sink
    writes the aligned middle of large ranges this way on ext4, XFS and btrfs, see sink_writes_direct)."""
    if not shutil.which("fio"):
        return None
    target = d / "fio-direct.tmp"
    try:
        cp = subprocess.run(["fio", "--name=direct", f"--filename={target}", "--rw=write", "--bs=4M",
                             f"--size={b.p['fio_mib']}M", "--direct=1", "--end_fsync=1",
                             "--output-format=json"], capture_output=True, text=True, timeout=600)
        data = json.loads(cp.stdout[cp.stdout.find("{"):])
        return fio_write_bytes_per_s(data)
    except (KeyError, ValueError, ZeroDivisionError, TypeError, subprocess.TimeoutExpired):
        return None
    finally:
        target.unlink(missing_ok=True)


def memory_fill_ceiling(b: Bench) -> dict:
    """How fast this machine hands out memory it has not touched lately, and how fast it rewrites memory
    it has: dd of P1's volume into a new tmpfs file, then over the same pages again. On a VM whose host
    backs guest memory lazily (or takes freed pages back, e.g. virtio-balloon free page reporting), the
    first figure is far below memcpy speed, and every new page-cache page pays it: the simulator's
    tmpfs source, the sink's destination files and fio's alike."""
    target = b.shm / "fill.tmp"
    count = b.p["p1_total_mib"]
    out = {"mib": count, "free_page_reporting": free_page_reporting()}
    try:
        for label, extra in (("first_touch", []), ("rewrite", ["conv=notrunc"])):
            t0 = time.monotonic()
            subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={count}", *extra],
                           check=True, capture_output=True, timeout=600)
            out[f"{label}_bytes_per_s"] = count * MiB / (time.monotonic() - t0)
    except (OSError, subprocess.SubprocessError) as e:
        # A tmpfs too small for P1's volume, say: the other ceilings still count.
        out["error"] = str(e)[-300:]
    finally:
        target.unlink(missing_ok=True)
    return out


def free_page_reporting() -> bool | None:
    """Whether a virtio balloon hands the guest's free pages back to the host (feature bit 5)."""
    found = None
    for dev in Path("/sys/bus/virtio/devices").glob("*"):
        try:
            if (dev / "device").read_text().strip() == "0x0005":
                features = (dev / "features").read_text().strip()
                found = bool(found) or (len(features) > 5 and features[5] == "1")
        except OSError:
            continue
    return found


def cipher_ceiling(b: Bench) -> dict | None:
    """AES-128-GCM (the suite mutual TLS negotiates) on one core, from aws-lc, the library rustls uses:
    flight-server's cipher-speed example seals and opens 16 KiB records (TLS's largest) in place. What
    encrypting at the watcher and decrypting at the sink cost at the least, whatever the TLS stack
    around them does."""
    tool = Path(b.bin).parent / "examples" / "cipher-speed"
    if not tool.exists():
        return None
    try:
        cp = subprocess.run([str(tool), "0.4" if b.quick else "2"], capture_output=True, text=True, timeout=60)
        return json.loads(cp.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def fdatasync_latency(b: Bench, d: Path) -> dict | None:
    """Floor for P3: fio 4 KiB appends, each followed by fdatasync, on the sink root's filesystem."""
    if not shutil.which("fio"):
        return None
    target = d / "lat.tmp"
    try:
        cp = subprocess.run(["fio", "--name=lat", f"--filename={target}", "--rw=write", "--bs=4k",
                             "--size=16M" if b.quick else "--size=64M", "--fdatasync=1",
                             "--output-format=json"], capture_output=True, text=True, timeout=600)
        data = json.loads(cp.stdout[cp.stdout.find("{"):])
        return fio_sync_latency_ms(data)
    except (KeyError, ValueError, subprocess.TimeoutExpired):
        return None
    finally:
        target.unlink(missing_ok=True)


def fs_type(path: Path) -> str:
    try:
        cp = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
        best, fstype = "", cp.stdout.strip()
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, typ = line.split()[:3]
                if str(path).startswith(mnt) and len(mnt) > len(best):
                    best, fstype = mnt, f"{typ} ({dev} on {mnt})"
        return fstype
    except OSError:
        return "?"


def iperf_ns(b: Bench, d: Path, ns: NetNs, streams: int) -> float:
    port = free_port()
    server = Proc(f"iperf3-ns-{streams}", ["iperf3", "-s", "-1", "--forceflush", "-B", ns.ns_ip, "-p", port], d,
                  netns=ns.name)
    try:
        wait_log(server, "listening", 10)
        cp = subprocess.run(["iperf3", "-c", ns.ns_ip, "-p", str(port), "-P", str(streams), "-t", "2", "-J"],
                            capture_output=True, text=True, timeout=40)
        data = json.loads(cp.stdout)
        if "error" in data:
            raise BenchError(f"iperf3: {data['error']}")
        return data["end"]["sum_received"]["bits_per_second"] / 8
    finally:
        server.stop(5)


def scenario_ceilings(b: Bench):
    d = b.fresh("ceilings")
    runs = b.p["ceiling_runs"]
    tcp4, tcp1, disk, fill, direct = [], [], [], [], []
    for _ in range(runs):
        tcp4.append(iperf_loopback(b, d, 4))
        tcp1.append(iperf_loopback(b, d, 1))
        disk.append(disk_ceiling(b, d)["bytes_per_s"])
        fill.append(memory_fill_ceiling(b))
        direct.append(direct_disk_ceiling(b, d))
    res = {"tcp4_bytes_per_s": tcp4, "tcp1_bytes_per_s": tcp1, "disk_bytes_per_s": disk,
           "tcp4": median(tcp4), "tcp1": median(tcp1), "disk": median(disk), "memory_fill_runs": fill,
           "memory_first_touch": median([f.get("first_touch_bytes_per_s") for f in fill]),
           "memory_rewrite": median([f.get("rewrite_bytes_per_s") for f in fill]),
           "disk_direct_runs": direct, "disk_direct": median([x for x in direct if x]),
           "disk_tool": "fio" if shutil.which("fio") else "dd",
           "disk_fs": fs_type(b.work), "fdatasync": fdatasync_latency(b, d),
           "cipher": cipher_ceiling(b)}
    b.results["scenarios"]["ceilings"] = res
    fl = res["fdatasync"]
    say(f"[ceilings] loopback TCP iperf3 -P 4: {res['tcp4'] / 1e6:.0f} MB/s "
        f"({res['tcp4'] * 8 / 1e9:.1f} Gbit/s), -P 1: {res['tcp1'] / 1e6:.0f} MB/s; "
        f"disk {res['disk_tool']} 4 MiB writes + fdatasync every 32 MiB on {res['disk_fs']}: "
        f"{res['disk'] / 1e6:.0f} MB/s"
        + (f"; 4 KiB write + fdatasync: p50 {fl['p50_ms']:.3f} ms, p99 {fl['p99_ms']:.3f} ms" if fl else "")
        + (f"; memory (dd of {b.p['p1_total_mib']} MiB into tmpfs): new pages {res['memory_first_touch'] / 1e6:.0f} "
           f"MB/s, the same pages again {res['memory_rewrite'] / 1e6:.0f} MB/s"
           if res["memory_first_touch"] and res["memory_rewrite"] else "")
        + (f"; disk with O_DIRECT (fio, no page cache): {res['disk_direct'] / 1e6:.0f} MB/s"
           if res["disk_direct"] else "")
        + (f"; AES-128-GCM on one core (aws-lc, 16 KiB records): seal {res['cipher']['seal_bytes_per_s'] / 1e6:.0f} "
           f"MB/s, open {res['cipher']['open_bytes_per_s'] / 1e6:.0f} MB/s" if res["cipher"] else ""))
