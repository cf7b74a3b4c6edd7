"""Round-by-round trace of one proposed-method run (issue 26: the seed-606 collapse).

Runs the grid's ``digits-niid1`` setting (``grid.toml``: 9 devices, non-IID-1, K^ = K/3, 20
rounds) for one seed with a personalized evaluation every round, and records what the server
saw in every round: per group the scheduled and forced uploaders, the row softmax of Xi
(xi~_kk and the largest off-diagonal), every device's training loss and the norm of its
parameter change, and the devices' classes and modalities. Prints a per-device table and writes
``trace.json`` into the run folder.

    nice -n 19 .venv/bin/python benchmarks/wireless/trace.py --seed 606 [--set KEY=VALUE ...] [--out runs/trace]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's mmfl

SETTING = ["partition={name=\"k_classes\", num_clients=9, k=3}", "rounds=20",
           "algorithm.k_hat=0.3333333333333333", "eval_every=1", "threads=1"]


def accuracies(run_dir: Path) -> dict[int, list[float]]:
    """Every evaluated round's per-device accuracies, from the run's metrics.jsonl."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    key = "client_accuracy" if any("client_accuracy" in r for r in rows) else "personal/client_accuracy"
    return {int(r["round"]): r[key] for r in rows if key in r}


def show(run_dir: Path) -> None:
    """Print a trace: per round the devices' accuracies and the uploaders of every group; the
    coefficients' range; the device worst in the final round, round by round; and the accuracy
    of a device in the round its shared group was just aggregated for it vs the other rounds."""
    import numpy as np

    t = json.loads((run_dir / "trace.json").read_text())
    acc = accuracies(run_dir)
    dev = {int(c): d for c, d in t["devices"].items()}
    K = len(dev)
    rounds = {r["round"] + 1: r for r in t["rounds"]}  # the trace's round index is 0-based, metrics' 1-based
    groups = list(t["rounds"][0]["sched"])
    print("devices: " + "; ".join(f"{c} {'+'.join(d['modalities'])} classes {d['classes']}" for c, d in dev.items()))
    print("round | mean | " + " ".join(f"d{c:<4d}" for c in range(K)) + " | " + " | ".join(f"{g} uploaders" for g in groups)
          + " | xi~ min..max (all groups, all entries)")
    for R in sorted(acc):
        r = rounds.get(R)
        a = acc[R]
        ups = " | ".join(str(r["sched"][g]) for g in groups) if r else ""
        lo = min(min(v.values()) for v in r["xi_self"].values()) if r else float("nan")
        hi = max(max(max(v.values()) for v in r["xi_self"].values()), max(max(v.values()) for v in r["xi_max_other"].values())) if r else float("nan")
        print(f"{R:5d} | {np.mean(a):.3f} | " + " ".join(f"{x:5.2f}" for x in a) + f" | {ups} | "
              f"{min(lo, min(r['xi_min'].values())):.4f}..{hi:.4f}")
    last = max(acc)
    w = int(np.argmin(acc[last]))
    d = dev[w]
    print(f"worst device in round {last}: {w} ({'+'.join(d['modalities'])}, classes {d['classes']}, {d['n']} rows)")
    print("round | acc | train loss | groups aggregated for it this round | shared coefficients it used")
    for R in sorted(rounds):
        r = rounds[R]
        got = [g for g in groups if w in r["sched"][g]]
        co = r.get("coeff", {}).get("shared", {}).get(str(w), r.get("coeff", {}).get("shared", {}).get(w))
        others = ", ".join(f"{j}:{v:.3f} {dev[int(j)]['classes']}" for j, v in co.items()) if co else ""
        print(f"{R:5d} | {acc.get(R, [float('nan')] * K)[w]:.2f} | {r['loss'][str(w)] if str(w) in r['loss'] else r['loss'][w]:.2f} "
              f"| {got} | {others}")
    agg, rest = [], []
    for R, r in rounds.items():
        for c in range(K):
            (agg if c in r["sched"]["shared"] else rest).append(acc[R][c])
    print(f"device accuracy in the round its shared group was just aggregated: {np.mean(agg):.3f} (n = {len(agg)}, "
          f"{sum(x < 0.15 for x in agg)} under 0.15); other rounds: {np.mean(rest):.3f} (n = {len(rest)}, "
          f"{sum(x < 0.15 for x in rest)} under 0.15)")
    tail = sorted(acc)[-6:]  # the last (up to) 6 evaluated rounds
    means = [np.mean(acc[R]) for R in tail]
    print(f"round-mean accuracy, rounds {tail[0]}-{last}: " + ", ".join(f"{m:.3f}" for m in means)
          + f"; std over these rounds {np.std(means):.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int)
    ap.add_argument("--set", action="append", default=[], help="extra config override (KEY=VALUE)")
    ap.add_argument("--out", default="runs/trace", help="parent folder of the run folder")
    ap.add_argument("--name", default=None)
    ap.add_argument("--show", metavar="RUN_DIR", help="print the trace of a finished trace run and run nothing")
    args = ap.parse_args(argv)
    if args.show:
        show(Path(args.show))
        return 0

    import mmfl
    from mmfl.algorithms import pfedwireless as pw
    from mmfl.algorithms.pfedwireless_math import flat, softmax_rows

    log: list[dict] = []
    orig = pw.PFedWirelessServer.aggregate

    def traced(self, rnd, sched, replies):
        xi_before = {g: softmax_rows(self.xi[g]).clone() for g in self.groups}
        out = orig(self, rnd, sched, replies)
        rec = {"round": rnd, "sched": {g: list(map(int, v)) for g, v in sched.items()},
               "loss": {int(c): float(m.scalars["train_loss"]) for c, m in replies.items()},
               "xi_self": {}, "xi_max_other": {}, "xi_min": {}, "coeff": {}, "w_norm": {}}
        for g in self.groups:
            soft = softmax_rows(self.xi[g])
            off = soft.clone().fill_diagonal_(-1.0)
            holders = [c for c in range(self.K) if g in self.groups_of(c)]
            rec["xi_self"][g] = {c: float(soft[c, c]) for c in holders}
            rec["xi_max_other"][g] = {c: float(off[c].max()) for c in holders}
            rec["xi_min"][g] = float(xi_before[g].min())
            co = self.prev_coeff[g]  # eq. 4-5: the coefficients this round's aggregation used
            rec["coeff"][g] = {c: {j: round(float(co[c, j]), 4) for j in range(self.K) if co[c, j] > 0} for c in sched[g]}
        for c in range(self.K):  # the norm of the server's W_k
            rec["w_norm"][c] = float(flat(self.w[c], [k for k in self.w[c] if self.w[c][k].is_floating_point()]).norm())
        log.append(rec)
        return out

    pw.PFedWirelessServer.aggregate = traced
    name = args.name or f"trace-digits-niid1-s{args.seed}"
    res = mmfl.run(ROOT / "mmfl/configs/wireless_digits.toml", progress=False, overwrite=True,
                   set=[*SETTING, f"seed={args.seed}", f"name=\"{name}\"", f"output_dir=\"{args.out}\"", *args.set])
    part = res.partition()  # client x class rows, with the rows holding each modality
    devices = {}
    for c, sub in part.groupby("client"):
        sub = sub[sub["count"] > 0]
        mods = [m for m in sub.columns if m not in ("client", "label", "class", "count") and sub[m].sum() > 0]
        devices[int(c)] = {"classes": sorted(int(x) for x in sub["label"]), "modalities": mods,
                           "n": int(sub["count"].sum())}
    (res.run_dir / "trace.json").write_text(json.dumps({"rounds": log, "devices": devices}, indent=1))
    print(f"{name}: final accuracy {res.rows[-1].get('accuracy')}")
    show(res.run_dir)
    print(f"wrote {res.run_dir / 'trace.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
