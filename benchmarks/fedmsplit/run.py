"""FedMSplit's graph benchmark: ``mmfl bench benchmarks/fedmsplit/grid.toml`` (grid.toml: the runs;
tables.toml: the report, benchmarks/results/fedmsplit.md; diagnose.py: the seed-0 diagnostics).

    .venv/bin/python benchmarks/fedmsplit/run.py [--tables-only] [--workers N]
"""

import sys
from pathlib import Path

from mmfl.bench import bench_main

if __name__ == "__main__":
    sys.exit(bench_main(Path(__file__).resolve().with_name("grid.toml")))
