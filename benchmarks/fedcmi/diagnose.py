"""Why FedCMI's weak modality trails MFedAvg's on AV digits (issue 13): the README's FedCMI
config (``mmfl/configs/fedcmi.toml``: AV-MNIST, case D, 10 rounds) with one component
changed at a time, 5 seeds, every ordering a paired test over seeds.

    .venv/bin/python benchmarks/fedcmi/diagnose.py                # run what is missing, write the report
    .venv/bin/python benchmarks/fedcmi/diagnose.py --tables-only  # rebuild the report from finished runs

Runs go to ``benchmarks/results/raw/fedcmi_diag/<variant>-s<seed>/`` (2 workers, one torch
thread each; about 2 min per run on an idle core); the report to
``benchmarks/results/fedcmi_diagnosis.md``. Besides each run's ``metrics.jsonl`` (with
FedCMI's per-round ``cmi_*`` diagnostics) a post step writes ``probe.json``: a ridge-regression
probe refit on the final global model's self-projector output ``z_m`` over the whole training
split (the same read-out for every method), next to the model's own ``accuracy/<m>``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from mmfl.sweep import paired_verdict, run_missing

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONFIG = ROOT / "mmfl" / "configs" / "fedcmi.toml"
RAW = ROOT / "benchmarks" / "results" / "raw" / "fedcmi_diag"
REPORT = ROOT / "benchmarks" / "results" / "fedcmi_diagnosis.md"
SEEDS = [0, 1, 2, 3, 4]
# one component added at a time, as FedCMI's Table 3 (TP, RD, CTA, PT); "FedCMI" = all of them
VARIANTS = {
    "MFedAvg": ["algorithm.name=\"mfedavg\"", "model.two_projector=false"],
    "TP": ["algorithm.distill=false", "algorithm.class_temperature=false", "algorithm.mu=0.0"],
    "TP+PT": ["algorithm.distill=false"],
    "TP+RD+PT": ["algorithm.class_temperature=false"],
    "FedCMI": [],
}
# (a, b, what the difference isolates)
PAIRS = [
    ("FedCMI", "MFedAvg", "the issue's comparison"),
    ("TP", "MFedAvg", "TP: per-modality CE + infiltration projectors"),
    ("TP+PT", "TP", "PT: proximal term, mu = 1"),
    ("TP+RD+PT", "TP+PT", "RD: distillation from the global dominant branch"),
    ("FedCMI", "TP+RD+PT", "CTA: class-wise temperatures"),
    ("FedCMI", "TP+PT", "RD + CTA together"),
]


def raw_config(variant: str, seed: int) -> dict:
    from mmfl.config import apply_overrides, load_raw

    return apply_overrides(load_raw(CONFIG), [*VARIANTS[variant], f"seed={seed}", "threads=1"])


def probe_post(raw, cfg, run_dir: Path, exp) -> None:
    """Refit a ridge probe per modality on the final global model's z_m (train split) -> probe.json."""
    import torch
    import torch.nn.functional as F

    from mmfl.data import DATASETS
    from mmfl.engine import checkpoint
    from mmfl.models.factory import model_factory

    out = run_dir / "probe.json"
    if out.exists() and exp is None:
        return
    bundle = DATASETS.get(cfg.data.name).factory(cfg.data.params)
    server, _, _ = checkpoint.load(checkpoint.latest(run_dir / "checkpoints"))
    model = model_factory(cfg, bundle.meta)()
    model.load_state_dict({k[len("model/"):]: v for k, v in server.items() if k.startswith("model/")})
    model.eval()

    @torch.no_grad()
    def reps(data):
        z, ys = {m: [] for m in model.holds}, []
        for inputs, labels in data.batches(1000, shuffle=False):
            o = model(inputs)
            for m in model.holds:
                z[m].append(o["mod_reps"][m])
            ys.append(labels)
        return {m: torch.cat(v).double() for m, v in z.items()}, torch.cat(ys)

    (ztr, ytr), (zte, yte) = reps(bundle.train), reps(bundle.test)
    row = {}
    for m in model.holds:  # standardised z, one-hot least squares with ridge 0.01 * n
        mu, sd = ztr[m].mean(0), ztr[m].std(0) + 1e-6
        a = torch.cat([(ztr[m] - mu) / sd, torch.ones(len(ytr), 1, dtype=torch.double)], 1)
        b = torch.cat([(zte[m] - mu) / sd, torch.ones(len(yte), 1, dtype=torch.double)], 1)
        w = torch.linalg.solve(a.T @ a + 0.01 * len(a) * torch.eye(a.shape[1], dtype=torch.double),
                               a.T @ F.one_hot(ytr, bundle.meta.num_classes).double())
        row[f"probe_z/{m}"] = float(((b @ w).argmax(1) == yte).double().mean())
    out.write_text(json.dumps(row, indent=1))


