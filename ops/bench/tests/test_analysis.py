"""Tests of tfbench.analysis: the suite's calculations, on small inputs whose answers are known."""

import unittest

from tfbench import analysis as a

MS = 1_000_000  # ns


class MedianRatioRate(unittest.TestCase):
    def test_median_skips_missing_values(self):
        self.assertEqual(a.median([3, None, 1, 2]), 2)
        self.assertEqual(a.median([1, 2, 3, 4]), 2.5)

    def test_median_of_nothing_is_none(self):
        self.assertIsNone(a.median([]))
        self.assertIsNone(a.median([None, None]))

    def test_ratio(self):
        self.assertEqual(a.ratio(3, 2), 1.5)
        self.assertIsNone(a.ratio(None, 2))
        self.assertIsNone(a.ratio(3, None))
        self.assertIsNone(a.ratio(3, 0))

    def test_mbps(self):
        self.assertEqual(a.mbps(4_000_000, 2), 2.0)
        self.assertIsNone(a.mbps(1, 0))
        self.assertIsNone(a.mbps(1, -1))
        self.assertIsNone(a.mbps(1, None))


class Percentile(unittest.TestCase):
    def test_nearest_rank(self):
        values = list(range(1, 11))
        self.assertEqual(a.percentile(values, 50), 5)
        self.assertEqual(a.percentile(values, 90), 9)
        self.assertEqual(a.percentile(values, 99), 10)
        self.assertEqual(a.percentile(values, 100), 10)

    def test_bounds(self):
        self.assertEqual(a.percentile([7, 8], 0), 7)
        self.assertEqual(a.percentile([7], 99.9), 7)
        self.assertIsNone(a.percentile([], 50))


class Parsing(unittest.TestCase):
    def test_parse_size(self):
        self.assertEqual(a.parse_size("4MiB"), 4 << 20)
        self.assertEqual(a.parse_size("1.5KiB"), 1536)
        self.assertEqual(a.parse_size("1GiB"), 1 << 30)
        self.assertEqual(a.parse_size("10B"), 10)
        self.assertEqual(a.parse_size("100"), 100)

    def test_parse_set_value(self):
        self.assertEqual(a.parse_set_value("10"), 10)
        self.assertEqual(a.parse_set_value("2.5"), 2.5)
        self.assertEqual(a.parse_set_value("[0, 20]"), [0, 20])
        self.assertIs(a.parse_set_value("true"), True)
        self.assertEqual(a.parse_set_value("4MiB"), "4MiB")
        self.assertEqual(a.parse_set_value("--linger 0ms"), "--linger 0ms")
        self.assertEqual(a.parse_set_value(""), "")
        self.assertEqual(a.parse_set_value("rsync,lsyncd"), "rsync,lsyncd")

    def test_parse_commit_line(self):
        self.assertEqual(a.parse_commit_line("bench\tf.xtc2\t1\t4096\t512\t1000"), ("f.xtc2", 4096, 512, 1000, 0))
        self.assertEqual(a.parse_commit_line("bench\tf.xtc2\t1\t0\t512\t1000\t900"), ("f.xtc2", 0, 512, 1000, 900))
        self.assertIsNone(a.parse_commit_line("not a record"))
        self.assertIsNone(a.parse_commit_line(""))

    def test_parse_write_log(self):
        lines = ["a 0 4096 100\n", "b 0 4096 150\n", "a 4096 4096 200\n", "garbage\n", "\n"]
        self.assertEqual(a.parse_write_log(lines), {"a": [(0, 4096, 100), (4096, 4096, 200)],
                                                    "b": [(0, 4096, 150)]})

    def test_summarize_commit_rounds(self):
        lines = [
            "DEBUG sink::commit: commit round requests=2 waited_us=100 journal_us=300 journaled=4096 "
            "total_us=1000 cpu_totals_us=[1000000, 3000000, 4000000]\n",
            "DEBUG sink::commit: something else requests=99\n",
            "DEBUG sink::commit: commit round requests=4 waited_us=300 journal_us=500 journaled=0 "
            "total_us=3000 cpu_totals_us=[2000000, 3000000, 5000000]\n",
        ]
        out = a.summarize_commit_rounds(lines)
        self.assertEqual(out["rounds"], 2)
        self.assertEqual(out["requests"], 3)
        self.assertEqual(out["waited_us"], 200)
        self.assertEqual(out["total_us"], 2000)
        self.assertEqual(out["sync_us"], 0)  # absent from the lines: counted as 0
        self.assertEqual(out["journaled_share"], 0.5)
        # the CPU totals are cumulative: the last round's count
        self.assertEqual(out["stage_cpu_s"], {"place": 2.0, "round": 3.0, "journal": 5.0})

    def test_summarize_commit_rounds_without_rounds(self):
        self.assertIsNone(a.summarize_commit_rounds(["INFO sink: listening\n"]))


