"""PartialFL paper benchmark (paper 003: Fig. 2 / Fig. 4, Tables 2 and 3) on two small settings
with a shareable and a private modality: the grid ``grid.toml`` (groups, methods, seeds) and its
tables ``tables.toml`` (post-run step: ``hooks.py``), run by the benchmark toolkit (``mmfl bench``, docs/benchmarks.md).

    .venv/bin/python benchmarks/partialfl/run.py               # everything -> benchmarks/results/partialfl.md
    .venv/bin/python benchmarks/partialfl/run.py --quick       # a few-minute smoke version (partialfl-quick.md)
    .venv/bin/python benchmarks/partialfl/run.py --tables-only # rebuild the report from finished runs

Other options: ``--workers N``, ``--seeds ...`` (run only these), ``--group fig|t2|t3_digits|t3_emoji|dir``,
``--raw-dir DIR`` (runs and report in DIR: a test location).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # this checkout's mmfl
from mmfl.bench import bench_main  # noqa: E402

if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    grid = HERE / ("grid-quick.toml" if quick else "grid.toml")
    sys.exit(bench_main(grid, [a for a in sys.argv[1:] if a != "--quick"]))
