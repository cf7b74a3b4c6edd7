"""CreamFL paper benchmark (Tables 1, 2 and 3, Figure 4) on two small image-pair settings: the
grid ``grid.toml`` (groups, methods, seeds) and its table spec ``tables.toml`` (and Table 2's VQA step),
run by the benchmark toolkit (``mmfl bench``, docs/benchmarks.md).

    .venv/bin/python benchmarks/creamfl/run.py               # everything -> benchmarks/results/creamfl.md
    .venv/bin/python benchmarks/creamfl/run.py --quick       # a few-minute smoke version (creamfl-quick.md)
    .venv/bin/python benchmarks/creamfl/run.py --tables-only # rebuild the report from finished runs
    .venv/bin/python benchmarks/creamfl/run.py --profile paper --device cuda  # grid-paper.toml (its wall time)
    .venv/bin/python benchmarks/creamfl/run.py --profile paper --plan         # list its runs, run nothing

Other options (those of ``mmfl bench``): ``--workers N``, ``--seeds ...`` (run only these),
``--group t1|t2|t3|fig4``, ``--raw-dir DIR`` (runs and report there); and ``--fig4-seeds ...``
(Figure 4's seeds, default 0 1: ``--grid-set groups.fig4.seeds=[...]``).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from profiles import main  # noqa: E402  (--profile full|quick|paper, --device, --batch-clients, --plan)


def toolkit_args(argv: list[str]) -> list[str]:
    """This script's command line with ``--fig4-seeds ...`` as the ``--grid-set`` it stands for."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--fig4-seeds":
            seeds = []
            while i + 1 < len(argv) and argv[i + 1].lstrip("-").isdigit():
                i += 1
                seeds.append(int(argv[i]))
            out += ["--grid-set", f"groups.fig4.seeds={seeds}"]
        else:
            out.append(argv[i])
        i += 1
    return out


if __name__ == "__main__":
    sys.exit(main(HERE, toolkit_args(sys.argv[1:])))
