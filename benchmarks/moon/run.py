"""MOON paper benchmark on Fashion-MNIST: the grid ``grid.toml`` (groups, methods, seeds) and
its tables ``tables.py``, run by the benchmark toolkit (``mmfl bench``, docs/benchmarks.md).

    .venv/bin/python benchmarks/moon/run.py                # everything -> benchmarks/results/moon.md
    .venv/bin/python benchmarks/moon/run.py --quick        # a few-minute smoke version (moon-quick.md)
    .venv/bin/python benchmarks/moon/run.py --profile paper --device cuda   # grid-paper.toml; prints its wall time
    .venv/bin/python benchmarks/moon/run.py --profile paper --plan          # list its runs, run nothing
    .venv/bin/python benchmarks/moon/run.py --tables-only  # rebuild the report from finished runs

Other options (benchmarks/profiles.py): ``--device``, ``--batch-clients true|false``,
``--plan [--estimate]``; those of ``mmfl bench``: ``--workers N``, ``--seeds ...`` (run only these), ``--group t1|sc|lin``.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from profiles import main  # noqa: E402  (--profile full|quick|paper, --device, --batch-clients, --plan)

if __name__ == "__main__":
    sys.exit(main(HERE))
