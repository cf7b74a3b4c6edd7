"""Tables of the missing-modality grid (grid.toml): final test accuracy per policy and method
(mean +- std over seeds), the accuracy on the test rows that hold the audio and on those that
lack it (each run's final server model re-evaluated on the two halves of its test set), and the
paired differences between the policies (same seed = same partition, masks and initialisation)
with a bootstrap CI and scipy's paired t-test over the seeds both have (``mmfl.bench.render.paired``,
i.e. ``mmfl.sweep.paired_verdict``).

    .venv/bin/python benchmarks/missing/paired.py /tmp/missing            # print the Markdown
    .venv/bin/python benchmarks/missing/paired.py /tmp/missing --out x.md # and write it
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

POLICIES = [("mask", "mask"), ("complete", "complete_rows"), ("drop", "drop_modality:audio")]  # --missing sets it
METHODS = [("mfedavg", "MFedAvg"), ("fedcmi", "FedCMI"), ("moon", "MOON")]
PAIRS = [("mask", "complete"), ("mask", "drop"), ("complete", "drop")]
MISSING = "audio"


def split_accuracy(run: Path) -> tuple[float, float]:
    """The run's final server model on its test rows holding ``MISSING`` and on those lacking it."""
    import torch

    import mmfl
    from mmfl.core.evaluation import global_metrics
    from mmfl.data.base import PRESENT

    res = mmfl.load_run(run)
    fed = res.federation()
    model = res.model()
    mask = fed.test.features.get(PRESENT + MISSING)
    if mask is None:  # drop_modality: the test set lacks the modality; the mask run's masks mark the rows
        ref = mmfl.load_run(run.parent / run.name.replace("drop-", "mask-", 1)).federation().test
        mask = ref.features[PRESENT + MISSING]
    rows = fed.test.base_rows()
    has = mask.numpy()[rows]
    out = []
    with torch.no_grad():
        for sel in (has, ~has):
            out.append(global_metrics(model, fed.test.subset(np.nonzero(sel)[0]), fed.meta.num_classes)["accuracy"])
    return out[0], out[1]


def collect(folder: Path, seeds: list[int], methods) -> dict:
    """(policy, method) -> {"final": {seed: acc}, "with": {...}, "without": {...}}."""
    out = {}
    for pol, _ in POLICIES:
        for meth, _ in methods:
            cell = {"final": {}, "with": {}, "without": {}}
            for s in seeds:
                run = folder / f"{pol}-{meth}-s{s}"
                summary = run / "summary.json"
                if not summary.is_file():
                    continue
                cell["final"][s] = json.loads(summary.read_text())["final_accuracy"]
                cell["with"][s], cell["without"][s] = split_accuracy(run)
            out[pol, meth] = cell
    return out


def pm(values: dict) -> str:
    v = np.asarray(list(values.values()), dtype=float) * 100
    return "—" if not len(v) else f"{v.mean():.2f} ± {v.std():.2f}" + ("" if len(v) == 5 else f" (n={len(v)})")


def render(data: dict, seeds: list[int], methods) -> str:
    from mmfl.bench.render import paired

    METHODS = methods  # noqa: N806  (the columns of this table)
    lines = ["Final test accuracy (%), mean ± std over seeds " + ", ".join(map(str, seeds)) + ":", "",
             "| policy | " + " | ".join(label for _, label in METHODS) + " |",
             "|---|" + "---|" * len(METHODS)]
    for pol, label in POLICIES:
        lines.append(f"| `{label}` | " + " | ".join(pm(data[pol, m]["final"]) for m, _ in METHODS) + " |")
    lines += ["", f"The same runs' final server models on the test rows holding the {MISSING} / lacking it "
                  f"(test_missing_rate: the same rows in every run of a seed), accuracy (%):", "",
              "| policy | " + " | ".join(f"{label} with / without" for _, label in METHODS) + " |",
              "|---|" + "---|" * len(METHODS)]
    for pol, label in POLICIES:
        cells = [f"{pm(data[pol, m]['with'])} / {pm(data[pol, m]['without'])}" for m, _ in METHODS]
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    lines += ["", "Paired differences of final accuracy (percentage points, per seed a - b; 95 % bootstrap CI; "
                  "two-sided paired t-test, `scipy.stats.ttest_rel`):", "",
              "| method | a - b | mean | 95 % CI | p | verdict (a > b) |", "|---|---|---|---|---|---|"]
    for meth, mlabel in METHODS:
        for a, b in PAIRS:
            v = paired(data[a, meth]["final"], data[b, meth]["final"], scale=100)
            verdict = v["text"].split(" (")[0]
            names = dict(POLICIES)
            lines.append(f"| {mlabel} | `{names[a]}` - `{names[b]}` | {v['delta']:+.2f} | "
                         f"[{v['lo']:+.2f}, {v['hi']:+.2f}] | {v['p']:.3f} | {verdict} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="the sweep's output folder (mmfl sweep ... --out FOLDER)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--missing", default="audio", help="the modality the grid removes (grid.toml: audio)")
    ap.add_argument("--methods", nargs="+", default=[m for m, _ in METHODS], help="the grid's method keys")
    ap.add_argument("--out", type=Path, help="also write the tables here")
    args = ap.parse_args()
    global MISSING
    MISSING = args.missing
    POLICIES[2] = ("drop", f"drop_modality:{args.missing}")
    methods = [(m, label) for m, label in METHODS if m in args.methods]
    text = render(collect(args.folder, args.seeds, methods), args.seeds, methods)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