def rows_of(name: str) -> list[dict] | None:
    d = RAW / name
    if not (d / "summary.json").exists():
        return None
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if (d / "probe.json").exists():
        rows[-1].update(json.loads((d / "probe.json").read_text()))
    return rows


def measures(rows: list[dict]) -> dict[str, float]:
    last = rows[-1]
    return {"joint": last["accuracy"], "image": last["accuracy/image"], "audio": last["accuracy/audio"],
            "audio, mean of rounds 8-10": float(np.mean([r["accuracy/audio"] for r in rows[-3:]])),
            "audio probe refit on z": last.get("probe_z/audio", float("nan")),
            "image probe refit on z": last.get("probe_z/image", float("nan"))}


def report() -> str:
    vals: dict[str, dict[str, list[float]]] = {}
    for v in VARIANTS:
        runs = [rows_of(f"{v}-s{s}") for s in SEEDS]
        if any(r is None for r in runs):
            continue
        per = [measures(r) for r in runs]
        vals[v] = {k: [p[k] for p in per] for k in per[0]}
    keys = ["joint", "image", "audio", "audio, mean of rounds 8-10", "audio probe refit on z", "image probe refit on z"]
    out = ["# FedCMI on AV digits: what makes the weak modality's accuracy (issue 13)", "",
           "Regenerate: `.venv/bin/python benchmarks/fedcmi/diagnose.py` (`--tables-only` rebuilds this file).",
           f"Config `mmfl/configs/fedcmi.toml` (the README's: AV-MNIST, case D, 10 rounds) with one change per "
           f"row; seeds {SEEDS}; accuracy (%) after round 10, mean ± std over seeds.", "",
           "| variant | overrides | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for v, d in vals.items():
        cells = [f"{100 * np.mean(d[k]):.1f} ± {100 * np.std(d[k]):.1f}" for k in keys]
        out.append(f"| {v} | `{' '.join(VARIANTS[v]) or '(defaults)'}` | " + " | ".join(cells) + " |")
    out += ["", "Per seed (audio head accuracy after round 10):", "",
            "| variant | " + " | ".join(f"seed {s}" for s in SEEDS) + " |", "|---|" + "---|" * len(SEEDS)]
    for v, d in vals.items():
        out.append(f"| {v} | " + " | ".join(f"{100 * x:.1f}" for x in d["audio"]) + " |")
    out += ["", "## Paired differences (a − b, points; 95% bootstrap CI over seeds, paired t-test)", "",
            "| a − b | isolates | audio | audio, rounds 8-10 | audio probe refit on z | joint |", "|---|---|---|---|---|---|"]
    for a, b, what in PAIRS:
        if a in vals and b in vals:
            cells = [paired_verdict(vals[a][k], vals[b][k], scale=100)["text"].replace("holds", f"{a} higher")
                     .replace("**reversed**", f"**{b} higher**")
                     for k in ("audio", "audio, mean of rounds 8-10", "audio probe refit on z", "joint")]
            cells = [f"{paired_verdict(vals[a][k], vals[b][k], scale=100)['delta']:+.1f}: {c}"
                     for k, c in zip(("audio", "audio, mean of rounds 8-10", "audio probe refit on z", "joint"), cells)]
            out.append(f"| {a} − {b} | {what} | " + " | ".join(cells) + " |")
    trace = rows_of("FedCMI-s0")
    if trace and "cmi_teacher/image" in trace[-1]:
        out += ["", "## FedCMI, seed 0, per round (multimodal clients' means; `metrics.jsonl`)", "",
                "| round | image teaches (share of batches) | rho | kappa L_rd | its share of eq. 7 | student T | "
                "IP-teacher agreement (batch) | accuracy/audio |", "|---|---|---|---|---|---|---|---|"]
        for r in trace:
            out.append(f"| {r['round']} | {r.get('cmi_teacher/image', float('nan')):.2f} | {r.get('cmi_rho', float('nan')):.2f} "
                       f"| {r.get('cmi_rd', float('nan')):.2f} | {r.get('cmi_rd_share', float('nan')):.2f} "
                       f"| {r.get('cmi_t_student', float('nan')):.2f} | {r.get('cmi_agree', float('nan')):.2f} "
                       f"| {100 * r['accuracy/audio']:.1f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables-only", action="store_true", help="rebuild the report from finished runs")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (one torch thread each)")
    args = ap.parse_args(argv)
    if not args.tables_only:
        runs = [(f"{v}-s{s}", raw_config(v, s)) for v in VARIANTS for s in SEEDS]
        run_missing("fedcmi diagnosis", runs, RAW, args.jobs, [runs[0][1]],
                    done=lambda n, r: (RAW / n / "summary.json").exists() and (RAW / n / "probe.json").exists(),
                    post=probe_post, reuse_finished=True)
    REPORT.write_text(report())
    print(REPORT.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
