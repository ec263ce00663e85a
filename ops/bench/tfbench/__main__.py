"""`python -m tfbench` from ops/bench: the same as bench.py."""

import sys

from .main import main

sys.exit(main())
