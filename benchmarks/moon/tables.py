"""MOON benchmark tables (grid: grid.toml): Table 1 (final accuracy, paired differences),
Table 2 (rounds to reach FedAvg's accuracy), SCAFFOLD's correction, the same on a convex
model, MOON's representation probe. Rows iterate over the grid's methods; the paired
comparisons and the probe's rows are the paper's / issue 13's named choices."""

from __future__ import annotations

import numpy as np

from mmfl.bench import PAIR_HEAD, dotted_get, pair_row, seed_cell
from mmfl.report import rounds_to_reach
from mmfl.sweep import machine

CHANCE = 0.10  # accuracy of a diverged run's non-finite model on the 10 balanced classes
T1_PAIRS = [("moon", "fedavg"), ("moon5", "fedavg"), ("fedprox", "fedavg"), ("scaffold", "fedavg"),
            ("moon", "fedprox"), ("moon", "scaffold"), ("moon", "moon5"), ("fedavg", "local")]
SC_PAIRS = [("scaffold", "fedavg"), ("scaffold-uniform", "fedavg"), ("scaffold-printed", "fedavg"),
            ("scaffold-after", "fedavg"), ("scaffold", "scaffold-uniform"), ("scaffold-sgd", "fedavg-sgd"),
            ("scaffold-sgd-uniform", "fedavg-sgd")]
LIN_PAIRS = [((m, lr), ("fedavg", lr)) for lr in ("lr0.1", "lr0.01") for m in ("scaffold", "scaffold-uniform")] + \
    [(("scaffold", lr), ("scaffold-uniform", lr)) for lr in ("lr0.1", "lr0.01")]
PROBE_METHODS = ("fedavg", "moon", "moon5")
PROBE = [("moon/ce", "CE"), ("moon/con", "l_con"), ("moon/cos_glob", "cos(z, z_glob)"),
         ("moon/cos_prev", "cos(z, z_prev)"), ("moon/cos_glob_prev", "cos(z_glob, z_prev)")]


def finals(b, group, method, setting=None):
    """Final accuracy per seed; None for a failed (diverged) run, missing seeds left out."""
    return b.by_seed(group, method, setting, key="final_accuracy", reader="summary", keep_failed=True)


def pair(label_a, label_b, a, b):
    return pair_row(label_a, label_b, a, b, scale=100.0, fail_value=CHANCE, fail_note="10%")


def table1(b, rounds) -> list[str]:
    methods = b.methods("t1")
    vals = {m: finals(b, "t1", m) for m in methods}
    out = [f"| method | accuracy after {rounds} rounds (%) |", "|---|---|"]
    for m, e in methods.items():
        if m == "local":  # SOLO: each seed's mean over the parties; std over seeds
            stds = [r.get("final_accuracy_std", 0) for n in b.names("t1", m).values() if (r := b.results.summary(n))]
            extra = f"; std over parties {100 * np.mean(stds):.1f}" if stds else ""
            out.append(f"| {e.label} (mean over parties) | {seed_cell(vals[m])}{extra} |")
        else:
            out.append(f"| {e.label} | {seed_cell(vals[m])} |")
    out.append(f"| centralized ({rounds} epochs of the pooled data) | {seed_cell(finals(b, 't1', 'centralized'))} |")
    out += ["", *PAIR_HEAD]
    for x, y in T1_PAIRS:
        out.append(pair(methods[x].label, methods[y].label, vals[x], vals[y]))
    return out


def table2(b, rounds) -> list[str]:
    methods = {m: e for m, e in b.methods("t1").items() if m != "local"}
    curves = {m: b.results.mean_curve(b.names("t1", m)) for m in methods}
    if not curves["fedavg"]:
        return ["(no FedAvg runs)"]
    target = curves["fedavg"][-1]["accuracy"]
    base = rounds_to_reach(curves["fedavg"], target)
    out = [f"Target: FedAvg's mean accuracy after {rounds} rounds: {100 * target:.1f}%. "
           "Mean curve over seeds.", "", "| method | rounds to reach | speedup | accuracy per round (mean over seeds, %) |",
           "|---|---|---|---|"]
    for m, c in curves.items():
        r = rounds_to_reach(c, target)
        cell = f"{r} | {base / r:.2f}×" if r else f"not reached in {rounds} | <1×"
        curve = ", ".join(f"{100 * x['accuracy']:.1f}" for x in c)
        out.append(f"| {methods[m].label} | {cell} | {curve} |")
    return out


def table_sc(b, rounds) -> list[str]:
    methods = b.methods("sc")
    vals = {m: finals(b, "sc", m) for m in methods}
    out = [f"| method | optimizer | accuracy after {rounds} rounds (%) |", "|---|---|---|"]
    for m, e in methods.items():
        out.append(f"| {e.label} | {e.info['optimizer']} | {seed_cell(vals[m])} |")
    out += ["", *PAIR_HEAD]
    label = lambda m: "FedAvg" if m.startswith("fedavg") else f"SCAFFOLD [{m}]"  # noqa: E731
    for x, y in SC_PAIRS:
        out.append(pair(label(x), label(y), vals[x], vals[y]))
    return out


