#!/usr/bin/env python3
"""tailflight benchmark suite: the entry point that ops/bench/run.sh runs.

The suite itself is the tfbench package next to this file (see tfbench/__init__.py
and ops/bench/README.md); this file only puts ops/bench on the import path, so that
it runs as a script from anywhere, and hands over to tfbench.main.

    bench.py [--quick] [--bin PATH] [--only P1,P3] [--runs N]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tfbench.main import main  # noqa: E402  (needs the path above)

if __name__ == "__main__":
    sys.exit(main())
