"""The scenarios of the benchmark issue, one module each (P1 and P2 share one, as they run
interleaved), and the order the suite runs them in. Each scenario_* function takes the Bench,
stores its figures in b.results["scenarios"] and adds its rows and notes."""

from __future__ import annotations

from ..ceilings import scenario_ceilings
from .p1_p2 import scenario_p1_p2
from .p1c import scenario_p1c
from .p3 import scenario_p3
from .p4 import scenario_p4
from .p5 import scenario_p5
from .p6 import scenario_p6
from .p7 import scenario_p7
from .p8 import scenario_p8
from .p9 import scenario_p9
from .p10 import scenario_p10
from .p11 import scenario_p11
from .p12 import scenario_p12
from .p13 import scenario_p13, scenario_p13c
from .p14 import scenario_p14

SCENARIOS = [("ceilings", scenario_ceilings), ("P1", scenario_p1_p2), ("P1c", scenario_p1c), ("P3", scenario_p3),
             ("P6", scenario_p6), ("P7", scenario_p7), ("P4", scenario_p4), ("P5", scenario_p5), ("P8", scenario_p8), ("P9", scenario_p9), ("P10", scenario_p10), ("P11", scenario_p11),
             ("P12", scenario_p12), ("P13", scenario_p13), ("P13c", scenario_p13c),
             ("P14", scenario_p14)]
