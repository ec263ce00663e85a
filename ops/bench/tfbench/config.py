"""Constants of the suite: paths, units, the sizes of each mode and the targets of the benchmark issue."""

from __future__ import annotations

from pathlib import Path

# ops/bench, the folder of bench.py, results/ and work/.
HERE = Path(__file__).resolve().parents[1]
REPO = HERE.parents[1]
# The suite's entry point; P5's writer and P6's creator run it again as hidden subcommands.
ENTRY = HERE / "bench.py"

MiB = 1 << 20
GB = 1e9
INPROGRESS = ".inprogress"
SOURCE = "bench"  # --source of every watcher: files land in <root>/bench/
NO_JOURNAL_LABEL = "tailflight, sink --journal-max-range 0"


# Sizes per mode. Full mode follows the issue; quick mode only keeps the
# suite from rotting (< 5 minutes on 2 cores).
MODES = {
    "quick": dict(
        runs=1, peer_runs=1, ceiling_runs=1,
        iperf_seconds=2, fio_mib=256,
        p1_total_mib=256, p1_streams=16, p1_chunk="64MiB", p1c_total_mib=256,
        p3_streams=20, p3_rate=100.0, p3_seconds=5, p3_peer_drain=40, p3_peers="rsync,lsyncd,lsyncd0",
        p3_linger0=1, p3_journal=0, p3_watch="", p3_sink="", p3_writer_threads=0, p3_two_writers=1,
        p3_rotate_chunk="1MiB", p3_rotate_src_disk=0, p3_logs_tmpfs=1, p3_settle=5, p3_floor=1, p3_floor_place=1,
        p3_floor_h2=1, p3_floor_flight=1,
        p4_rtts=[0, 20, 60, 120], p4_total_mib=64, p4_runs=1, p4_rate="2gbit",
        p5_files=1000, p5_seconds=5, p5_append=4096,
        p6_files=2000, p6_size=65536, p6_sink="", p6_settle_s=0, p6_peers=1,
        p7_seconds=8, p7_rate=10.0, p7_kills=3,
        p8_total_mib=128, p10_total_mib=128,
        p12_seconds=5, p12_floor_seconds=2, p12_total_mib=256, p12_broker_tmpfs=0,
        p13_kills=2, p13c_handovers=3,
    ),
    "full": dict(
        runs=3, peer_runs=3, ceiling_runs=3,
        iperf_seconds=5, fio_mib=2048,
        p1_total_mib=4096, p1_streams=16, p1_chunk="64MiB", p1c_total_mib=2048,
        p3_streams=100, p3_rate=100.0, p3_seconds=60, p3_peer_drain=120, p3_peers="rsync,lsyncd,lsyncd0",
        p3_linger0=1, p3_journal=1, p3_watch="", p3_sink="", p3_writer_threads=0, p3_two_writers=1,
        p3_rotate_chunk="4MiB", p3_rotate_src_disk=1, p3_logs_tmpfs=1, p3_settle=90, p3_floor=1, p3_floor_place=1,
        p3_floor_h2=1, p3_floor_flight=1,
        p4_rtts=[0, 20, 60, 120], p4_total_mib=1024, p4_runs=3, p4_rate="2gbit",
        p5_files=10000, p5_seconds=60, p5_append=4096,
        p6_files=100000, p6_size=65536, p6_sink="", p6_settle_s=40, p6_peers=1,
        p7_seconds=20, p7_rate=10.0, p7_kills=3,
        p8_total_mib=2048, p10_total_mib=2048,
        p12_seconds=30, p12_floor_seconds=10, p12_total_mib=2048, p12_broker_tmpfs=0,
        p13_kills=10, p13c_handovers=10,
    ),
}


TARGETS = {
    "P1_tcp": 0.7, "P1_disk": 0.9, "P2": 0.9,
    "P3_p50_ms": 2.0, "P3_p99_ms": 10.0, "P3_peer_factor": 100.0,
    # Issue 43's goals: P3's p50 and p99 at most these many times its floor's.
    "P3_p50_floor_factor": 1.5, "P3_p99_floor_factor": 3.0,
    "P4": 0.9, "P5_rss_mib": 256.0, "P6_factor": 10.0, "P7_resume_s": 1.0,
}
