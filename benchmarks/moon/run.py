"""MOON paper benchmark on Fashion-MNIST (Tables 1 and 2, SCAFFOLD's conventions, MOON's
representation probe), on the full training set, 5 seeds, paired comparisons.

    .venv/bin/python benchmarks/moon/run.py                # everything -> benchmarks/results/moon.md
    .venv/bin/python benchmarks/moon/run.py --quick        # a few-minute smoke version (moon-quick.md)
    .venv/bin/python benchmarks/moon/run.py --tables-only  # rebuild the report from finished runs

Groups (every run: full Fashion-MNIST, 60,000 train / 10,000 test images, MOON's simple CNN with
its projection head, 10 clients with Dirichlet(beta) label skew, 1 local epoch (94 steps per
client on average), batch 64, SGD momentum 0.9, lr 0.01, weight decay 1e-5, seeds 0-4, one
torch thread, clients trained batched):

- ``t1``: MOON's Table 1 at beta = 0.5, 10 rounds: MOON (mu 1, tau 0.5), FedAvg and SCAFFOLD
  (its defaults) with every seed; MOON with mu 5, FedProx (mu 0.01), SOLO and the centralized
  upper bound (the pooled data, 10 epochs) as context, seeds 0 and 1 only (the machine's
  budget). FedAvg runs as ``moon`` with mu = 0, which equals FedAvg
  (tests/test_algorithms.py::test_moon_with_mu_zero_equals_fedavg), so MOON's representation
  probe (``moon/*`` metrics) is measured for it too.
- ``lin``: the ``sc`` comparison on multinomial logistic regression (a convex model), plain
  SGD at lr 0.1 and 0.01: FedAvg, SCAFFOLD and SCAFFOLD with line 17 uniform.
- ``sc``: SCAFFOLD against FedAvg at beta = 0.1, 15 rounds (issue 13's setting): the default
  (correction in the gradient, option II's K for momentum, line 17 weighted like the model
  average) and variants that change one of these (line 17 uniform; K as printed), the
  convention before issue 13 (after the step, K as printed, line 17 uniform); and with plain
  SGD at lr 0.1, where the correction conventions and the K's coincide.

Runs go to ``benchmarks/results/raw/moon[-quick]/<run>/`` (resumable: a run whose summary.json
or failed.txt exists is not run again; delete a failed.txt to retry; a diverged run counts as
diverged in the tables). Orderings are claimed from paired differences over seeds (same seed = same
partition, initial model and batches): a 95% bootstrap interval of the mean difference and a
paired t-test; "a > b" only when the interval excludes 0 and p < 0.05. A diverged run
(non-finite model) counts as 10%, chance on the balanced test set.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from pathlib import Path

import numpy as np

from mmfl.report import load_metrics, rounds_to_reach
from mmfl.sweep import machine, run_missing

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

FULL = dict(train_limit=0, seeds=[0, 1, 2, 3, 4], context_seeds=[0, 1], t1_beta=0.5, t1_rounds=10, sc_beta=0.1, sc_rounds=15,
            epochs=1, probe_rounds=[2, 5, 10])
QUICK = dict(train_limit=3000, seeds=[0, 1], context_seeds=[0], t1_beta=0.5, t1_rounds=3, sc_beta=0.1, sc_rounds=3,
             epochs=1, probe_rounds=[2, 3])

# name -> (label, overrides)
T1 = {
    "moon": ("MOON (μ = 1)", {"algorithm": {"name": "moon", "mu": 1.0, "tau": 0.5}}),
    "moon5": ("MOON (μ = 5)", {"algorithm": {"name": "moon", "mu": 5.0, "tau": 0.5}}),
    "fedavg": ("FedAvg", {"algorithm": {"name": "moon", "mu": 0.0}}),
    "fedprox": ("FedProx (μ = 0.01)", {"algorithm": {"name": "fedprox", "mu": 0.01}}),
    "scaffold": ("SCAFFOLD", {"algorithm": {"name": "scaffold"}}),
    "local": ("SOLO", {"algorithm": {"name": "local"}}),
}
CONTEXT = ("moon5", "fedprox", "local")  # with the centralized bound: context rows, run for context_seeds only
SGD = {"train": {"momentum": 0.0, "lr": 0.1}}
SC = {
    "fedavg": ("FedAvg", "momentum 0.9, lr 0.01", {"algorithm": {"name": "fedavg"}}),
    "scaffold": ("SCAFFOLD, default", "momentum 0.9, lr 0.01", {"algorithm": {"name": "scaffold"}}),
    "scaffold-uniform": ("SCAFFOLD, default but line 17 uniform", "momentum 0.9, lr 0.01",
                         {"algorithm": {"name": "scaffold", "variate_weights": "uniform"}}),
    "scaffold-printed": ("SCAFFOLD, default but option II's K as printed", "momentum 0.9, lr 0.01",
                         {"algorithm": {"name": "scaffold", "option2": "printed"}}),
    "scaffold-after": ("SCAFFOLD before issue 13 (after the step, K as printed, line 17 uniform)",
                       "momentum 0.9, lr 0.01",
                       {"algorithm": {"name": "scaffold", "correction": "after_step", "option2": "printed",
                                      "variate_weights": "uniform"}}),
    "fedavg-sgd": ("FedAvg", "plain SGD, lr 0.1", {"algorithm": {"name": "fedavg"}, **SGD}),
    "scaffold-sgd": ("SCAFFOLD, default", "plain SGD, lr 0.1", {"algorithm": {"name": "scaffold"}, **SGD}),
    "scaffold-sgd-uniform": ("SCAFFOLD, default but line 17 uniform", "plain SGD, lr 0.1",
                             {"algorithm": {"name": "scaffold", "variate_weights": "uniform"}, **SGD}),
}
# the same comparison on a convex model (multinomial logistic regression) at two step sizes:
# K lr (the length of the local path the constant correction is applied over) 10x apart
LIN_MODEL = {"model": {"name": "mlp", "hidden": []}}
LIN = {}
for _lr in (0.1, 0.01):
    _opt = {"train": {"momentum": 0.0, "lr": _lr}}
    LIN[f"fedavg-lr{_lr}"] = ("FedAvg", f"plain SGD, lr {_lr}", {"algorithm": {"name": "fedavg"}, **_opt})
    LIN[f"scaffold-lr{_lr}"] = ("SCAFFOLD, default", f"plain SGD, lr {_lr}", {"algorithm": {"name": "scaffold"}, **_opt})
    LIN[f"scaffold-uniform-lr{_lr}"] = ("SCAFFOLD, line 17 uniform", f"plain SGD, lr {_lr}",
                                        {"algorithm": {"name": "scaffold", "variate_weights": "uniform"}, **_opt})
LIN_PAIRS = [(f"{m}-lr{lr}", f"fedavg-lr{lr}") for lr in (0.1, 0.01) for m in ("scaffold", "scaffold-uniform")] + \
    [(f"scaffold-lr{lr}", f"scaffold-uniform-lr{lr}") for lr in (0.1, 0.01)]
SC_PAIRS = [("scaffold", "fedavg"), ("scaffold-uniform", "fedavg"), ("scaffold-printed", "fedavg"),
            ("scaffold-after", "fedavg"), ("scaffold", "scaffold-uniform"), ("scaffold-sgd", "fedavg-sgd"),
            ("scaffold-sgd-uniform", "fedavg-sgd")]
T1_PAIRS = [("moon", "fedavg"), ("moon5", "fedavg"), ("fedprox", "fedavg"), ("scaffold", "fedavg"),
            ("moon", "fedprox"), ("moon", "scaffold"), ("moon", "moon5"), ("fedavg", "local")]
PROBE = [("moon/ce", "CE"), ("moon/con", "l_con"), ("moon/cos_glob", "cos(z, z_glob)"),
         ("moon/cos_prev", "cos(z, z_prev)"), ("moon/cos_glob_prev", "cos(z_glob, z_prev)")]


def merge(a: dict, b: dict) -> dict:
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def base_raw(s: dict, beta: float, rounds: int, seed: int) -> dict:
    return {
        "seed": seed, "rounds": rounds, "eval_every": 1, "threads": 1, "batch_clients": True,
        "data": {"name": "fashion_mnist", "train_limit": s["train_limit"]},
        "partition": {"name": "dirichlet", "num_clients": 10, "beta": beta},
        "model": {"name": "simple_cnn", "out_dim": 256},
        "algorithm": {"name": "fedavg"},
        "train": {"local_epochs": s["epochs"], "batch_size": 64, "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-5},
    }


def plan(s: dict, groups: list[str]) -> list[tuple[str, dict]]:
    """Every run, in the order they are run: the (cheap) logistic regression group, the core runs
    seed by seed, then the context rows (so an interrupted benchmark has whole seeds)."""
    want = lambda g: not groups or g in groups  # noqa: E731
    core, lin, context = [], [], []
    for seed in s["seeds"]:
        base = base_raw(s, s["t1_beta"], s["t1_rounds"], seed)
        if want("t1"):
            for m, (_, over) in T1.items():
                raw = merge(base, over)
                if m == "local":
                    raw["eval_every"] = s["t1_rounds"]
                if m not in CONTEXT:
                    core.append((f"t1-{m}-s{seed}", raw))
                elif seed in s["context_seeds"]:
                    context.append((f"t1-{m}-s{seed}", raw))
            if seed in s["context_seeds"]:  # centralized: one pooled client, rounds x 1 epoch
                context.append((f"t1-centralized-s{seed}", merge(base, {"algorithm": {"name": "centralized"},
                                                                        "eval_every": s["t1_rounds"]})))
        if want("sc"):
            sc_base = base_raw(s, s["sc_beta"], s["sc_rounds"], seed)
            for m, (_, _, over) in SC.items():
                core.append((f"sc-{m}-s{seed}", merge(sc_base, over)))
        if want("lin"):
            lin_base = merge(base_raw(s, s["sc_beta"], s["sc_rounds"], seed), LIN_MODEL)
            for m, (_, _, over) in LIN.items():
                lin.append((f"lin-{m}-s{seed}", merge(lin_base, over)))
    return lin + core + context


# ----------------------------------------------------------------------------- statistics

def paired(a: list[float], b: list[float]) -> dict:
    """Paired comparison over seeds of ``a`` against ``b`` (same order), by
    :func:`mmfl.sweep.paired_verdict` (95% bootstrap interval of the mean difference and the
    paired t-test): "a > b" / "a < b" when both exclude 0, else "no ordering"."""
    from mmfl.sweep import paired_verdict

    v = paired_verdict(a, b)
    claim = "a > b" if v["text"].startswith("holds") else "a < b" if "reversed" in v["text"] else "no ordering"
    return {"mean": v["delta"], "lo": v["lo"], "hi": v["hi"], "p": v["p"], "claim": claim, "n": v["n"]}


# ----------------------------------------------------------------------------- results

def _summary(raw: Path, name: str) -> dict | None:
    p = raw / name / "summary.json"
    return json.loads(p.read_text()) if p.is_file() else None


def finals(raw: Path, prefix: str, seeds: list[int]) -> dict[int, float | None]:
    """Final accuracy per seed; None for a failed (diverged) run, missing seeds left out."""
    out = {}
    for seed in seeds:
        r = _summary(raw, f"{prefix}-s{seed}")
        if r is not None:
            out[seed] = r["final_accuracy"]
        elif (raw / f"{prefix}-s{seed}" / "failed.txt").is_file():
            out[seed] = None
    return out


def _cell(vals: dict[int, float | None]) -> str:
    ok = [v for v in vals.values() if v is not None]
    failed = sum(v is None for v in vals.values())
    txt = f"{100 * np.mean(ok):.1f} ± {100 * np.std(ok):.1f}" if ok else "–"
    return txt + (f" ({failed} of {len(vals)} diverged)" if failed else "") + \
        (f" [{len(ok)} seed{'s' * (len(ok) != 1)}]" if ok else "")


def _pair_row(label_a: str, label_b: str, a: dict, b: dict) -> str:
    """One paired comparison; a diverged run (None) counts as chance, 10% (its model is non-finite)."""
    seeds = sorted(k for k in a if k in b)
    if len(seeds) < 2:
        return f"| {label_a} − {label_b} | n/a ({len(seeds)} paired seed{'s' * (len(seeds) != 1)}) | | | |"
    div = sum(a[k] is None for k in seeds) + sum(b[k] is None for k in seeds)
    r = paired([100 * (a[k] if a[k] is not None else CHANCE) for k in seeds],
               [100 * (b[k] if b[k] is not None else CHANCE) for k in seeds])
    claim = {"a > b": f"**{label_a} > {label_b}**", "a < b": f"**{label_a} < {label_b}**"}.get(r["claim"], "no ordering")
    if r["n"] < MIN_SEEDS_FOR_CLAIM:  # the project's rule: orderings from 5 paired seeds
        claim = "not claimed"
    note = f"; {div} diverged run{'s' * (div != 1)} counted as 10%" if div else ""
    p = "–" if math.isnan(r["p"]) else f"{r['p']:.3f}"
    return (f"| {label_a} − {label_b} | {r['mean']:+.2f} | [{r['lo']:+.2f}, {r['hi']:+.2f}] | "
            f"{p} | {claim} ({r['n']} seeds{note}) |")


MIN_SEEDS_FOR_CLAIM = 5
CHANCE = 0.10  # accuracy of a diverged run's non-finite model on the 10 balanced classes
PAIR_HEAD = ["| difference (points) | mean | 95% bootstrap CI | paired t p | claim |", "|---|---|---|---|---|"]


def table1(s, raw) -> list[str]:
    vals = {m: finals(raw, f"t1-{m}", s["seeds"]) for m in T1}
    cen = finals(raw, "t1-centralized", s["seeds"])
    out = [f"| method | accuracy after {s['t1_rounds']} rounds (%) |", "|---|---|"]
    for m, (label, _) in T1.items():
        if m == "local":  # SOLO: each seed's mean over the parties; std over seeds
            stds = [r.get("final_accuracy_std", 0) for seed in s["seeds"] if (r := _summary(raw, f"t1-local-s{seed}"))]
            extra = f"; std over parties {100 * np.mean(stds):.1f}" if stds else ""
            out.append(f"| {label} (mean over parties) | {_cell(vals[m])}{extra} |")
        else:
            out.append(f"| {label} | {_cell(vals[m])} |")
    out.append(f"| centralized ({s['t1_rounds']} epochs of the pooled data) | {_cell(cen)} |")
    out += ["", *PAIR_HEAD]
    for a, b in T1_PAIRS:
        out.append(_pair_row(T1[a][0], T1[b][0], vals[a], vals[b]))
    return out


def _mean_curve(raw, names) -> list[dict]:
    curves = [load_metrics(raw / n) for n in names if (raw / n / "summary.json").is_file()]
    if not curves:
        return []
    rounds = min(len(c) for c in curves)
    return [{"round": i + 1, "accuracy": float(np.mean([c[i]["accuracy"] for c in curves]))} for i in range(rounds)]


def table2(s, raw) -> list[str]:
    curves = {m: _mean_curve(raw, [f"t1-{m}-s{seed}" for seed in s["seeds"]]) for m in T1 if m != "local"}
    if not curves["fedavg"]:
        return ["(no FedAvg runs)"]
    target = curves["fedavg"][-1]["accuracy"]
    base = rounds_to_reach(curves["fedavg"], target)
    out = [f"Target: FedAvg's mean accuracy after {s['t1_rounds']} rounds: {100 * target:.1f}%. "
           "Mean curve over seeds.", "", "| method | rounds to reach | speedup | accuracy per round (mean over seeds, %) |",
           "|---|---|---|---|"]
    for m, c in curves.items():
        r = rounds_to_reach(c, target)
        cell = f"{r} | {base / r:.2f}×" if r else f"not reached in {s['t1_rounds']} | <1×"
        curve = ", ".join(f"{100 * x['accuracy']:.1f}" for x in c)
        out.append(f"| {T1[m][0]} | {cell} | {curve} |")
    return out


def _variant_table(s, raw, prefix: str, table: dict, pairs: list, label) -> list[str]:
    """Final accuracy of each variant of ``table`` (runs ``<prefix>-<name>-s<seed>``) and the
    paired differences of ``pairs``, each side named by ``label(name)``."""
    vals = {m: finals(raw, f"{prefix}-{m}", s["seeds"]) for m in table}
    out = [f"| method | optimizer | accuracy after {s['sc_rounds']} rounds (%) |", "|---|---|---|"]
    for m, (name, opt, _) in table.items():
        out.append(f"| {name} | {opt} | {_cell(vals[m])} |")
    out += ["", *PAIR_HEAD]
    for a, b in pairs:
        out.append(_pair_row(label(a, True), label(b, False), vals[a], vals[b]))
    return out


def table_sc(s, raw) -> list[str]:
    return _variant_table(s, raw, "sc", SC, SC_PAIRS,
                          lambda m, _: "FedAvg" if m.startswith("fedavg") else f"SCAFFOLD [{m}]")


def table_lin(s, raw) -> list[str]:
    return _variant_table(s, raw, "lin", LIN, LIN_PAIRS,
                          lambda m, first: f"{LIN[m][0]} ({LIN[m][1]})" if first else LIN[m][0])


def table_probe(s, raw) -> list[str]:
    """MOON's probe (mean over seeds and over clients, data-size weighted) at some rounds."""
    out = ["| method | round | accuracy | " + " | ".join(label for _, label in PROBE) + " |",
           "|---|---|---|" + "---|" * len(PROBE)]
    for m in ("fedavg", "moon", "moon5"):
        runs = [load_metrics(raw / f"t1-{m}-s{seed}") for seed in s["seeds"]
                if (raw / f"t1-{m}-s{seed}" / "summary.json").is_file()]
        if not runs:
            continue
        for rnd in s["probe_rounds"]:
            rows = [r[rnd - 1] for r in runs if len(r) >= rnd]
            cells = []
            for key, _ in PROBE:
                v = [row[key] for row in rows if key in row]
                cells.append(f"{np.mean(v):.3f}" if v else "–")
            acc = 100 * np.mean([row["accuracy"] for row in rows])
            out.append(f"| {T1[m][0]} | {rnd} | {acc:.1f} | " + " | ".join(cells) + " |")
    return out


