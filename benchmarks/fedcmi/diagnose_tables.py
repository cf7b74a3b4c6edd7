"""Tables of the FedCMI weak-modality diagnosis (grid: diagnose.toml) and its post-run step:
``probe.json``, a ridge-regression probe refit on the final global model's self-projector
output ``z_m`` over the whole training split (the same read-out for every method), next to
the model's own ``accuracy/<m>``. A row appears once all its seeds are done."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mmfl.bench import md_table
from mmfl.sweep import paired_verdict

FILES = ("probe.json",)
# (a, b, what the difference isolates)
PAIRS = [
    ("FedCMI", "MFedAvg", "the issue's comparison"),
    ("TP", "MFedAvg", "TP: per-modality CE + infiltration projectors"),
    ("TP+PT", "TP", "PT: proximal term, mu = 1"),
    ("TP+RD+PT", "TP+PT", "RD: distillation from the global dominant branch"),
    ("FedCMI", "TP+RD+PT", "CTA: class-wise temperatures"),
    ("FedCMI", "TP+PT", "RD + CTA together"),
]
PAIR_KEYS = ("audio", "audio, mean of rounds 8-10", "audio probe refit on z", "joint")


def done(run_dir: Path, raw: dict) -> bool:
    return (run_dir / "summary.json").exists() and (run_dir / "probe.json").exists()


def post(raw, cfg, run_dir: Path, exp) -> None:
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


def measures(b, name: str) -> dict[str, float]:
    """One run's readings: the final row (probe.json laid over it) and the last 3 rounds' audio."""
    last, rows = b.results.final(name), b.results.rows(name)
    return {"joint": last["accuracy"], "image": last["accuracy/image"], "audio": last["accuracy/audio"],
            "audio, mean of rounds 8-10": float(np.mean([r["accuracy/audio"] for r in rows[-3:]])),
            "audio probe refit on z": last.get("probe_z/audio", float("nan")),
            "image probe refit on z": last.get("probe_z/image", float("nan"))}


def overrides(e) -> str:
    """A row's ``set`` as ``--set`` arguments."""
    return " ".join(f"{k}={json.dumps(v)}" for k, v in e.over.set.items()) or "(defaults)"


def report(b) -> list[str]:
    seeds, methods = b.grid.seeds, b.methods("diag")
    vals: dict[str, dict[str, list[float]]] = {}
    for v in methods:
        names = b.names("diag", v)
        if not all(b.results.finished(n) for n in names.values()):
            continue
        per = [measures(b, n) for n in names.values()]
        vals[v] = {k: [p[k] for p in per] for k in per[0]}
    keys = ["joint", "image", "audio", "audio, mean of rounds 8-10", "audio probe refit on z", "image probe refit on z"]
    rounds = b.config("diag")["rounds"]
    config = ", ".join(str(p.relative_to(b.grid.root)) for p in b.grid.config)
    out = ["# FedCMI on AV digits: what makes the weak modality's accuracy (issue 13)", "",
           f"Regenerate: `{b.params['command']}` (`--tables-only` rebuilds this file).",
           f"Config `{config}` (the README's: AV-MNIST, case D, {rounds} rounds) with one change per "
           f"row; seeds {seeds}; accuracy (%) after round {rounds}, mean ± std over seeds.", "",
           *md_table(["variant", "overrides", *keys], [])]
    for v, d in vals.items():
        # mean of the fractions, then x 100 (not toolkit ms, which scales first: it rounds 96.55 the other way)
        out.append(f"| {v} | `{overrides(methods[v])}` | "
                   + " | ".join(f"{100 * np.mean(d[k]):.1f} ± {100 * np.std(d[k]):.1f}" for k in keys) + " |")
    out += ["", f"Per seed (audio head accuracy after round {rounds}):", "",
            *md_table(["variant", *[f"seed {s}" for s in seeds]],
                      [[v, *[f"{100 * x:.1f}" for x in d["audio"]]] for v, d in vals.items()])]
    out += ["", "## Paired differences (a − b, points; 95% bootstrap CI over seeds, paired t-test)", "",
            *md_table(["a − b", "isolates", "audio", "audio, rounds 8-10", "audio probe refit on z", "joint"], [])]
    for a, bm, what in PAIRS:
        if a in vals and bm in vals:
            cells = []
            for k in PAIR_KEYS:
                r = paired_verdict(vals[a][k], vals[bm][k], scale=100)
                text = r["text"].replace("holds", f"{a} higher").replace("**reversed**", f"**{bm} higher**")
                cells.append(f"{r['delta']:+.1f}: {text}")
            out.append(f"| {a} − {bm} | {what} | " + " | ".join(cells) + " |")
    first = b.names("diag", "FedCMI").get(seeds[0]) if "FedCMI" in methods else None
    trace = b.results.rows(first) if first else []
    if trace and "cmi_teacher/image" in trace[-1]:
        out += ["", f"## FedCMI, seed {seeds[0]}, per round (multimodal clients' means; `metrics.jsonl`)", "",
                *md_table(["round", "image teaches (share of batches)", "rho", "kappa L_rd", "its share of eq. 7",
                           "student T", "IP-teacher agreement (batch)", "accuracy/audio"], [])]
        nan = float("nan")
        for r in trace:
            out.append(f"| {r['round']} | {r.get('cmi_teacher/image', nan):.2f} | {r.get('cmi_rho', nan):.2f} "
                       f"| {r.get('cmi_rd', nan):.2f} | {r.get('cmi_rd_share', nan):.2f} "
                       f"| {r.get('cmi_t_student', nan):.2f} | {r.get('cmi_agree', nan):.2f} "
                       f"| {100 * r['accuracy/audio']:.1f} |")
    return out + [""]
