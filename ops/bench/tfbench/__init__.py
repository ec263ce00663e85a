"""tailflight benchmark suite: scenarios P1-P7 of the benchmark issue.

Every figure is compared with a ceiling or a peer measured in the same run
on the same machine. Writes results/<date>.md, results/<date>.json, the
plots, and results/latest.md (quick mode: the same names with "-quick").

    bench.py [--quick] [--bin PATH] [--only P1,P3] [--runs N]

Python 3.11 standard library, plus matplotlib for the plots (optional: the
suite still runs and writes its tables without it). ops/bench/run.sh sets
everything up; see ops/bench/README.md.
"""
