"""The recipe benchmark's spec (grid.toml): the table of benchmarks/results/recipe.md, with
scikit-learn's references on each data set's rows, and the runs' runner (label smoothing for the
two ``*-cos-ls`` screening candidates of grid-candidates.toml)."""

import contextlib
import statistics
from pathlib import Path

HEAD = ("| data set | train/test rows, classes, modalities | before: FedAvg | before: centralized | ratio | "
        "after, 10 rounds: FedAvg | centralized | ratio | after, 30 rounds: FedAvg | centralized | ratio | "
        "raw inputs (normalize = false), 10 rounds: FedAvg | logistic regression | random forest |")


def run(raw, cfg, run_dir: Path, plan: dict) -> None:
    from mmfl.engine.runner import Experiment

    with label_smoothing(0.1 if plan["method"].endswith("-cos-ls") else 0.0):
        Experiment(cfg, progress=False).run(overwrite=True)


@contextlib.contextmanager
def label_smoothing(eps: float):
    """Screening only: torch's cross-entropy with ``label_smoothing = eps`` while gradients are on
    (training; evaluation's loss is unchanged)."""
    import torch
    import torch.nn.functional as F

    if not eps:
        yield
        return
    plain = F.cross_entropy

    def smoothed(*args, **kwargs):
        if torch.is_grad_enabled():
            kwargs.setdefault("label_smoothing", eps)
        return plain(*args, **kwargs)

    F.cross_entropy = smoothed
    try:
        yield
    finally:
        F.cross_entropy = plain


def references(root: Path, seeds: list[int]) -> dict:
    """Logistic regression (standardized, max_iter 5000) and a random forest (500 trees, one per
    seed) on the run's split and flattened features (every modality, sorted, as the mlp sees them)."""
    import torch
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from mmfl.data import DATASETS
    from mmfl.reference_sklearn import flat_columns

    torch.set_num_threads(1)
    b = DATASETS.get("manifest").factory(DATASETS.params("manifest", {"root": str(root), "normalize": False}))
    mods = sorted(b.meta.modalities)
    (xtr, ytr), (xte, yte) = ((flat_columns(s, mods), s.label_array()) for s in (b.train, b.test))
    lr = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)).fit(xtr, ytr)
    out = {"lr": [float((lr.predict(xte) == yte).mean())] * len(seeds), "rf": []}
    for s in seeds:
        rf = RandomForestClassifier(n_estimators=500, random_state=s, n_jobs=1).fit(xtr, ytr)
        out["rf"].append(float((rf.predict(xte) == yte).mean()))
    out["shape"] = f"{len(ytr)}/{len(yte)} rows, {b.meta.num_classes} classes, " + ", ".join(
        f"{m} {list(b.meta.modalities[m])}" for m in mods)
    return out


def report(b) -> list[str]:
    if "table" not in b.grid.groups:  # grid-candidates.toml: mean ± std per method
        from mmfl.bench.runner import default_report

        return default_report(b)
    mean = statistics.mean

    def cell(v):
        return f"{100 * mean(v):.1f} ({100 * min(v):.1f})" if v else "–"

    def ratio(r, fed, cen):
        return f"{mean(r[fed]) / max(mean(r[cen]), mean(r['lr'])):.2f}" if r[fed] and r[cen] else "–"

    lines = [HEAD, "|---" * 14 + "|"]
    for name in b.grid.settings("table"):
        root = Path(b.config("table", None, name)["data"]["root"]).expanduser()
        r = references(root, b.grid.seeds)
        r.update({m: b.vals("table", m, name, key="final_accuracy", reader="summary") for m in b.methods("table")})
        lines.append(f"| {name} | {r['shape']} | {cell(r['fedavg-sgd'])} | {cell(r['centralized-sgd'])} | "
                     f"{ratio(r, 'fedavg-sgd', 'centralized-sgd')} | {cell(r['fedavg'])} | "
                     f"{cell(r['centralized'])} | {ratio(r, 'fedavg', 'centralized')} | "
                     f"{cell(r['fedavg-r30'])} | {cell(r['centralized-r30'])} | "
                     f"**{ratio(r, 'fedavg-r30', 'centralized-r30')}** | {cell(r['fedavg-raw'])} | "
                     f"{cell(r['lr'])} | {cell(r['rf'])} |")
    return [*lines, ""]
