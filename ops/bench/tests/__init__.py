"""Unit tests of the benchmark suite's pure functions, standard library only. From the repository root:

    python3 -m unittest discover -s ops/bench/tests -t ops/bench
"""

import sys
from pathlib import Path

# ops/bench, where the tfbench package is, whatever top-level folder unittest was given.
_BENCH = str(Path(__file__).resolve().parents[1])
if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
