"""FedCMI paper benchmark (Tables 1, 3, 4 and Figures 3, 4) on AV-MNIST and mfeat pair: the
grid ``grid.toml`` (groups, settings, methods, seeds) and its tables ``tables.toml``, run by the
benchmark toolkit (``mmfl bench``, docs/benchmarks.md).

    .venv/bin/python benchmarks/fedcmi/run.py               # everything -> benchmarks/results/fedcmi.md
    .venv/bin/python benchmarks/fedcmi/run.py --quick       # a 2-minute smoke version (fedcmi-quick.md)
    .venv/bin/python benchmarks/fedcmi/run.py --profile paper --device cuda   # grid-paper.toml; prints its wall time
    .venv/bin/python benchmarks/fedcmi/run.py --profile paper --plan          # list its runs, run nothing
    .venv/bin/python benchmarks/fedcmi/run.py --tables-only # rebuild the report from finished runs

Other options (benchmarks/profiles.py): ``--device``, ``--batch-clients true|false``,
``--plan [--estimate]``; those of ``mmfl bench``: ``--workers N``, ``--seeds ...`` (run only these), ``--group t1|t3|t4``.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from profiles import main  # noqa: E402  (--profile full|quick|paper, --device, --batch-clients, --plan)

if __name__ == "__main__":
    sys.exit(main(HERE))
