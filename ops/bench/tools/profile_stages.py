#!/usr/bin/env python3
"""Shares of a `perf record -a -g` profile of the pipeline (ops/bench/profile.sh) by process and stage.

Reads `perf script` output: each sample's process, thread and call stack. The watcher is the process
with a thread named `tailer`; the sink is the other process with tokio workers. A sample goes to the
first stage (in the order below) that its leaf symbol or any frame of its stack names.

    python3 ops/bench/tools/profile_stages.py perf-plain.data [more.data ...]
"""
import re
import subprocess
import sys
from collections import Counter, defaultdict

# (stage, where it is seen: "leaf" or "stack", pattern), first match wins.
STAGES = [
    ("TLS records (AES-GCM, rustls)", "stack", re.compile(r"aws_lc|aes_gcm|aes_hw|gcm_|rustls")),
    ("fresh pages zeroed (page faults)", "leaf", re.compile(r"clear_page|folio_zero_user")),
    ("source read (tmpfs to buffer)", "stack", re.compile(r"shmem_file_read_iter|filemap_read")),
    ("socket send (copy, TCP)", "stack", re.compile(r"tcp_sendmsg")),
    ("socket receive (copy, TCP)", "stack", re.compile(r"tcp_recvmsg|sock_recvmsg")),
    ("checksums (CRC32C, CRC64)", "leaf", re.compile(r"crc_fast|crc32|crc64")),
    ("user-space copies (memcpy)", "leaf", re.compile(r"memmove|memcpy")),
    ("file writes, flushes (ext4, block)", "stack", re.compile(
        r"ext4_|iomap_|blk_|submit_bio|do_fsync|__x64_sys_pwrite|__x64_sys_fdatasync|__x64_sys_syncfs|vfs_write")),
    ("TCP/IP stack (softirq)", "stack", re.compile(r"net_rx_action|tcp_v4_rcv|ip_rcv|__tcp_transmit_skb")),
    ("scheduling, wakeups, polling", "stack", re.compile(
        r"schedule|futex|epoll|finish_task_switch|try_to_wake_up|park")),
    ("allocator (mimalloc)", "leaf", re.compile(r"^_?mi_|mi_malloc|mi_free|__rust_(alloc|dealloc|realloc)")),
]


def samples(path):
    """(pid, thread name, [symbols leaf first]) per sample."""
    out = subprocess.run(["perf", "script", "-i", path, "-F", "comm,pid,tid,ip,sym"],
                         capture_output=True, text=True, check=True).stdout
    head, stack = None, []
    for line in out.splitlines() + [""]:
        if not line.strip():
            if head:
                yield head[0], head[1], stack
            head, stack = None, []
        elif line.startswith(("\t", " ")) and head and re.match(r"^\s+[0-9a-f]+ ", line):
            parts = line.split(None, 1)
            stack.append(parts[1] if len(parts) > 1 else "?")
        else:
            m = re.match(r"^(.*?)\s+(\d+)/(\d+)\s*$", line.strip())
            if m:
                head = (int(m.group(2)), m.group(1).strip())


def stage_of(stack, kernel_leaf):
    leaf = stack[0] if stack else "?"
    for name, where, pattern in STAGES:
        if where == "leaf" and pattern.search(leaf):
            return name
        if where == "stack" and any(pattern.search(f) for f in stack):
            return name
    return "other kernel" if kernel_leaf else "other user space (tailflight's own code)"


def main(paths):
    for path in paths:
        per_pid = defaultdict(Counter)
        threads = defaultdict(set)
        total = 0
        for pid, comm, stack in samples(path):
            total += 1
            threads[pid].add(comm)
            per_pid[pid][stage_of(stack, kernel_leaf=_is_kernel(stack))] += 1
        watcher = next((p for p, t in threads.items() if "tailer" in t), None)
        sinks = [p for p, t in threads.items() if p != watcher and "tokio-rt-worker" in t]
        sink = max(sinks, key=lambda p: sum(per_pid[p].values()), default=None)
        print(f"# {path}: {total} samples")
        for who, pid in (("watcher", watcher), ("sink", sink)):
            if pid is None:
                continue
            counts = per_pid[pid]
            n = sum(counts.values())
            print(f"\n{who} (pid {pid}): {n} samples, {100 * n / total:.1f}% of all")
            print("| stage | share of the process |\n|---|---|")
            for name, c in counts.most_common():
                print(f"| {name} | {100 * c / n:.1f}% |")
        rest = total - sum(sum(per_pid[p].values()) for p in (watcher, sink) if p is not None)
        print(f"\nother processes and idle: {100 * rest / total:.1f}% of all samples\n")


KERNEL_SYMBOLS = None


def _is_kernel(stack):
    # perf prints kernel frames with kernel symbol names; user frames of the
    # binary carry Rust paths or libc names. A leaf is kernel when its name
    # appears in /proc/kallsyms.
    global KERNEL_SYMBOLS
    if KERNEL_SYMBOLS is None:
        try:
            with open("/proc/kallsyms") as f:
                KERNEL_SYMBOLS = {line.split()[2] for line in f if len(line.split()) >= 3}
        except OSError:
            KERNEL_SYMBOLS = set()
    return bool(stack) and stack[0].split("+")[0] in KERNEL_SYMBOLS


if __name__ == "__main__":
    main(sys.argv[1:])
