"""The suite's own writers, run as hidden subcommands of bench.py in a separate process:
P5's many slowly growing files and P6's many new files. Standard library only."""

from __future__ import annotations

import argparse
import json
import os
import resource
import struct
import time


def p5_writer(argv):
    """Hidden subcommand: one process appending round-robin to many files, once per file per second."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--seconds", type=int, required=True)
    ap.add_argument("--size", type=int, default=4096)
    a = ap.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, a.files + 256)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    per_dir = 1000
    fds = []
    for i in range(a.files):
        sub = os.path.join(a.dir, f"d{i // per_dir:03d}")
        if i % per_dir == 0:
            os.makedirs(sub, exist_ok=True)
        fds.append(os.open(os.path.join(sub, f"f{i:06d}.dat"),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    base = bytearray(os.urandom(a.size))
    print(json.dumps({"created": a.files}), flush=True)
    time.sleep(2)
    slots = 100
    print(json.dumps({"appending": time.time_ns()}), flush=True)
    t0 = time.monotonic()
    written = 0
    max_lag = 0.0
    for second in range(a.seconds):
        for slot in range(slots):
            lo, hi = a.files * slot // slots, a.files * (slot + 1) // slots
            for i in range(lo, hi):
                struct.pack_into("<QQ", base, 0, i, second)
                written += os.write(fds[i], base)
            due = t0 + second + (slot + 1) / slots
            lag = time.monotonic() - due
            if lag < 0:
                time.sleep(-lag)
            else:
                max_lag = max(max_lag, lag)
    for fd in fds:
        os.close(fd)
    print(json.dumps({"done": time.time_ns(), "bytes": written, "max_lag_s": max_lag,
                      "seconds": time.monotonic() - t0}), flush=True)


def creator(argv):
    """Hidden subcommand: creates N files of SIZE bytes as fast as possible, 1000 per new subfolder."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    a = ap.parse_args(argv)
    buf = bytearray(os.urandom(a.size))
    t0 = time.time_ns()
    for i in range(a.files):
        sub = os.path.join(a.dir, f"d{i // 1000:03d}")
        if i % 1000 == 0:
            os.mkdir(sub)
        struct.pack_into("<Q", buf, 0, i)
        fd = os.open(os.path.join(sub, f"f{i:06d}.dat"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, buf)
        os.close(fd)
    print(json.dumps({"start": t0, "end": time.time_ns(), "files": a.files}), flush=True)