class CommitSeries(unittest.TestCase):
    def test_bins_by_commit_time(self):
        t0 = 10**18
        records = [("f", 0, 1_000_000, t0 + 100 * MS, 0), ("f", 0, 1_000_000, t0 + 200 * MS, 0),
                   ("f", 0, 500_000, t0 + 600 * MS, 0)]
        series = a.commit_series(records, t0, bin_s=0.25)
        self.assertEqual([x for x, _ in series], [0.25, 0.5, 0.75])
        self.assertAlmostEqual(series[0][1], 8.0)  # 2 MB in 0.25 s
        self.assertEqual(series[1][1], 0.0)
        self.assertAlmostEqual(series[2][1], 2.0)

    def test_no_records(self):
        self.assertEqual(a.commit_series([], 0), [])


class Bursts(unittest.TestCase):
    def test_split_bursts_on_gaps_over_2ms(self):
        items = [(0,), (1 * MS,), (3 * MS,), (6 * MS,)]
        self.assertEqual(a.split_bursts(items), [[(0,), (1 * MS,), (3 * MS,)], [(6 * MS,)]])
        self.assertEqual(a.split_bursts([]), [])

    def test_burst_widths(self):
        writes = {"a": [(0, 4096, 0), (4096, 4096, 10 * MS)], "b": [(0, 4096, 1 * MS), (4096, 4096, 10 * MS)]}
        out = a.burst_widths(writes)
        self.assertEqual(out["bursts"], 2)
        self.assertEqual(out["size_p50"], 2)
        self.assertEqual(out["width_p90_ms"], 1.0)
        self.assertIsNone(a.burst_widths({}))

    def test_tick_profile(self):
        timed = [(0, 1.0), (1 * MS, 3.0), (10 * MS, 2.0), (11 * MS, 4.0)]
        out = a.tick_profile(timed)
        self.assertEqual(out["ticks"], 2)
        self.assertEqual(out["first_tenth_p50_ms"], 1.0)
        self.assertEqual(out["last_tenth_p50_ms"], 3.0)
        self.assertEqual(out["span_p50_ms"], 4.0)  # first write at 0 ms, last commit at 1 + 3 ms
        self.assertIsNone(a.tick_profile([]))

    def test_latency_windows(self):
        s = 1_000_000_000
        pairs = [(0, 1.0), (s // 2, 3.0), (s, 5.0), (2 * s + 1, 7.0)]
        out = a.latency_windows({}, pairs, window_s=1.0)
        self.assertEqual([w["from_s"] for w in out], [0.0, 1.0, 2.0])
        self.assertEqual([w["n"] for w in out], [2, 1, 1])
        self.assertEqual(out[0]["p50_ms"], 1.0)
        self.assertEqual(out[0]["p99_ms"], 3.0)
        self.assertEqual(a.latency_windows({}, []), [])

    def test_tenths_start_on_their_edges(self):
        tenth = 100_000_000
        pairs = [(k * tenth, float(k)) for k in range(10)]
        out = a.latency_windows({}, pairs, window_s=0.1)
        self.assertEqual([w["n"] for w in out], [1] * 10)
        self.assertEqual([w["from_s"] for w in out][:4], [0.0, 0.1, 0.2, 0.3])


class TailflightLatencies(unittest.TestCase):
    def test_a_write_is_durable_when_its_last_range_commits(self):
        writes = {"f": [(0, 4096, 0), (4096, 4096, 1 * MS)]}
        records = [("f.inprogress", 0, 6000, 2 * MS, 1 * MS), ("f", 6000, 2192, 5 * MS, 4 * MS)]
        timed, way = [], []
        lat, missing = a.tailflight_latencies(writes, records, timed, way)
        self.assertEqual(missing, 0)
        self.assertEqual(lat, [2.0, 4.0])
        self.assertEqual(timed, [(0, 2.0), (1 * MS, 4.0)])
        self.assertEqual(way, [1.0, 3.0])

    def test_the_latest_of_overlapping_commits_counts(self):
        writes = {"f": [(0, 100, 0)]}
        records = [("f", 0, 60, 9 * MS, 0), ("f", 50, 50, 3 * MS, 0)]
        lat, missing = a.tailflight_latencies(writes, records)
        self.assertEqual((lat, missing), ([9.0], 0))

    def test_uncovered_writes_are_missing(self):
        writes = {"f": [(0, 4096, 0), (4096, 4096, 0)], "g": [(0, 1, 0)]}
        records = [("f", 0, 4096, 1 * MS, 0), ("f", 5000, 3192, 2 * MS, 0)]  # a hole at 4096..5000
        lat, missing = a.tailflight_latencies(writes, records)
        self.assertEqual(lat, [1.0])
        self.assertEqual(missing, 2)

    def test_no_way_there_without_received_times(self):
        way = []
        a.tailflight_latencies({"f": [(0, 1, 0)]}, [("f", 0, 1, 1 * MS, 0)], None, way)
        self.assertEqual(way, [])


class ArrivalLatencies(unittest.TestCase):
    def test_first_sweep_that_saw_the_end_of_the_write(self):
        history = {"f": ([10 * MS, 20 * MS, 30 * MS], [100, 4096, 8192])}
        writes = {"f": [(0, 4096, 5 * MS), (4096, 4096, 6 * MS), (8192, 1, 7 * MS)], "g": [(0, 1, 0)]}
        lat, missing = a.arrival_latencies(history, writes)
        self.assertEqual(lat, [15.0, 24.0])
        self.assertEqual(missing, 2)  # f past its last size, g never seen


class Summaries(unittest.TestCase):
    def test_latency_summary(self):
        out = a.latency_summary([4.0, -0.5, 1.0, 2.0, 3.0], missing=2)
        self.assertEqual(out["n"], 5)
        self.assertEqual(out["missing"], 2)
        self.assertEqual(out["nonpositive"], 1)
        self.assertEqual(out["p50_ms"], 2.0)
        self.assertEqual(out["p99_ms"], 4.0)
        self.assertEqual(out["max_ms"], 4.0)
        self.assertAlmostEqual(out["mean_ms"], 1.9)

    def test_latency_summary_of_nothing(self):
        out = a.latency_summary([], 3)
        self.assertEqual((out["n"], out["missing"], out["p50_ms"], out["max_ms"], out["mean_ms"]), (0, 3, None, None, None))

    def test_cdf_points(self):
        self.assertEqual(a.cdf_points([]), [])
        self.assertEqual(a.cdf_points([3.0, 1.0, 2.0]), [(1.0, 1 / 3), (2.0, 2 / 3), (3.0, 1.0)])
        pts = a.cdf_points([float(i) for i in range(10_000)], points=100)
        self.assertEqual(len(pts), 101)
        self.assertEqual(pts[-1], (9999.0, 1.0))
        self.assertEqual(pts, sorted(pts))

    def test_trouble_totals(self):
        runs = [{"log_events": {"sink": {"connection_lost": 2, "too_many_open_files": 0}},
                 "status": {"duplicate_bytes": 10}},
                {"log_events": {"sink": {"connection_lost": 1}, "watcher": {"inotify_overflow": 1}}, "status": None},
                {}]
        totals, dup = a.trouble_totals(runs)
        self.assertEqual(totals, {"sink connection lost": 3, "watcher inotify overflow": 1})
        self.assertEqual(dup, 10)

    def test_worst_resume(self):
        self.assertEqual(a.worst_resume([{"resume_s": 0.2}, {"resume_s": 0.5}]), 0.5)
        self.assertIsNone(a.worst_resume([{"resume_s": 0.2}, {"resume_s": None}]))
        self.assertIsNone(a.worst_resume([]))

    def test_medians_by_rtt(self):
        runs = {"tf4": [{"rtt_ms": 0, "bytes_per_s": 3}, {"rtt_ms": 0, "bytes_per_s": 5},
                        {"rtt_ms": 20, "bytes_per_s": 2}],
                "rsync": [{"rtt_ms": 0, "bytes_per_s": 1}]}
        self.assertEqual(a.medians_by_rtt(runs, [0, 20]), {"tf4": {0: 4, 20: 2}, "rsync": {0: 1, 20: None}})

    def test_busy_cores(self):
        self.assertEqual(a.busy_cores((1000, 600), (2000, 1100), 2), 1.0)
        self.assertIsNone(a.busy_cores((1000, 600), (1000, 600), 2))


class Fio(unittest.TestCase):
    def test_write_rate_over_the_whole_job(self):
        data = {"jobs": [{"job_runtime": 2000, "write": {"io_bytes": 4_000_000, "runtime": 1000}}]}
        self.assertEqual(a.fio_write_bytes_per_s(data), 2_000_000)
        data = {"jobs": [{"write": {"io_bytes": 4_000_000, "runtime": 1000}}]}
        self.assertEqual(a.fio_write_bytes_per_s(data), 4_000_000)

    def test_sync_latency(self):
        pct = {"50.000000": 1_000_000, "99.000000": 2_500_000, "99.900000": 9_000_000}
        data = {"jobs": [{"sync": {"lat_ns": {"percentile": pct}}}]}
        self.assertEqual(a.fio_sync_latency_ms(data), {"p50_ms": 1.0, "p99_ms": 2.5, "p999_ms": 9.0})



class KafkaLatencies(unittest.TestCase):
    RC = "org.tailflight.range.committed.v1"

    def test_parse_event_log(self):
        lines = [f"5000000\t4\t{self.RC}\n", "garbage\n", "1\t2\n", "x\t2\ty\n",
                 "7000000\t5\torg.tailflight.file.opened.v1\n"]
        self.assertEqual(a.parse_event_log(lines), [(5_000_000, 4, self.RC),
                                                    (7_000_000, 5, "org.tailflight.file.opened.v1")])

    def test_event_latencies_of_one_type_since_a_time(self):
        records = [(12 * MS + 500_000, 10, self.RC), (13 * MS, 10, "org.tailflight.file.opened.v1"),
                   (9 * MS, 8, self.RC), (20 * MS, 11, self.RC)]
        self.assertEqual(a.event_latencies(records), [2.5, 1.0, 9.0])
        self.assertEqual(a.event_latencies(records, since_ms=10), [2.5, 9.0])
        self.assertEqual(a.event_latencies(records, "org.tailflight.file.opened.v1"), [3.0])
        self.assertEqual(a.event_latencies([]), [])

    def test_event_counts(self):
        records = [(0, 10, self.RC), (0, 12, self.RC), (0, 9, "x"), (0, 11, "x")]
        self.assertEqual(a.event_counts(records), {self.RC: 2, "x": 2})
        self.assertEqual(a.event_counts(records, since_ms=10), {self.RC: 2, "x": 1})

    def test_arrival_batches(self):
        records = [(100 * MS, 90, self.RC), (100 * MS, 95, "x"), (100 * MS, 96, self.RC),
                   (130 * MS, 120, self.RC), (190 * MS, 150, self.RC), (190 * MS, 151, self.RC),
                   (50 * MS, 10, self.RC)]  # committed before since_ms: left out
        out = a.arrival_batches(records, since_ms=90)
        self.assertEqual(out, {"batches": 3, "events_p50": 2, "events_max": 3,
                               "gap_p50_ms": 30.0, "gap_p90_ms": 60.0, "gap_max_ms": 60.0})
        one = a.arrival_batches([(1, 5, self.RC)])
        self.assertEqual((one["batches"], one["gap_p50_ms"], one["gap_max_ms"]), (1, None, None))
        self.assertIsNone(a.arrival_batches(records, since_ms=1000))

    def test_parse_floor_log(self):
        lines = ["1000\t3000000\t0\n", "bad line\n", "1\t2\n", "-1\t2\t3\n", "2000 4000000 1\n",
                 "3000\t5000000\t2\t4\n"]
        self.assertEqual(a.parse_floor_log(lines),
                         [(1000, 3_000_000, 0, 1), (2000, 4_000_000, 1, 1), (3000, 5_000_000, 2, 4)])

    def test_floor_latencies_by_timestamp_and_exact(self):
        # sent 10.4 ms (timestamp 10 ms), arrived 12 ms: 2.0 ms by timestamp, 1.6 ms exact
        records = [(10 * MS + 400_000, 12 * MS, 10, 1), (20 * MS, 21 * MS, 20, 1), (30 * MS, 33 * MS, 30, 4)]
        by_ts, exact = a.floor_latencies(records)
        self.assertEqual(by_ts, [2.0, 1.0, 3.0])
        self.assertEqual(exact, [1.6, 1.0, 3.0])
        # only the messages sent inside the window
        self.assertEqual(a.floor_latencies(records, 15 * MS, 30 * MS), ([1.0, 3.0], [1.0, 3.0]))
        self.assertEqual(a.floor_latencies(records, None, 20 * MS)[0], [2.0, 1.0])
        self.assertEqual(a.floor_latencies([]), ([], []))
        # alone in their transaction, or spread over the partitions
        self.assertEqual(a.floor_latencies(records, spread=False)[0], [2.0, 1.0])
        self.assertEqual(a.floor_latencies(records, spread=True)[0], [3.0])

if __name__ == "__main__":
    unittest.main()
