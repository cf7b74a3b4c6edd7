"""MOON paper benchmark on Fashion-MNIST (Tables 1, 2, 3, 4, 5, 11 and the
local-epochs study), scaled to finish in about an hour on 2 CPU cores.

    .venv/bin/python benchmarks/moon/run.py            # full set -> benchmarks/results/moon.md
    .venv/bin/python benchmarks/moon/run.py --quick    # a 1-minute smoke version

Runs go to ``benchmarks/results/raw/moon/<run>/`` (one mmfl run folder each);
a finished run (its summary.json exists) is not run again, so an interrupted
benchmark continues where it stopped. The table is recomputed from those
folders every time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from mmfl.config import apply_overrides, resolve
from mmfl.engine.runner import Experiment
from mmfl.errors import MMFLError
from mmfl.report import load_metrics, rounds_to_reach

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
METHODS = ["moon", "fedavg", "fedprox", "scaffold", "local"]
LABEL = {"moon": "MOON", "fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "local": "SOLO",
         "centralized": "centralized (upper bound)"}

# The scale of every run, chosen so the full set fits in about an hour on 2 cores. Each run uses
# one torch thread: the machine is shared, and two oversubscribed 2-thread torch processes
# ran 5x slower than one.
FULL = dict(train_limit=6000, rounds=15, epochs=2, seeds=[0, 1, 2], betas=[0.1, 0.5, 5.0],
            scal_rounds={50: 20, 100: 40}, epoch_study=[1, 5, 10, 20], epoch_rounds=3, epoch_train_limit=2000,
            l2_mus=[0.01, 0.1, 1.0], t11_rounds=6)
QUICK = dict(train_limit=1000, rounds=2, epochs=1, seeds=[0], betas=[0.5], scal_rounds={20: 2},
             epoch_study=[1, 2], epoch_rounds=1, epoch_train_limit=600, l2_mus=[1.0], t11_rounds=2)

# MOON paper (CIFAR-10 column of Table 1, CIFAR-100 of Tables 3-4) for the ordering comparison.
PAPER_T1 = {"moon": 69.1, "fedavg": 66.3, "fedprox": 66.9, "scaffold": 66.6, "local": 46.3}
PAPER_T4 = {"moon": (64.0, 67.5, 68.0), "fedavg": (62.5, 64.5, 65.7), "fedprox": (62.9, 64.6, 64.9),
            "scaffold": (47.3, 52.5, 55.0), "local": (15.9, 22.3, 26.6)}


def base_config(s: dict) -> dict:
    return {
        "seed": 0, "rounds": s["rounds"], "eval_every": 1, "threads": 1,
        "data": {"name": "fashion_mnist", "train_limit": s["train_limit"]},
        "partition": {"name": "dirichlet", "num_clients": 10, "beta": 0.5},
        "model": {"name": "simple_cnn", "out_dim": 256},
        "algorithm": {"name": "fedavg"},
        "train": {"local_epochs": s["epochs"], "batch_size": 64, "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-5},
    }


def algo_overrides(method: str) -> list[str]:
    return {"moon": ["algorithm.name=moon", "algorithm.mu=1.0", "algorithm.tau=0.5"],
            "fedprox": ["algorithm.name=fedprox", "algorithm.mu=0.01"],
            }.get(method, [f"algorithm.name={method}"])


def plan(s: dict) -> list[tuple[str, list[str]]]:
    """(run name, overrides) of every run of the benchmark."""
    runs = []
    for beta in s["betas"]:  # Tables 1, 2, 4, 11
        for seed in s["seeds"]:
            for m in METHODS:
                ev = [f"eval_every={s['rounds']}"] if m == "local" else []
                runs.append((f"t1-b{beta}-{m}-s{seed}", [*algo_overrides(m), f"partition.beta={beta}",
                                                          f"seed={seed}", *ev]))
    for seed in s["seeds"]:  # upper bound
        runs.append((f"t1-centralized-s{seed}", ["algorithm.name=centralized", f"seed={seed}"]))
    for n, rounds in s["scal_rounds"].items():  # Table 3
        for m in [*METHODS, "moon10"]:
            over = algo_overrides("moon") + ["algorithm.mu=10.0"] if m == "moon10" else algo_overrides(m)
            ev = rounds if m == "local" else max(1, rounds // 6)
            runs.append((f"t3-n{n}-{m}", [*over, f"partition.num_clients={n}", "sample_fraction=0.2",
                                          f"rounds={rounds}", f"eval_every={ev}"]))
    for e in s["epoch_study"]:  # local-epochs study
        for m in ["moon", "fedavg", "fedprox", "scaffold"]:
            runs.append((f"ep-e{e}-{m}", [*algo_overrides(m), f"train.local_epochs={e}",
                                          f"rounds={s['epoch_rounds']}", f"data.train_limit={s['epoch_train_limit']}"]))
    for mu in s["l2_mus"]:  # Table 5
        runs.append((f"t5-l2-mu{mu}", [*algo_overrides("moon"), "algorithm.contrast=l2", f"algorithm.mu={mu}"]))
    for m in ["fedavg", "fedprox", "scaffold", "moon"]:  # Table 11: timing runs, the last ones (quiet machine)
        runs.append((f"t11-{m}", [*algo_overrides(m), f"rounds={s['t11_rounds']}", f"eval_every={s['t11_rounds']}"]))
    return runs


def execute(s: dict, raw_dir: Path, groups: list[str], extra: list[str]) -> None:
    todo = [(n, o) for n, o in plan(s) if not groups or n.split("-")[0] in groups]
    for i, (name, over) in enumerate(todo, 1):
        run_dir = raw_dir / name
        if (run_dir / "summary.json").is_file() or (run_dir / "failed.json").is_file():
            continue
        cfg = resolve(apply_overrides(base_config(s), [*extra, *over, f"name={name}", f"output_dir={raw_dir}"]))
        t0 = time.perf_counter()
        try:
            Experiment(cfg, progress=False).run(overwrite=True)
        except MMFLError as e:  # e.g. a diverged run: record it, report it, go on
            (run_dir / "failed.json").write_text(json.dumps({"error": str(e)}))
            print(f"[{i}/{len(todo)}] {name}: FAILED: {e}", flush=True)
            continue
        print(f"[{i}/{len(todo)}] {name}: {time.perf_counter() - t0:.1f}s", flush=True)


# --- tables ---------------------------------------------------------------------------------
def _final(raw: Path, name: str) -> dict | None:
    p = raw / name / "summary.json"
    return json.loads(p.read_text()) if p.is_file() else None


def _failed(raw: Path, names: list[str]) -> str:
    n = sum((raw / x / "failed.json").is_file() for x in names)
    return f" ({n} of {len(names)} diverged)" if n else ""


def _ms(vals: list[float]) -> str:
    if not vals:
        return "n/a"
    return f"{100 * np.mean(vals):.1f} ± {100 * np.std(vals):.1f}"


def table1(s, raw) -> list[str]:
    out = ["| method | " + " | ".join(f"β = {b}" for b in s["betas"]) + " | paper CIFAR-10 (β=0.5) | paper CIFAR-100 β=0.1/0.5/5 |",
           "|---|" + "---|" * len(s["betas"]) + "---|---|"]
    for m in METHODS:
        cells = []
        for b in s["betas"]:
            accs = [r["final_accuracy"] for seed in s["seeds"] if (r := _final(raw, f"t1-b{b}-{m}-s{seed}"))]
            if m == "local":  # SOLO: mean ± std over parties (each seed's mean, std averaged over seeds)
                stds = [r.get("final_accuracy_std", 0) for seed in s["seeds"] if (r := _final(raw, f"t1-b{b}-{m}-s{seed}"))]
                cells.append(f"{100 * np.mean(accs):.1f} ± {100 * np.mean(stds):.1f}" if accs else "n/a")
            else:
                cells.append(_ms(accs) + _failed(raw, [f"t1-b{b}-{m}-s{seed}" for seed in s["seeds"]]))
        p4 = "/".join(f"{v}" for v in PAPER_T4[m])
        out.append(f"| {LABEL[m]} | " + " | ".join(cells) + f" | {PAPER_T1[m]} | {p4} |")
    cen = [r["final_accuracy"] for seed in s["seeds"] if (r := _final(raw, f"t1-centralized-s{seed}"))]
    out.append(f"| {LABEL['centralized']} | " + " | ".join([_ms(cen)] * len(s["betas"])) + " | – | – |")
    return out


def _mean_curve(raw, names) -> list[dict]:
    curves = [load_metrics(raw / n) for n in names if (raw / n / "summary.json").is_file()]
    if not curves:
        return []
    rounds = min(len(c) for c in curves)
    return [{"round": i + 1, "accuracy": float(np.mean([c[i]["accuracy"] for c in curves]))} for i in range(rounds)]


def table2(s, raw, beta=0.5) -> list[str]:
    curves = {m: _mean_curve(raw, [f"t1-b{beta}-{m}-s{seed}" for seed in s["seeds"]]) for m in METHODS[:4]}
    if not curves["fedavg"]:
        return ["(no FedAvg runs)"]
    target = curves["fedavg"][-1]["accuracy"]
    base = rounds_to_reach(curves["fedavg"], target)
    out = [f"Target: FedAvg's mean accuracy after {s['rounds']} rounds at β = {beta}: {100 * target:.1f}%.", "",
           "| method | #rounds | speedup | paper CIFAR-10 #rounds (speedup) |", "|---|---|---|---|"]
    paper = {"fedavg": "100 (1×)", "fedprox": "52 (1.9×)", "scaffold": "80 (1.3×)", "moon": "27 (3.7×)"}
    for m in ["fedavg", "fedprox", "scaffold", "moon"]:
        r = rounds_to_reach(curves[m], target)
        cell = f"{r} | {base / r:.2f}×" if r else f"not reached in {s['rounds']} | <1×"
        out.append(f"| {LABEL[m]} | {cell} | {paper[m]} |")
    return out


def table3(s, raw) -> list[str]:
    cols = []
    for n, rounds in s["scal_rounds"].items():
        cols += [(n, rounds // 2), (n, rounds)]
    out = ["| method | " + " | ".join(f"{n} clients, {r} rounds" for n, r in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for m in ["moon", "moon10", "fedavg", "fedprox", "scaffold", "local"]:
        cells = []
        for n, r in cols:
            p = raw / f"t3-n{n}-{m}"
            if not (p / "summary.json").is_file():
                cells.append("n/a")
                continue
            rows = [x for x in load_metrics(p) if "accuracy" in x and x["round"] <= r]
            if m == "local":
                last = rows[-1] if rows and rows[-1]["round"] == r else None
                cells.append(f"{100 * last['accuracy']:.1f} ± {100 * last['accuracy_std']:.1f}" if last else "–")
            else:
                cells.append(f"{100 * rows[-1]['accuracy']:.1f}" if rows else "–")
        label = "MOON (μ=10)" if m == "moon10" else ("MOON (μ=1)" if m == "moon" else LABEL[m])
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def epoch_table(s, raw) -> list[str]:
    out = ["| method | " + " | ".join(f"E = {e}" for e in s["epoch_study"]) + " |",
           "|---|" + "---|" * len(s["epoch_study"])]
    for m in ["moon", "fedavg", "fedprox", "scaffold"]:
        cells = [f"{100 * r['final_accuracy']:.1f}" if (r := _final(raw, f"ep-e{e}-{m}")) else "n/a"
                 for e in s["epoch_study"]]
        out.append(f"| {LABEL[m]} | " + " | ".join(cells) + " |")
    return out


def table5(s, raw, beta=0.5) -> list[str]:
    fa = [r["final_accuracy"] for seed in s["seeds"] if (r := _final(raw, f"t1-b{beta}-fedavg-s{seed}"))]
    mo = [r["final_accuracy"] for seed in s["seeds"] if (r := _final(raw, f"t1-b{beta}-moon-s{seed}"))]
    l2 = {mu: r["final_accuracy"] for mu in s["l2_mus"] if (r := _final(raw, f"t5-l2-mu{mu}"))}
    out = ["| second term | accuracy (β = 0.5) | paper CIFAR-10 |", "|---|---|---|",
           f"| none (FedAvg) | {_ms(fa)} | 66.3 |"]
    for mu, a in l2.items():
        out.append(f"| ℓ2 norm, μ = {mu} (seed 0) | {100 * a:.1f} | 65.8 (best μ) |")
    out.append(f"| MOON | {_ms(mo)} | 69.1 |")
    return out


def table11(s, raw) -> list[str]:
    out = ["| method | s / round (median of rounds 2..) | relative to FedAvg | paper CIFAR-10 |", "|---|---|---|---|"]
    paper = {"fedavg": "330 s", "fedprox": "340 s", "scaffold": "332 s", "moon": "337 s"}
    times = {}
    for m in ["fedavg", "fedprox", "scaffold", "moon"]:
        p = raw / f"t11-{m}"
        rows = load_metrics(p)[1:] if (p / "summary.json").is_file() else []
        times[m] = float(np.median([r["train_time_s"] for r in rows])) if rows else float("nan")
    for m, t in times.items():
        out.append(f"| {LABEL[m]} | {t:.2f} | {t / times['fedavg']:.2f}× | {paper[m]} |")
    return out


def write_report(s, raw, path: Path, elapsed: float | None, quick: bool) -> None:
    cmd = ".venv/bin/python benchmarks/moon/run.py" + (" --quick" if quick else "") + "".join(
        f" --group {g}" for g in s.get("groups", [])) + (
        " --betas " + " ".join(map(str, s["betas"])) if s["betas"] != FULL["betas"] and not quick else "") + "".join(f" --set {e}" for e in s.get("extra", [])) + (
        f" --tag {s['tag']}" if s.get("tag") else "")
    lines = [
        "# MOON benchmark on Fashion-MNIST", "",
        f"Regenerate: `{cmd}` (runs in `benchmarks/results/raw/`, resumable; tables recomputed from them).", "",
        "## Setting", "",
        f"Fashion-MNIST (Debian `dataset-fashion-mnist`), a seeded random subset of {s['train_limit']:,} training images, "
        "the full 10,000-image test set; MOON's simple CNN with its 2-layer projection head (out_dim 256); "
        f"10 clients, Dirichlet(β) label skew (MOON/NIID-Bench partitioner, min 10 samples per client); "
        f"{s['rounds']} rounds of {s['epochs']} local epochs; SGD lr 0.01, momentum 0.9, weight decay 1e-5, batch 64; "
        + (f"overrides for every run: {', '.join(s['extra'])}; " if s.get("extra") else "") +
        f"MOON μ = 1, τ = 0.5; FedProx μ = 0.01; seeds {s['seeds']}; one torch thread per run. "
        "The paper uses CIFAR-10/100 and Tiny-ImageNet (not available offline here), 100 rounds and 10 local epochs: "
        "compare orderings, not absolute values.", "",
    ]
    if elapsed is not None:
        lines += [f"Cost: the runs' wall times add up to {elapsed / 60:.1f} min on this machine (2 CPU cores), "
                  "measured while other jobs were also running on it, so it is an upper bound.", ""]
    sections = {
        "t1": [["## Table 1 and 4: top-1 test accuracy (%), mean ± std over seeds", "",
                "SOLO: mean ± std over the 10 parties (std averaged over seeds), as in the paper.", ""],
               table1(s, raw),
               ["", "## Table 2: rounds to reach FedAvg's final accuracy (β = 0.5, mean curve over seeds)", ""],
               table2(s, raw)],
        "t3": [["", "## Table 3: more clients, 20% sampled per round (β = 0.5, seed 0)", ""], table3(s, raw)],
        "ep": [["", f"## Local epochs (β = 0.5, seed 0, {s['epoch_rounds']} rounds, "
                    f"{s['epoch_train_limit']:,} training images)", ""], epoch_table(s, raw)],
        "t5": [["", "## Table 5: the second term of the local objective (β = 0.5)", ""], table5(s, raw)],
        "t11": [["", "## Table 11: training time per round", "",
                 f"β = 0.5, seed 0, {s['t11_rounds']} rounds; local training + aggregation, no evaluation; "
                 "dedicated runs executed one after another at the end of the benchmark. Other jobs were running "
                 "on the machine at the same time, so the ratios are approximate.", ""], table11(s, raw)],
    }
    for group, parts in sections.items():
        if not s.get("groups") or group in s["groups"]:
            for part in parts:
                lines += part
    lines += ["", "## Comparison with the paper", "", "<!-- analysis -->", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.is_file() else ""
    if "<!-- analysis -->" in old:  # keep the hand-written analysis below the marker
        lines[-2:] = ["<!-- analysis -->", old.split("<!-- analysis -->", 1)[1].strip("\n"), ""]
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny smoke version (about a minute)")
    ap.add_argument("--raw", type=Path, help="folder of the runs (default benchmarks/results/raw/moon[-quick])")
    ap.add_argument("--out", type=Path, help="the Markdown table (default benchmarks/results/moon[-quick].md)")
    ap.add_argument("--tables-only", action="store_true", help="do not run; rebuild the tables from finished runs")
    ap.add_argument("--group", action="append", default=[], choices=["t1", "t3", "ep", "t5", "t11"],
                    help="run only these groups of runs (repeatable; default all)")
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                    help="an override applied to every run (e.g. train.lr=0.05); use with --tag")
    ap.add_argument("--betas", type=float, nargs="+", help="only these Dirichlet betas (default 0.1 0.5 5)")
    ap.add_argument("--tag", default="", help="suffix of the raw folder and the table file (moon-<tag>.md)")
    args = ap.parse_args(argv)
    s = dict(QUICK if args.quick else FULL)
    if args.betas:
        s["betas"] = args.betas
    suffix = ("-quick" if args.quick else "") + (f"-{args.tag}" if args.tag else "")
    raw = args.raw or ROOT / "benchmarks" / "results" / "raw" / f"moon{suffix}"
    out = args.out or ROOT / "benchmarks" / "results" / f"moon{suffix}.md"
    if not args.tables_only:
        execute(s, raw, args.group, args.extra)
    # the benchmark is resumable, so its cost is the sum of its runs' wall times
    done = [r for name, _ in plan(s) if (r := _final(raw, name))]
    s = {**s, "extra": args.extra, "groups": args.group, "tag": args.tag}
    elapsed = sum(r["wall_time_s"] for r in done) if done else None
    write_report(s, raw, out, elapsed, args.quick)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
