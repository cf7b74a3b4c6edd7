"""Convert a time-series classification set in the `.ts` format (the UEA/UCR archive, as
shipped in aeon's wheel) into an mmfl manifest: one ``.npy`` file ``[channels, time]`` per
sample and modality, and ``manifest.csv`` with ``label``, ``split`` and one column per
modality.

    python examples/own_data/ts_to_manifest.py DIR OUT --modality acc=0,1,2 --modality gyro=3,4,5

``DIR`` holds ``<Name>_TRAIN.ts`` and ``<Name>_TEST.ts`` (e.g. ``aeon/datasets/data/BasicMotions``
of ``pip download --no-deps aeon==1.6.0``, unzipped). ``--modality NAME=CHANNELS`` groups the
dimensions into modalities (default: one modality ``series`` holding all). ``--crop MIN``
cuts each series to a seeded random window of MIN..T steps (variable-length windows of a
longer recording, as a sensor stream is cut in practice); series of unequal length
(``@equalLength false``, e.g. JapaneseVowels) are kept as they are. Only the standard
library and numpy are used.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np


def read_ts(path: Path) -> tuple[list[np.ndarray], list[str]]:
    """A `.ts` file -> (series as float32 ``[dims, T_i]``, labels as written)."""
    series, labels, in_data = [], [], False
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="strict").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not in_data:
            in_data = line.lower() == "@data"
            continue
        *dims, label = line.split(":")
        try:
            rows = [[float(v) for v in d.split(",")] for d in dims]
        except ValueError as e:
            sys.exit(f"ts_to_manifest: {path}: line {n}: {e}")
        if len({len(r) for r in rows}) != 1:
            sys.exit(f"ts_to_manifest: {path}: line {n}: dimensions of unequal length")
        series.append(np.asarray(rows, dtype=np.float32))
        labels.append(label.strip())
    if not series:
        sys.exit(f"ts_to_manifest: {path}: no @data rows")
    return series, labels


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="folder holding <Name>_TRAIN.ts and <Name>_TEST.ts")
    ap.add_argument("out", type=Path, help="output folder (manifest.csv + npy/)")
    ap.add_argument("--modality", action="append", default=[], metavar="NAME=CHANNELS",
                    help="a modality from these 0-based dimensions, e.g. acc=0,1,2 (repeatable)")
    ap.add_argument("--crop", type=int, default=0, metavar="MIN",
                    help="cut each series to a random window of MIN..T steps (0 = keep)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    files = {s: sorted(a.src.glob(f"*_{s.upper()}.ts")) for s in ("train", "test")}
    files = {s: [f for f in fs if not f.stem.endswith("_eq_" + s.upper())] for s, fs in files.items()}
    if not files["train"] or not files["test"]:
        sys.exit(f"ts_to_manifest: {a.src}: no <Name>_TRAIN.ts and <Name>_TEST.ts")
    rng = np.random.default_rng(a.seed)
    groups: dict[str, list[int]] = {}
    for spec in a.modality:
        name, _, chans = spec.partition("=")
        try:
            groups[name.strip()] = [int(c) for c in chans.split(",")]
        except ValueError:
            sys.exit(f"ts_to_manifest: --modality {spec!r}: expected NAME=0,1,2")
    (a.out / "npy").mkdir(parents=True, exist_ok=True)
    rows, lengths = [], []
    for split in ("train", "test"):
        series, labels = read_ts(files[split][0])
        for i, (x, y) in enumerate(zip(series, labels)):
            if a.crop and x.shape[1] > a.crop:
                t = int(rng.integers(a.crop, x.shape[1] + 1))
                s = int(rng.integers(0, x.shape[1] - t + 1))
                x = x[:, s:s + t]
            row = {"label": y, "split": split}
            for name, chans in (groups or {"series": list(range(x.shape[0]))}).items():
                if max(chans) >= x.shape[0]:
                    sys.exit(f"ts_to_manifest: --modality {name}: the series have {x.shape[0]} dimensions")
                rel = f"npy/{split}_{i:05d}_{name}.npy"
                np.save(a.out / rel, np.ascontiguousarray(x[chans]))
                row[name] = rel
            rows.append(row)
            lengths.append(x.shape[1])
    with (a.out / "manifest.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{a.out / 'manifest.csv'}: {len(rows)} rows, modalities {', '.join(k for k in rows[0] if k not in ('label', 'split'))}, "
          f"lengths {min(lengths)}..{max(lengths)}")


if __name__ == "__main__":
    main()