def table_lin(b, rounds) -> list[str]:
    methods, settings = b.methods("lin"), b.grid.settings("lin")
    vals = {(m, s): finals(b, "lin", m, s) for s in settings for m in methods}
    out = [f"| method | optimizer | accuracy after {rounds} rounds (%) |", "|---|---|---|"]
    for s, se in settings.items():
        for m, e in methods.items():
            out.append(f"| {e.label} | {se.label} | {seed_cell(vals[m, s])} |")
    out += ["", *PAIR_HEAD]
    for x, y in LIN_PAIRS:
        out.append(pair(f"{methods[x[0]].label} ({settings[x[1]].label})", methods[y[0]].label, vals[x], vals[y]))
    return out


def table_probe(b) -> list[str]:
    """MOON's probe (mean over seeds and over clients, data-size weighted) at some rounds."""
    out = ["| method | round | accuracy | " + " | ".join(label for _, label in PROBE) + " |",
           "|---|---|---|" + "---|" * len(PROBE)]
    for m in PROBE_METHODS:
        runs = [b.results.rows(n) for n in b.names("t1", m).values() if b.results.finished(n)]
        if not runs:
            continue
        for rnd in b.params["probe_rounds"]:
            rows = [r[rnd - 1] for r in runs if len(r) >= rnd]
            cells = []
            for key, _ in PROBE:
                v = [row[key] for row in rows if key in row]
                cells.append(f"{np.mean(v):.3f}" if v else "–")
            acc = 100 * np.mean([row["accuracy"] for row in rows])
            out.append(f"| {b.methods('t1')[m].label} | {rnd} | {acc:.1f} | " + " | ".join(cells) + " |")
    return out


def report(b) -> list[str]:
    t1, sc = b.config("t1"), b.config("sc")
    get = dotted_get
    t1_rounds, sc_rounds, t1_beta, sc_beta = t1["rounds"], sc["rounds"], get(t1, "partition.beta"), get(sc, "partition.beta")
    train_limit, epochs = get(t1, "data.train_limit"), get(t1, "train.local_epochs")
    done = [r for run in b.runs if (r := b.results.summary(run.name))]
    return [
        "# MOON benchmark on Fashion-MNIST", "",
        f"Regenerate: `{b.params['command']}` "
        "(runs in `benchmarks/results/raw/`, resumable; tables recomputed from them).", "",
        "## Setting", "",
        "Fashion-MNIST (Debian `dataset-fashion-mnist`), "
        + ("all 60,000 training images" if not train_limit else f"a seeded subset of {train_limit:,} training images")
        + ", the 10,000 test images; MOON's simple CNN with its 2-layer projection head (out_dim 256); 10 clients, "
        "Dirichlet(β) label skew (MOON/NIID-Bench partitioner); "
        f"{epochs} local epoch per round (about 94 steps per client at 60,000 images); SGD momentum 0.9, lr 0.01, "
        f"weight decay 1e-5, batch 64; seeds {b.grid.seeds}; one torch thread per run; clients trained batched "
        "(equal to sequential training within float tolerance). The paper uses CIFAR-10/100 and Tiny-ImageNet, "
        "100 rounds of 10 local epochs: compare orderings, not absolute values.", "",
        "Orderings: paired over seeds (the same seed gives both methods the same partition, initial model and "
        "batch order); a claim is made only when the 95% bootstrap interval of the mean difference excludes 0 "
        "and the paired t-test gives p < 0.05.", "",
        f"Machine: {machine()}. Cost: the finished runs' wall times add up to "
        f"{sum(r['wall_time_s'] for r in done) / 3600:.2f} h (the machine was shared, so this is an upper bound).", "",
        f"## Table 1: top-1 test accuracy, β = {t1_beta}, {t1_rounds} rounds", "",
        *table1(b, t1_rounds), "",
        f"## Table 2: rounds to reach FedAvg's final accuracy (β = {t1_beta})", "",
        *table2(b, t1_rounds), "",
        f"## SCAFFOLD's correction (β = {sc_beta}, {sc_rounds} rounds)", "",
        *table_sc(b, sc_rounds), "",
        f"## SCAFFOLD on a convex model: multinomial logistic regression (β = {sc_beta}, {sc_rounds} rounds)", "",
        "The same setting with `model.name = \"mlp\"`, `hidden = []` (a linear model on the 784 pixels), plain SGD.", "",
        *table_lin(b, sc_rounds), "",
        f"## MOON's representation probe (β = {t1_beta})", "",
        "After local training each client measures, on its first 256 samples, the trained model's CE and l_con "
        "and the mean cosines between z (the trained local model's projection output), z_glob (the round's global "
        "model) and z_prev (the client's model after its previous round); data-size-weighted mean over clients, then "
        "mean over seeds (`moon/*` in metrics.jsonl). In round 1 there is no previous model.", "",
        *table_probe(b), "",
        "## Reading", "", "<!-- analysis -->", "",
    ]
