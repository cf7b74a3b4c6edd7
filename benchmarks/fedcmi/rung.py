"""One rung toward FedCMI's regime (issue 26): the weak-modality claim of Fig. 3 (FedCMI lifts
the weak modality's own accuracy above MFedAvg's) on the benchmark's mfeat case-A setting, with
twice the rounds of the committed grid (20 instead of 10), 5 seeds, a paired test.

The runs are Table 1's ``t1-mf-A-{mfedavg,fedcmi}`` configs of ``grid.toml`` (every value the
grid gives them) with ``rounds`` and ``eval_every`` raised; nothing else changes. The report
(``benchmarks/results/fedcmi_rung.md``) gives, per seed and over seeds, the feature view's
accuracy (``accuracy/features``, the weak modality on mfeat) and the joint accuracy, and the
paired difference FedCMI − MFedAvg (95% bootstrap CI and ``scipy.stats.ttest_rel`` via
``mmfl.sweep.paired_verdict``) next to the committed 10-round grid's (read from its runs when
they are there).

    nice -n 19 .venv/bin/python benchmarks/fedcmi/rung.py                 # run what is missing, write the report
    nice -n 19 .venv/bin/python benchmarks/fedcmi/rung.py --rounds 30     # another rung
    .venv/bin/python benchmarks/fedcmi/rung.py --tables-only              # rebuild the report
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's mmfl

METHODS = {"mfedavg": "MFedAvg", "fedcmi": "FedCMI"}
SETTING = "mf-A"
WEAK = "accuracy/features"


def base_raw(method: str) -> dict:
    """The raw config ``grid.toml`` gives Table 1's run of ``method`` in ``mf-A`` (seed 0)."""
    from mmfl.bench.gridfile import load_grid

    grid = load_grid(HERE / "grid.toml")
    for r in grid.runs(["t1"], [0]):
        if r.name == f"t1-{SETTING}-{method}-s0":
            return r.raw
    raise SystemExit(f"rung.py: grid.toml has no run t1-{SETTING}-{method}-s0")


def final(run_dir: Path) -> dict | None:
    p = run_dir / "metrics.jsonl"
    if not (run_dir / "summary.json").is_file() or not p.is_file():
        return None
    rows = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "accuracy" in r]
    return rows[-1] if rows else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, nargs="+", default=[20], help="one rung per value (10 = the grid's)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--tables-only", action="store_true")
    ap.add_argument("--raw-dir", default=str(ROOT / "benchmarks/results/raw/fedcmi_rung"))
    ap.add_argument("--report", default=str(ROOT / "benchmarks/results/fedcmi_rung.md"))
    args = ap.parse_args(argv)
    raw_dir = Path(args.raw_dir)
    names = {(r, m, s): f"rung-r{r}-{SETTING}-{m}-s{s}" for r in args.rounds for m in METHODS for s in args.seeds}
    if not args.tables_only:
        import mmfl

        for (rounds, m, s), name in names.items():
            if final(raw_dir / name) is not None:
                continue
            t0 = time.time()
            mmfl.run(base_raw(m), progress=False, overwrite=True,
                     set={"seed": s, "rounds": rounds, "eval_every": rounds, "name": name,
                          "output_dir": str(raw_dir)})
            print(f"{name}: {time.time() - t0:.0f}s", flush=True)
    from mmfl.sweep import machine, paired_verdict

    def cell(vals):
        import numpy as np
        return f"{100 * np.mean(vals):.1f} ± {100 * np.std(vals):.1f}" if vals else "—"

    out = ["# FedCMI: one rung toward the paper (the weak modality, mfeat case A)", "",
           f"Regenerate: `nice -n 19 .venv/bin/python benchmarks/fedcmi/rung.py --rounds {' '.join(map(str, args.rounds))}` "
           "(finished runs are reused; `--tables-only` rebuilds this file).", "",
           f"Table 1's `t1-{SETTING}-mfedavg` / `t1-{SETTING}-fedcmi` configs of `benchmarks/fedcmi/grid.toml` "
           f"(mfeat pair: image + features, 10 clients, 5 per round, case A) with {' and '.join(map(str, args.rounds))} "
           f"rounds (the grid: 10); seeds {args.seeds}. Machine: {machine()}.", "",
           "| reading | MFedAvg | FedCMI | FedCMI − MFedAvg (paired) | 95% bootstrap CI | paired t p | seeds | verdict |",
           "|---|---|---|---|---|---|---|---|"]
    for rounds in args.rounds:
        label = f"{rounds} rounds" + (" (the grid's)" if rounds == 10 else "")
        where = lambda m, s: raw_dir / names[rounds, m, s]  # noqa: E731
        for key, what in ((WEAK, "features (weak)"), ("accuracy", "joint")):
            got = {m: {s: r.get(key) for s in args.seeds if (r := final(where(m, s))) is not None} for m in METHODS}
            seeds = [s for s in args.seeds if got["mfedavg"].get(s) is not None and got["fedcmi"].get(s) is not None]
            if not seeds:
                out.append(f"| {label}: {what} | — | — | not run here | | | 0 | |")
                continue
            a = [got["fedcmi"][s] for s in seeds]
            b = [got["mfedavg"][s] for s in seeds]
            v = paired_verdict(a, b, 100.0)
            word = v["text"].split(" (")[0] if len(seeds) >= 5 else f"not claimed ({len(seeds)} seeds)"
            out.append(f"| {label}: {what} | {cell(b)} | {cell(a)} | {v['delta']:+.1f} | "
                       f"[{v['lo']:+.1f}, {v['hi']:+.1f}] | {v['p']:.3g} | {len(seeds)} | {word} |")
            if key == WEAK:
                out.append(f"| {label}: per seed, FedCMI − MFedAvg (features) | | | "
                           + ", ".join(f"s{s} {100 * (x - y):+.1f}" for s, x, y in zip(seeds, a, b)) + " | | | | |")
    out += ["", "A claim holds when the 95% bootstrap CI of the mean per-seed difference lies above 0 and the "
            "paired t-test gives p < 0.05 (`mmfl.sweep.paired_verdict`); with fewer than 5 seeds nothing is claimed.",
            ""]
    Path(args.report).write_text("\n".join(out))
    print(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
