"""Why FedCMI's weak modality trails MFedAvg's on AV digits (issue 13): the README's FedCMI
config (``mmfl/configs/fedcmi.toml``: AV-MNIST, case D, 10 rounds) with one component
changed at a time, 5 seeds, every ordering a paired test over seeds. The grid is
``diagnose.toml``, the tables and the post-run probe ``diagnose_tables.py`` (``mmfl bench``,
docs/benchmarks.md).

    .venv/bin/python benchmarks/fedcmi/diagnose.py                # run what is missing, write the report
    .venv/bin/python benchmarks/fedcmi/diagnose.py --tables-only  # rebuild the report from finished runs

Runs go to ``benchmarks/results/raw/fedcmi_diag/<variant>-s<seed>/`` (2 workers, one torch
thread each; ``--workers N``); the report to ``benchmarks/results/fedcmi_diagnosis.md``.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # this checkout's mmfl
from mmfl.bench import bench_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(bench_main(HERE / "diagnose.toml"))
