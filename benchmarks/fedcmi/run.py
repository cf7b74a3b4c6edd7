"""FedCMI paper benchmark (Tables 1, 3, 4 and Figures 3, 4) on AV-MNIST and mfeat pair: the
grid ``grid.toml`` (groups, settings, methods, seeds) and its tables ``tables.py``, run by the
benchmark toolkit (``mmfl bench``, docs/benchmarks.md).

    .venv/bin/python benchmarks/fedcmi/run.py               # everything -> benchmarks/results/fedcmi.md
    .venv/bin/python benchmarks/fedcmi/run.py --quick       # a 2-minute smoke version (fedcmi-quick.md)
    .venv/bin/python benchmarks/fedcmi/run.py --tables-only # rebuild the report from finished runs

Other options: ``--workers N``, ``--seeds ...`` (run only these), ``--group t1|t3|t4``.
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
