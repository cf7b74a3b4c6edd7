"""CreamFL rung (grid.toml group ``rung``): CreamFL against the server alone round by round, paired
by seed, from the runs' ``metrics.jsonl`` (every round is evaluated), finished or not. It reads the
gain along the 32-round schedule, and gives a reading at the last round every run has reached when
the runs were stopped before the end (the rung's table in creamfl.md uses finished runs only).

    .venv/bin/python benchmarks/creamfl/rung_rounds.py                      # rounds 8, 16, 24, 32 and the last common
    .venv/bin/python benchmarks/creamfl/rung_rounds.py --rounds 4 12 --raw-dir DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mmfl.bench import paired  # noqa: E402

KEYS = (("rsum_authors", "R@1_sum"), ("r1_sum", "R@1 i2t+t2i (one gallery)"))


def rows(run: Path) -> dict[int, dict]:
    """``{round: metrics row}`` of one run folder (empty when it has not started)."""
    f = run / "metrics.jsonl"
    if not f.is_file():
        return {}
    out = {}
    for line in f.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            out[int(r["round"])] = r
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--raw-dir", default=str(ROOT / "benchmarks/results/raw/creamfl"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--rounds", type=int, nargs="+", default=[8, 16, 24, 32])
    a = ap.parse_args(argv)
    raw = Path(a.raw_dir)
    cream = {s: rows(raw / f"rung-mfeat-creamfl-s{s}") for s in a.seeds}
    alone = {s: rows(raw / f"rung-mfeat-server_alone-s{s}") for s in a.seeds}
    reached = {s: min(max(cream[s], default=0), max(alone[s], default=0)) for s in a.seeds}
    print("rounds reached (CreamFL, server alone) per seed: "
          + ", ".join(f"s{s}: {max(cream[s], default=0)}, {max(alone[s], default=0)}" for s in a.seeds))
    common = min(reached.values())
    wanted = sorted({r for r in a.rounds if r <= max(reached.values())} | ({common} if common else set()))
    print("| round (of 32) | metric | CreamFL | server alone | mean Δ (paired) | 95% bootstrap CI | "
          "paired t-test p | seeds | here |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in wanted:
        for key, name in KEYS:
            x = {s: cream[s][r][key] for s in a.seeds if r in cream[s] and r in alone[s]}
            z = {s: alone[s][r][key] for s in x}
            if len(x) < 2:
                continue
            v = paired(x, z)
            mx, mz = (sum(d.values()) / len(d) for d in (x, z))
            print(f"| {r} | {name} | {mx:.1f} | {mz:.1f} | {v['delta']:+.1f} | [{v['lo']:+.1f}, {v['hi']:+.1f}] | "
                  f"{v['p']:.3f} | {len(x)} | {v['text'].split(' (')[0]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
