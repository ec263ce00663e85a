"""Tests of tfbench.formatting: how figures are written in the console lines and the report."""

import unittest

from tfbench import formatting as f


class Formatting(unittest.TestCase):
    def test_missing_values_are_question_marks(self):
        self.assertEqual(f.fmt(None, ".2f"), "?")
        self.assertEqual(f.fmt_mb(None), "?")
        self.assertEqual(f.fmt_ms(None), "?")
        self.assertEqual(f.met(None, 1), "?")
        self.assertEqual(f.met_le(None, 1), "?")

    def test_numbers(self):
        self.assertEqual(f.fmt(1.234, ".2f"), "1.23")
        self.assertEqual(f.fmt_mb(1_234_567_890), "1235 MB/s")

    def test_fmt_ms_scales_with_the_value(self):
        self.assertEqual(f.fmt_ms(1.234), "1.23 ms")
        self.assertEqual(f.fmt_ms(150.4), "150 ms")
        self.assertEqual(f.fmt_ms(12_345), "12.3 s")

    def test_met(self):
        self.assertEqual(f.met(0.9, 0.9), "yes")
        self.assertEqual(f.met(0.89, 0.9), "no")
        self.assertEqual(f.met_le(2.0, 2.0), "yes")
        self.assertEqual(f.met_le(2.1, 2.0), "no")

    def test_strip_ansi(self):
        self.assertEqual(f.strip_ansi("\x1b[31mred\x1b[0m plain"), "red plain")

    def test_cpu_line(self):
        m = {"watcher_cpu_s_per_gb": 1.234, "watcher_rss_mib": 20.4, "sink_cpu_s_per_gb": None,
             "sink_rss_mib": 30, "status": {"duplicate_bytes": 2 << 20},
             "log_events": {"sink": {"connection_lost": 1, "inotify_overflow": 0}}}
        self.assertEqual(f.cpu_line(m), "watcher 1.23 CPU s/GB, RSS 20 MiB; sink ? CPU s/GB, RSS 30 MiB; "
                                        "sink saw 2 MiB duplicate (re-sent) bytes; log: sink: connection lost ×1")


if __name__ == "__main__":
    unittest.main()
