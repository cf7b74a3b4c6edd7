"""benchmarks/results/leakage.md over seeds: the cells of benchmarks/leakage/run.py that are cheap
enough, run for seeds 0-4, each number as its mean over the seeds with a 95 % bootstrap CI
(percentile, 10,000 resamples of the seeds); writes the block between ``<!-- seeds -->`` and
``<!-- /seeds -->`` in leakage.md (the rest of the file is run.py's, one seed).

    .venv/bin/python benchmarks/leakage/seeds.py [--seeds 0 1 2 3 4] [--only FedAvg MOON]

Runs are kept under ``--out`` (default runs/leakage-seeds/s<seed>) and read back when there
(run.py's ``--reuse``), so the seeds can be added one at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as leak  # noqa: E402  (benchmarks/leakage/run.py)

ROOT = leak.ROOT
METRICS = [  # column, where in a cell's row, percent?
    ("model accuracy %", lambda r: r.get("accuracy"), True),
    ("labels from updates: majority hit %", lambda r: (r["audit"]["labels_from_updates"] or {}).get(
        "majority_class_hit_rate"), True),
    ("Spearman", lambda r: (r["audit"]["labels_from_updates"] or {}).get("spearman_mean"), False),
    ("inversion cosine", lambda r: (r["audit"]["labels_from_updates"] or {}).get("inversion_cosine"), False),
    ("shared/cut rows: label probe %", lambda r: (r["audit"]["shared_rows"] or r["audit"]["cut_activations"]
                                                  or {}).get("label_accuracy"), True),
    ("reconstruction, centred cosine", lambda r: (r["audit"]["shared_rows"] or r["audit"]["cut_activations"]
                                                  or {}).get("reconstruction_cosine"), False),
    ("representations: label-histogram TV (uniform)", lambda r: (r["audit"].get("public_representations")
                                                                 or {}).get("tv_mean"), False),
    ("membership AUC", lambda r: (r["audit"]["membership"] or {}).get("auc"), False),
]


def boot_ci(values: list[float], seed: int = 0, n: int = 10_000) -> tuple[float, float]:
    """95 % percentile bootstrap CI of the mean of ``values``."""
    v = np.asarray(values, float)
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(n, len(v)))].mean(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def cellstr(vals: list[float], pct: bool) -> str:
    if not vals:
        return "—"
    k = 100 if pct else 1
    f = "{:.1f}" if pct else "{:.3f}"
    if len(vals) == 1:
        return f.format(k * vals[0]) + " (1 seed)"
    lo, hi = boot_ci(vals)
    return f"{f.format(k * np.mean(vals))} [{f.format(k * lo)}, {f.format(k * hi)}]"


def block(rows: dict[tuple[str, str], list[dict]], seeds: list[int], cmd: str) -> str:
    head = "| algorithm | DP | seeds | " + " | ".join(m[0] for m in METRICS) + " |\n|" + "---|" * (3 + len(METRICS))
    lines = [head]
    for (name, dp), rs in rows.items():
        rs = [r for r in rs if "audit" in r]
        if not rs:
            continue
        cols = []
        for title, get, pct in METRICS:
            vals = [v for v in (get(r) for r in rs) if v is not None]
            bad = sum(1 for v in vals if not np.isfinite(v))  # an inversion that diverged under DP noise
            vals = [v for v in vals if np.isfinite(v)]
            col = cellstr(vals, pct) + (f" ({bad} seed{'s' * (bad > 1)} non-finite, left out)" if bad else "")
            if title.endswith("(uniform)") and vals:
                uni = [(r["audit"].get("public_representations") or {}).get("tv_uniform_mean") for r in rs]
                col += f" ({np.mean([u for u in uni if u is not None]):.3f})"
            cols.append(col)
        lines.append(f"| {name} | {dp} | {len(rs)} | " + " | ".join(cols) + " |")
    return ("<!-- seeds -->\n## Over seeds: mean [95 % bootstrap CI over the seeds]\n\n"
            f"Command: `{cmd}` (seeds {', '.join(map(str, seeds))} where a cell's row says 5; a row with fewer "
            "seeds was too slow for the shared machine and says how many, and a cell the command names but this "
            "table lacks was not run there; the table above is seed 0 alone). "
            "The same runs and audits as the table above, per seed; a CI spans the spread of the seeds "
            "(the partition, the initial model and the batches change with the seed).\n\n"
            + "\n".join(lines) + "\n<!-- /seeds -->\n")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(ROOT / "runs" / "leakage-seeds"))
    p.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    p.add_argument("--only", nargs="*", default=["FedAvg", "MOON"])
    p.add_argument("--no-dp", action="store_true", help="the cells without DP only")
    p.add_argument("--done-only", action="store_true", help="only the cells already audited (no new runs)")
    p.add_argument("--write", action="store_true", help="write the block into benchmarks/results/leakage.md")
    a = p.parse_args()
    leak.REUSE = True
    rows: dict[tuple[str, str], list[dict]] = {}
    for seed in a.seeds:
        out = Path(a.out) / f"s{seed}"
        out.mkdir(parents=True, exist_ok=True)
        for name, config, over in leak.CELLS:
            if name not in a.only:
                continue
            for dp in (False,) if a.no_dp else (False, True):
                slug = name.lower().replace(" ", "_").replace("(", "").replace(")", "").replace("-", "_")
                if a.done_only and not (out / f"{slug}{'_dp' if dp else ''}.audit.json").is_file():
                    continue  # not run yet for this seed: the row says how many seeds it has
                r = leak.cell(out, seed, name, config, over, dp)
                print(seed, name, r["dp"], "ok" if "audit" in r else r.get("why"), flush=True)
                rows.setdefault((name, r["dp"]), []).append(r)
    (Path(a.out) / "rows.json").write_text(json.dumps({f"{k[0]}|{k[1]}": v for k, v in rows.items()}, indent=1))
    cmd = "python benchmarks/leakage/seeds.py --only " + " ".join(f'"{n}"' for n in a.only) + (
        " --no-dp" if a.no_dp else "") + " --write"
    text = block(rows, a.seeds, cmd)
    if a.write:
        leak.write_block(text, "<!-- seeds -->", "<!-- /seeds -->")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
