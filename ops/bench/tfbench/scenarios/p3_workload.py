"""P3's workload, the same for tailflight, the floor and the peers: the simulator's arguments."""

from __future__ import annotations

from ..harness import Bench


def p3_sim_args(b: Bench, threads=None, chunk="1GiB", seconds=None):
    """The P3 workload; `threads` writer threads (0: one per file), by default the mode's;
    each file rotates to a new chunk every `chunk` bytes (by default never, in the run);
    for `seconds`, by default P3's."""
    threads = int(b.p["p3_writer_threads"] if threads is None else threads)
    seconds = b.p["p3_seconds"] if seconds is None else seconds
    return ["--streams", b.p["p3_streams"], "--rate", b.p["p3_rate"], "--frame", "4KiB",
            "--chunk", chunk, "--duration", f"{seconds}s",
            *(["--writer-threads", threads] if threads > 0 else [])]
