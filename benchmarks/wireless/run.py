"""Wireless personalized-FMML paper benchmark (paper 004, Yin, Chen, Tao: Tables I-V and Fig. 3)
on two small multimodal settings: the grid ``grid.toml`` (settings, groups, methods, seeds) and
its tables ``tables.py`` (with the post-run Xi history of the Fig. 3 runs), run by the benchmark
toolkit (``mmfl bench``, docs/benchmarks.md).

    nice -n 19 .venv/bin/python benchmarks/wireless/run.py               # everything -> benchmarks/results/wireless.md
    nice -n 19 .venv/bin/python benchmarks/wireless/run.py --quick       # a few-minute smoke version
    .venv/bin/python benchmarks/wireless/run.py --tables-only            # rebuild the report from finished runs

Other options: ``--workers N``, ``--seeds ...`` (run only these), ``--group t12|t3|t4|t5|eta``,
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
