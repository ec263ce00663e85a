"""Tests of tfbench.bounds: what the report says bounds a figure, on small inputs whose answers are known."""

import unittest

from tfbench import bounds


def movers(**costs):
    """P1c's summary with only each mover's CPU per GB (processes)."""
    return {name.replace("_", " "): {"process_cpu_s_per_gb": cost} for name, cost in costs.items()}


class P1cGoal(unittest.TestCase):
    FLOORS = {"copy floor": 0.5, "HTTP/2 copy floor, checksummed": 0.8, "pipeline": 1.0,
              "copy floor TLS": 1.0, "HTTP/2 copy floor TLS, checksummed": 1.2, "pipeline TLS": 1.5}

    def summary(self, **changed):
        costs = dict(self.FLOORS, **changed)
        return {name: {"process_cpu_s_per_gb": cost} for name, cost in costs.items()}

    def test_a_floor_past_the_target_puts_the_goal_out_of_reach_in_that_mode(self):
        text = bounds.p1c_goal_text(self.summary(), 1.3)
        self.assertIn("plaintext: that floor 1.60× the bare copy, the pipeline 1.25× that floor", text)
        self.assertIn("TLS: that floor 1.20× the bare copy, the pipeline 1.25× that floor", text)
        self.assertIn("out of reach in plaintext for any mover", text)
        self.assertNotIn("in plaintext and TLS", text)

    def test_both_modes_out_of_reach(self):
        text = bounds.p1c_goal_text(self.summary(**{"HTTP/2 copy floor TLS, checksummed": 1.4}), 1.3)
        self.assertIn("out of reach in plaintext and TLS", text)

    def test_a_floor_within_the_target_says_so(self):
        text = bounds.p1c_goal_text(self.summary(**{"HTTP/2 copy floor, checksummed": 0.6,
                                                    "HTTP/2 copy floor TLS, checksummed": 1.1}), 1.3)
        self.assertIn("that floor is within the goal's 1.3× of the bare copy here", text)

    def test_nothing_without_the_floors(self):
        self.assertEqual(bounds.p1c_goal_text({}, 1.3), "")
        self.assertEqual(bounds.p1c_goal_text(movers(pipeline=1.0, copy_floor=0.5), 1.3), "")


if __name__ == "__main__":
    unittest.main()


class P3Goal(unittest.TestCase):
    def p3(self, flight_p50):
        return {"p50_ms": 2.4, "floor_medians": {"p50_ms": 1.0}, "flight_floor_medians": {"p50_ms": flight_p50}}

    def test_a_flight_floor_past_the_goal_puts_it_out_of_reach(self):
        text = bounds.p3_goal_text(self.p3(1.6), 1.5)
        self.assertIn("(1.60× the floor), and tailflight's p50 is 1.50× it", text)
        self.assertIn("past the 1.5× goal before it keeps a manifest", text)

    def test_a_flight_floor_within_the_goal_says_so(self):
        text = bounds.p3_goal_text(self.p3(1.2), 1.5)
        self.assertIn("within the 1.5× goal of the floor", text)
        self.assertNotIn("out of reach", text)

    def test_nothing_without_the_floors(self):
        self.assertEqual(bounds.p3_goal_text({"p50_ms": 2.4}, 1.5), "")
        self.assertEqual(bounds.p3_goal_text({"floor_medians": {"p50_ms": 1.0}}, 1.5), "")
