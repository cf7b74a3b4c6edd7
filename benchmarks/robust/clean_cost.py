"""The clean-data cost of each robust aggregation rule (issue 27, item 4): no attacker, the demo
(mfeat digits, 10 clients, Dirichlet(0.5) label skew, an MLP, 10 rounds, every client in every
round), 5 seeds; final test accuracy per rule, its difference to FedAvg's weighted mean paired by
seed, with a paired t-test (scipy.stats.ttest_rel). Writes benchmarks/results/robust_clean_cost.md.

    PYTHONPATH=$PWD nice .venv/bin/python benchmarks/robust/clean_cost.py [--out DIR]

The rules' parameters are those of benchmarks/robust/grid.toml (sized for 3 attackers of 10).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import mmfl  # noqa: E402
from scipy.stats import ttest_rel  # noqa: E402

SEEDS = [0, 1, 2, 3, 4]
METHODS = {
    "fedavg": ("FedAvg (weighted mean)", {"algorithm.aggregation": "weighted_mean"}),
    "median": ("coordinate median", {"algorithm.aggregation": "median"}),
    "trimmed_mean": ("trimmed mean (β = 0.3)", {"algorithm.aggregation": "trimmed_mean",
                                                "algorithm.aggregation_params.trim_fraction": 0.3}),
    "krum": ("Krum (f = 3)", {"algorithm.aggregation": "krum", "algorithm.aggregation_params.f": 3}),
    "multi_krum": ("Multi-Krum (f = 3, m = n - f)", {"algorithm.aggregation": "multi_krum",
                                                     "algorithm.aggregation_params.f": 3}),
    "bulyan": ("Bulyan (f = 1)", {"algorithm.aggregation": "bulyan", "algorithm.aggregation_params.f": 1}),
    "norm_clip": ("norm clipping (M = 1)", {"algorithm.aggregation": "norm_clip",
                                            "algorithm.aggregation_params.clip_norm": 1.0}),
    "norm_clip_adaptive": ("norm clipping (M = median norm)", {"algorithm.aggregation": "norm_clip_adaptive"}),
}
COMMAND = "PYTHONPATH=$PWD nice .venv/bin/python benchmarks/robust/clean_cost.py"


def final_accuracy(out: Path, method: str, seed: int) -> float:
    name = f"clean-{method}-s{seed}"
    summary = out / name / "summary.json"
    if summary.is_file():  # finished before: reused
        return json.loads(summary.read_text())["final_accuracy"]
    res = mmfl.run(ROOT / "mmfl" / "configs" / "demo.toml", set={**METHODS[method][1], "seed": seed, "threads": 1,
                   "name": name, "output_dir": str(out)}, overwrite=True, progress=False)
    return res.summary["final_accuracy"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/mmfl-robust-clean", help="parent folder of the runs")
    ap.add_argument("--report", default=str(ROOT / "benchmarks" / "results" / "robust_clean_cost.md"))
    args = ap.parse_args()
    out = Path(args.out)
    t0 = time.time()
    acc = {m: [final_accuracy(out, m, s) for s in SEEDS] for m in METHODS}
    base = acc["fedavg"]
    lines = ["# The clean-data cost of robust aggregation rules", "",
             f"Regenerate: `{COMMAND}` (runs in `/tmp/mmfl-robust-clean`, reused when finished).", "",
             "No attacker. The demo (`mmfl/configs/demo.toml`): mfeat digits, 10 clients with Dirichlet(0.5) "
             "label skew, an MLP, SGD lr 0.01, 2 local epochs, 10 rounds, every client in every round "
             "(n = 10 updates). Seeds 0-4. The rules' parameters are the robustness benchmark's "
             "(`benchmarks/robust/grid.toml`: sized for 3 attackers of 10). Final test accuracy (%); "
             "the difference to FedAvg is paired by seed, with a paired t-test (`scipy.stats.ttest_rel`, "
             "two-sided, 4 degrees of freedom).", "",
             "| rule | final accuracy (%), mean ± std | vs FedAvg (points), mean [min, max] | paired t-test p |",
             "|---|---|---|---|"]
    for m, (label, _) in METHODS.items():
        a = [100 * x for x in acc[m]]
        row = f"| {label} | {statistics.mean(a):.1f} ± {statistics.stdev(a):.1f} | "
        if m == "fedavg":
            row += "- | - |"
        else:
            d = [100 * (x - y) for x, y in zip(acc[m], base)]
            p = ttest_rel(acc[m], base).pvalue
            row += f"{statistics.mean(d):+.1f} [{min(d):+.1f}, {max(d):+.1f}] | {p:.3g} |"
        lines.append(row)
    lines += ["", "Per seed (final accuracy, %):", "",
              "| rule | " + " | ".join(f"seed {s}" for s in SEEDS) + " |", "|---|" + "---|" * len(SEEDS)]
    for m, (label, _) in METHODS.items():
        lines.append(f"| {label} | " + " | ".join(f"{100 * x:.1f}" for x in acc[m]) + " |")
    lines += ["", f"({len(METHODS) * len(SEEDS)} runs; this invocation took {time.time() - t0:.0f} s wall.)", ""]
    Path(args.report).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
