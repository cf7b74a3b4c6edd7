"""The benchmarks' timing library lives in mmfl/bench/timing.py; this name stays for the scripts here."""
from mmfl.bench.timing import (Clock, Comparison, Sample, cpu_clock, fmt_range, fmt_spread, interleave,  # noqa: F401
                               measure, spread)
