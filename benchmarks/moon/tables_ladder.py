"""MOON ladder tables (grid: grid-ladder.toml): per rung (Dirichlet beta x local epochs E) the
final accuracy of each method, the paired differences to FedAvg, rounds to a fixed target and
MOON's representation probe. The section is written into ``params.section`` (moon.md) between
the ``<!-- ladder -->`` markers (appended at the end the first time: below moon.md's
``<!-- analysis -->`` marker, so grid.toml's rebuilds keep it) and printed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mmfl.bench import PAIR_HEAD, dotted_get, md_table, pair_row, seed_cell
from mmfl.report import rounds_to_reach

GROUP = "ladder"
CHANCE = 0.10  # a diverged run's accuracy on the 10 balanced classes
PAIRS = [("moon", "fedavg"), ("fedprox", "fedavg"), ("scaffold", "fedavg"), ("moon", "scaffold")]
PROBE_METHODS = ("fedavg", "moon")
PROBE = [("moon/ce", "CE"), ("moon/con", "l_con"), ("moon/cos_glob", "cos(z, z_glob)"),
         ("moon/cos_prev", "cos(z, z_prev)"), ("moon/cos_glob_prev", "cos(z_glob, z_prev)")]
BEGIN, END = "<!-- ladder -->", "<!-- /ladder -->"


def finals(b, method, setting):
    return b.by_seed(GROUP, method, setting, key="final_accuracy", reader="summary", keep_failed=True)


def accuracy_table(b) -> list[str]:
    methods, settings = b.methods(GROUP), b.grid.settings(GROUP)
    rows = [[s.label, *[seed_cell(finals(b, m, sk)) if b.names(GROUP, m, sk) else "(not run)" for m in methods]]
            for sk, s in settings.items()]
    return md_table(["rung", *[e.label for e in methods.values()]], rows)


def pair_table(b) -> list[str]:
    methods, settings = b.methods(GROUP), b.grid.settings(GROUP)
    out = list(PAIR_HEAD)
    for sk, s in settings.items():
        for x, y in PAIRS:
            if not (b.names(GROUP, x, sk) and b.names(GROUP, y, sk)):  # a method not planned at this rung
                continue
            out.append(pair_row(f"{s.label}: {methods[x].label}", methods[y].label, finals(b, x, sk), finals(b, y, sk),
                                scale=100.0, fail_value=CHANCE, fail_note="10%"))
    return out


def rounds_table(b, rounds) -> list[str]:
    """MOON's Table 2 per rung: rounds for each method to reach FedAvg's mean final accuracy at
    the same rung, on the mean curve over seeds and per seed."""
    methods, settings = b.methods(GROUP), b.grid.settings(GROUP)
    out = ["| rung | method | rounds to reach (mean curve) | per seed (– = not in "
           f"{rounds}) | accuracy per round (mean over seeds, %) |", "|---|---|---|---|---|"]
    for sk, s in settings.items():
        base = b.results.mean_curve(b.names(GROUP, "fedavg", sk))
        if not base:
            continue
        t = base[-1]["accuracy"]
        for m, e in methods.items():
            names = b.names(GROUP, m, sk)
            c = b.results.mean_curve(names)
            if not c:
                continue
            r = rounds_to_reach(c, t)
            per = [rounds_to_reach([x for x in b.results.rows(n) if "accuracy" in x], t)
                   for n in names.values() if b.results.finished(n)]
            per_txt = ", ".join("–" if p is None else str(p) for p in per)
            curve = ", ".join(f"{100 * x['accuracy']:.1f}" for x in c)
            out.append(f"| {s.label} (target {100 * t:.1f}) | {e.label} | {r if r else '–'} | {per_txt} | {curve} |")
    return out


def probe_table(b) -> list[str]:
    """MOON's probe at round 2 and the last round: mean over seeds of the clients' data-size-weighted means,
    plus cos(z, z_glob) − cos(z, z_prev) (MOON's loss pushes it up)."""
    methods, settings = b.methods(GROUP), b.grid.settings(GROUP)
    head = ["rung", "method", "round", "accuracy", *[lab for _, lab in PROBE], "cos(z, z_glob) − cos(z, z_prev)"]
    rows = []
    for sk, s in settings.items():
        for m in PROBE_METHODS:
            runs = [b.results.rows(n) for n in b.names(GROUP, m, sk).values() if b.results.finished(n)]
            if not runs:
                continue
            for rnd in sorted({2, min(len(r) for r in runs)}):  # round 2 (the first with z_prev) and the last
                got = [r[rnd - 1] for r in runs if len(r) >= rnd]
                cells = []
                for key, _ in PROBE:
                    v = [row[key] for row in got if key in row]
                    cells.append(f"{np.mean(v):.3f}" if v else "–")
                d = [row["moon/cos_glob"] - row["moon/cos_prev"] for row in got if "moon/cos_prev" in row]
                acc = 100 * np.mean([row["accuracy"] for row in got])
                rows.append([s.label, methods[m].label, str(rnd), f"{acc:.1f}", *cells,
                             f"{np.mean(d):+.3f}" if d else "–"])
    return md_table(head, rows)


def first_config(b) -> dict:
    return b.config(GROUP, None, next(iter(b.grid.settings(GROUP))))


def steps_line(b) -> str:
    """Mean local SGD steps per client and epoch (rows / batch), from the rung configs."""
    cfg = first_config(b)
    n, k = dotted_get(cfg, "data.train_limit"), dotted_get(cfg, "partition.num_clients")
    bs = dotted_get(cfg, "train.batch_size")
    return (f"{n:,} training images over {k} clients: {n // k} images and about {n / k / bs:.1f} SGD steps per "
            f"client and epoch on average (batch {bs}; Dirichlet skew makes clients unequal)")


def shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def section(b) -> list[str]:
    cfg = first_config(b)
    rounds, get = cfg["rounds"], dotted_get
    done = [r for run in b.runs if (r := b.results.summary(run.name))]
    n_done, n_plan = len(done), len(b.runs)
    return [
        BEGIN, "## Ladder toward the paper's regime", "",
        f"Regenerate: `{b.params['command']}` (runs in `{shown(b.grid.raw_dir, b.grid.root)}/`, resumable; "
        f"`--tables-only` rebuilds this section). Grid: `benchmarks/moon/grid-ladder.toml`, tables: "
        "`benchmarks/moon/tables_ladder.py`.", "",
        f"Setting: a seeded subset of Fashion-MNIST (the same for every run: {get(cfg, 'data.train_limit'):,} training "
        f"and {get(cfg, 'data.test_limit'):,} test images), {steps_line(b)}; MOON's simple CNN with its 256-d "
        f"projection head; SGD momentum {get(cfg, 'train.momentum')}, lr {get(cfg, 'train.lr')}, weight decay "
        f"{get(cfg, 'train.weight_decay'):g}; all clients every round; {rounds} rounds at every rung (rungs differ only "
        "in β and the local epochs E); evaluation after every round; seeds "
        f"{b.grid.seeds}; one torch thread per run. FedAvg runs as MOON with μ = 0 (equal to FedAvg) so that the "
        "probe is measured for it. The paper: CIFAR-10/100, Tiny-ImageNet, batch 64, 10 local epochs, 100 rounds; "
        "batch 16 here so that a local epoch is more than a few steps. Reading: `benchmarks/moon/analysis.md`.", "",
        f"Runs: {n_done} of {n_plan} finished; their wall times add up to "
        f"{sum(r['wall_time_s'] for r in done) / 3600:.2f} h (2 workers on a shared 2-core machine).", "",
        "### Final test accuracy (%; after each rung's last round)", "",
        *accuracy_table(b), "",
        "### Paired differences per rung (5 seeds; a claim needs the 95% bootstrap CI to exclude 0 and "
        "paired t p < 0.05)", "",
        *pair_table(b), "",
        "### Rounds to reach the target", "",
        "Target per rung (MOON's Table 2 definition): FedAvg's mean accuracy after the last round at the same rung; "
        "the first round whose accuracy is at or above it.", "",
        *rounds_table(b, rounds), "",
        "### MOON's representation probe per rung", "",
        "After local training each client measures on its first 256 samples the trained model's CE and l_con and "
        "the mean cosines between z (the trained local model's projection output), z_glob (the round's global model) "
        "and z_prev (the client's model after its previous round); data-size-weighted mean over clients, then mean "
        "over seeds (`moon/*` in metrics.jsonl).", "",
        *probe_table(b), "", END,
    ]


def write_section(path: Path, lines: list[str]) -> None:
    old = path.read_text() if path.is_file() else ""
    text = "\n".join(lines)
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + text + rest.split(END, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)


def report(b) -> list[str]:
    lines = section(b)
    if b.params.get("section"):
        write_section(b.grid.root / b.params["section"], lines)
    return lines