def write_report(s, raw, path: Path, quick: bool) -> None:
    done = [r for name, _ in plan(s, []) if (r := _summary(raw, name))]
    lines = [
        "# MOON benchmark on Fashion-MNIST", "",
        f"Regenerate: `.venv/bin/python benchmarks/moon/run.py{' --quick' if quick else ''}` "
        "(runs in `benchmarks/results/raw/`, resumable; tables recomputed from them).", "",
        "## Setting", "",
        f"Fashion-MNIST (Debian `dataset-fashion-mnist`), "
        + ("all 60,000 training images" if not s["train_limit"] else f"a seeded subset of {s['train_limit']:,} training images")
        + ", the 10,000 test images; MOON's simple CNN with its 2-layer projection head (out_dim 256); 10 clients, "
        "Dirichlet(β) label skew (MOON/NIID-Bench partitioner); "
        f"{s['epochs']} local epoch per round (about 94 steps per client at 60,000 images); SGD momentum 0.9, lr 0.01, "
        f"weight decay 1e-5, batch 64; seeds {s['seeds']}; one torch thread per run; clients trained batched "
        "(equal to sequential training within float tolerance). The paper uses CIFAR-10/100 and Tiny-ImageNet, "
        "100 rounds of 10 local epochs: compare orderings, not absolute values.", "",
        "Orderings: paired over seeds (the same seed gives both methods the same partition, initial model and "
        "batch order); a claim is made only when the 95% bootstrap interval of the mean difference excludes 0 "
        "and the paired t-test gives p < 0.05.", "",
        f"Machine: {machine()}. Cost: the finished runs' wall times add up to "
        f"{sum(r['wall_time_s'] for r in done) / 3600:.2f} h (the machine was shared, so this is an upper bound).", "",
        f"## Table 1: top-1 test accuracy, β = {s['t1_beta']}, {s['t1_rounds']} rounds", "",
        *table1(s, raw), "",
        f"## Table 2: rounds to reach FedAvg's final accuracy (β = {s['t1_beta']})", "",
        *table2(s, raw), "",
        f"## SCAFFOLD's correction (β = {s['sc_beta']}, {s['sc_rounds']} rounds)", "",
        *table_sc(s, raw), "",
        f"## SCAFFOLD on a convex model: multinomial logistic regression (β = {s['sc_beta']}, {s['sc_rounds']} rounds)", "",
        "The same setting with `model.name = \"mlp\"`, `hidden = []` (a linear model on the 784 pixels), plain SGD.", "",
        *table_lin(s, raw), "",
        f"## MOON's representation probe (β = {s['t1_beta']})", "",
        "After local training each client measures, on its first 256 samples, the trained model's CE and l_con "
        "and the mean cosines between z (the trained local model's projection output), z_glob (the round's global "
        "model) and z_prev (the client's model after its previous round); data-size-weighted mean over clients, then "
        "mean over seeds (`moon/*` in metrics.jsonl). In round 1 there is no previous model.", "",
        *table_probe(s, raw), "",
        "## Reading", "", "<!-- analysis -->", "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.is_file() else ""
    if "<!-- analysis -->" in old:  # keep the hand-written reading below the marker
        lines[-2:] = ["<!-- analysis -->", old.split("<!-- analysis -->", 1)[1].strip("\n"), ""]
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke version (3,000 images, 2 seeds, 3 rounds)")
    ap.add_argument("--tables-only", action="store_true", help="do not run; rebuild the report from finished runs")
    ap.add_argument("--group", action="append", default=[], choices=["t1", "sc", "lin"], help="run only these groups")
    ap.add_argument("--seeds", type=int, nargs="+", help="only these seeds (default 0-4)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes, one torch thread each")
    args = ap.parse_args(argv)
    s = dict(QUICK if args.quick else FULL)
    suffix = "-quick" if args.quick else ""
    raw = ROOT / "benchmarks" / "results" / "raw" / f"moon{suffix}"
    out = ROOT / "benchmarks" / "results" / f"moon{suffix}.md"
    if not args.tables_only:
        run_s = dict(s, seeds=args.seeds or s["seeds"])
        runs = plan(run_s, args.group)
        # a diverged run (failed.txt: SCAFFOLD's printed option II with momentum) counts as done
        run_missing("moon", runs, raw, args.workers, [runs[0][1]] if runs else [],
                    done=lambda name, r: (raw / name / "summary.json").is_file() or (raw / name / "failed.txt").is_file())
    write_report(s, raw, out, args.quick)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
