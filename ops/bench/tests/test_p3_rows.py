"""Tests of P3's rows that set a p50 (p99) beside a floor's: information, or a goal met or not."""

import unittest

from tfbench.scenarios import p3


class Rows:
    """Stands in for the bench: keeps the rows it is given."""

    def __init__(self):
        self.rows = []

    def row(self, **kw):
        self.rows.append(kw)


class RowBeside(unittest.TestCase):
    def test_without_a_goal_the_row_is_information(self):
        b = Rows()
        p3.row_beside(b, "beside", (2.0, 4.0), (1.0, 2.0), " the floor")
        (row,) = b.rows
        self.assertEqual(row["ratio_text"], "2.00× (2.00×) the floor")
        self.assertEqual((row["target"], row["met"]), ("(info)", "—"))

    def test_a_goal_is_judged_on_each_ratio(self):
        b = Rows()
        p3.row_beside(b, "beside", (2.0, 4.0), (1.0, 2.0), " the floor", goal=(1.5, 3.0))
        (row,) = b.rows
        self.assertEqual(row["target"], "≤1.5× (≤3×)")
        self.assertEqual(row["met"], "no (yes)")

    def test_a_missing_figure_is_unknown_not_met(self):
        b = Rows()
        p3.row_beside(b, "beside", (None, 4.0), (1.0, 2.0), "", goal=(1.5, 3.0))
        self.assertEqual(b.rows[0]["met"], "? (yes)")


if __name__ == "__main__":
    unittest.main()
