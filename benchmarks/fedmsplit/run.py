"""FedMSplit's graph on mfeat pair: learned vs cosine graph, personalized vs global model
(the tables of docs/algorithms/fedmsplit.md), with the FedCMI benchmark's settings
(benchmarks/fedcmi/grid.toml, mfeat pair: 10 clients, 5 per round, 10 rounds, 2 local
epochs, lr 0.01, momentum 0.9), 5 seeds; about 30 minutes on one core.

    .venv/bin/python benchmarks/fedmsplit/run.py [--out /tmp/fedmsplit-graph] [--workers 1]
    .venv/bin/python benchmarks/fedmsplit/run.py --diagnose   # (G4)'s scale; what the learned edges weigh

Runs go to ``<out>/<run>/`` (a finished run is not run again); the markdown tables are
printed. Each row's numbers are the last round's ``accuracy`` (each client's personalized
model on its own test rows), ``global/personal_accuracy`` (the global model on the same
rows) and ``global/accuracy`` (the global model on the whole test set). Differences are
paired by seed: mean, 95% bootstrap CI, paired t-test p.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from mmfl.sweep import run_missing

SEEDS = [0, 1, 2, 3, 4]
BASE = {
    "rounds": 10, "eval_every": 10, "threads": 1, "clients_per_round": 5,
    "data": {"name": "mfeat_pair"}, "partition": {"num_clients": 10},
    "model": {"name": "multimodal", "feat_dim": 64, "cnn_channels": [16, 32], "mlp_hidden": [128], "fusion": "concat"},
    "train": {"optimizer": "sgd", "local_epochs": 2, "batch_size": 32, "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4},
}
VARIANTS = {  # name -> [algorithm] table
    "learned": {"name": "fedmsplit"},
    "learned_lr0.1": {"name": "fedmsplit", "graph_lr": 0.1},
    "learned_lr2": {"name": "fedmsplit", "graph_lr": 2.0},
    "cosine_mix1": {"name": "fedmsplit", "graph": "cosine"},
    "cosine_mix05": {"name": "fedmsplit_cosine"},
    "self_only": {"name": "fedmsplit", "graph": "cosine", "tau": 1e-8},  # A = I: local training
}
SETTINGS = {  # FedCMI's cases (Dirichlet beta 5 in C, D) and a strong label skew (beta 0.1)
    "A": {"case": "A"}, "B": {"case": "B"}, "C": {"case": "C"}, "D": {"case": "D"},
    "C-beta0.1": {"case": "C", "partition": {"beta": 0.1}}, "D-beta0.1": {"case": "D", "partition": {"beta": 0.1}},
}
MAIN = ["learned", "cosine_mix1", "cosine_mix05", "self_only"]
PLAN = [(s, v) for s in SETTINGS for v in MAIN] + [(s, v) for s in ("D", "C-beta0.1")
                                                   for v in ("learned_lr0.1", "learned_lr2")]
PAIRS = [("learned", "cosine_mix1", "accuracy", "accuracy"), ("learned", "cosine_mix05", "accuracy", "accuracy"),
         ("learned", "self_only", "accuracy", "accuracy"),
         ("learned", "learned", "accuracy", "global/personal_accuracy"),
         ("learned", "cosine_mix05", "global/accuracy", "global/accuracy")]


def raw_config(setting: str, variant: str, seed: int) -> dict:
    raw = json.loads(json.dumps(BASE))
    extra = json.loads(json.dumps(SETTINGS[setting]))
    raw["case"] = extra.pop("case")
    for k, v in extra.items():
        raw[k].update(v)
    raw["algorithm"] = dict(VARIANTS[variant])
    raw["seed"] = seed
    return raw


def last_row(out: Path, name: str) -> dict | None:
    p = out / name / "metrics.jsonl"
    if not (out / name / "summary.json").exists():
        return None
    rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    return rows[-1] if rows else None


def report(out: Path) -> list[str]:
    from scipy.stats import ttest_rel

    R = {(s, v): {x: last_row(out, f"{s}-{v}-s{x}") for x in SEEDS} for s, v in PLAN}
    R = {k: {x: r for x, r in d.items() if r is not None} for k, d in R.items()}

    def ms(vals):
        return f"{100 * np.mean(vals):.1f} ± {100 * np.std(vals):.1f}" if vals else "—"

    lines = ["| setting | variant | personalized `accuracy` | global model, same rows `global/personal_accuracy` "
             "| global model `global/accuracy` | mean A_ii |", "|---|---|---|---|---|---|"]
    for s, v in PLAN:
        d = R[(s, v)]
        get = lambda k: [d[x][k] for x in sorted(d)]  # noqa: E731
        sw = get("msplit_self_weight") if d and "msplit_self_weight" in next(iter(d.values())) else []
        lines.append(f"| {s} | {v} | {ms(get('accuracy'))} | {ms(get('global/personal_accuracy'))} | "
                     f"{ms(get('global/accuracy'))} | {np.mean(sw):.2f} |" if sw else
                     f"| {s} | {v} | {ms(get('accuracy'))} | {ms(get('global/personal_accuracy'))} | "
                     f"{ms(get('global/accuracy'))} | — |")
    lines += ["", "| setting | difference (points, paired by seed) | mean | 95% bootstrap CI | paired t p |",
              "|---|---|---|---|---|"]
    rng = np.random.default_rng(0)
    for s in SETTINGS:
        for a, b, ka, kb in PAIRS:
            da, db = R.get((s, a), {}), R.get((s, b), {})
            seeds = sorted(set(da) & set(db))
            if len(seeds) < 2:
                continue
            diff = np.array([100 * (da[x][ka] - db[x][kb]) for x in seeds])
            boot = diff[rng.integers(0, len(diff), (10000, len(diff)))].mean(1)
            lo, hi = np.quantile(boot, [0.025, 0.975])
            p = ttest_rel([da[x][ka] for x in seeds], [db[x][kb] for x in seeds]).pvalue
            lines.append(f"| {s} | {a} `{ka}` − {b} `{kb}` | {diff.mean():+.1f} | [{lo:+.1f}, {hi:+.1f}] | "
                         f"{p:.3f} |" + ("" if len(seeds) == len(SEEDS) else f" ({len(seeds)} seeds)"))
    return lines


def diagnose(out: Path) -> list[str]:
    """Seed 0: (a) the raw (G4) scale, case D (why (G5) normalizes); (b) case C, beta 0.1: the label
    similarity of each client's neighbours weighted by the learned graph, the cosine part alone, uniform."""
    import torch

    import mmfl.algorithms.fedmsplit as fm
    from mmfl.config import resolve
    from mmfl.engine.runner import Experiment

    torch.set_num_threads(1)
    seen, orig = [], fm.normalized_step

    def spy(row, grad, lr):
        seen.append(float(grad.abs().max()))
        return orig(row, grad, lr)

    fm.normalized_step = spy
    try:
        Experiment(resolve(dict(raw_config("D", "learned", 0), name="diag-scale", output_dir=str(out))),
                   progress=False).run(overwrite=True)
    finally:
        fm.normalized_step = orig
    lines = [f"raw (G4) max |grad| per row, case D seed 0: {len(seen)} rows, median {np.median(seen):.4f}, "
             f"90th percentile {np.quantile(seen, 0.9):.4f}, max {max(seen):.4f}"]
    exp = Experiment(resolve(dict(raw_config("C-beta0.1", "learned", 0), name="diag-graph", output_dir=str(out))),
                     progress=False)
    exp.run(overwrite=True)
    srv, fed = exp.server, exp.federation
    P = np.stack([np.bincount(c.label_array(), minlength=fed.meta.num_classes) / len(c) for c in fed.clients])
    sim = (P @ P.T) / np.outer(np.linalg.norm(P, axis=1), np.linalg.norm(P, axis=1))
    for u in ("classifier", *[m for m in srv._modules if m.startswith("encoders.")]):
        cids, a, vec = srv.graph(u)
        S, off = sim[np.ix_(cids, cids)], ~np.eye(len(cids), dtype=bool)

        def weighted(A):
            A = A.numpy().copy()
            A[~off] = 0
            return float(((A / A.sum(1, keepdims=True)) * S).sum(1).mean())

        lines.append(f"case C beta 0.1 seed 0, view {u}: neighbours' label-distribution cosine weighted by the learned "
                     f"graph {weighted(a):.3f}, by its cosine part {weighted(fm.attention_matrix(vec, srv.params.tau)):.3f},"
                     f" uniform {float(S[off].mean()):.3f}; mean A_ii learned {float(a.diag().mean()):.2f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/fedmsplit-graph", help="run folder")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--tables-only", action="store_true")
    ap.add_argument("--diagnose", action="store_true", help="only the two seed-0 graph diagnostics")
    args = ap.parse_args()
    out = Path(args.out)
    if args.diagnose:
        print("\n".join(diagnose(out)))
        return
    if not args.tables_only:
        runs = [(f"{s}-{v}-s{x}", raw_config(s, v, x)) for x in SEEDS for s, v in PLAN]
        run_missing("fedmsplit", runs, out, args.workers, [raw_config("A", "learned", 0)])
    print("\n".join(report(out)))


if __name__ == "__main__":
    main()
