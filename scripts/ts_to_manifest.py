"""Convert time series in the sktime/aeon ``.ts`` text format into an mmfl manifest folder.

    python scripts/ts_to_manifest.py TRAIN.ts TEST.ts OUT [--modality acc=0-2 --modality gyro=3-5]

Each sample's channels go to one ``.npy`` file per modality (float32 ``[C, T_i]``; lengths may
differ between samples), and ``OUT/manifest.csv`` gets a row per sample: label, one column per
modality, and split (train for the first file, test for the second). Without ``--modality``
all channels form one modality ``series``. ``--crop MIN`` cuts each recording to a seeded
random window of MIN..T steps (variable-length windows of a longer stream, the way sensor
streams are cut in practice). Read by ``[data] name = "manifest"`` with
``max_length`` set when the lengths vary (see docs/data.md).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np


def read_ts(path: Path) -> list[tuple[np.ndarray, str]]:
    """A ``.ts`` file -> [(float32 [C, T], label)]; channels are ``:``-separated, values ``,``-separated."""
    out, in_data = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not in_data:
            in_data = line.lower() == "@data"
            continue
        *chans, label = line.split(":")
        out.append((np.array([[float(v) for v in c.split(",")] for c in chans], dtype=np.float32), label.strip()))
    if not out:
        raise SystemExit(f"{path}: no @data rows")
    return out


def parse_modality(spec: str) -> tuple[str, list[int]]:
    name, _, rng = spec.partition("=")
    lo, _, hi = rng.partition("-")
    return name, list(range(int(lo), int(hi or lo) + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("train", type=Path)
    ap.add_argument("test", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--modality", action="append", default=[], help="name=first-last channel (0-based)")
    ap.add_argument("--crop", type=int, default=0, metavar="MIN",
                    help="cut each recording to a random window of MIN..T steps (0 = keep it whole)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --crop windows")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    mods = [parse_modality(s) for s in a.modality]
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for split, path in (("train", a.train), ("test", a.test)):
        for i, (x, label) in enumerate(read_ts(path)):
            row = {"label": label}
            if a.crop and x.shape[1] > a.crop:  # one window per recording, shared by its modalities
                t = int(rng.integers(a.crop, x.shape[1] + 1))
                start = int(rng.integers(0, x.shape[1] - t + 1))
                x = x[:, start:start + t]
            for name, chans in mods or [("series", list(range(len(x))))]:
                f = f"{split}/{name}_{i:05d}.npy"
                (a.out / split).mkdir(exist_ok=True)
                np.save(a.out / f, x[chans])
                row[name] = f
            rows.append({**row, "split": split})
    with open(a.out / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{a.out / 'manifest.csv'}: {len(rows)} rows")


if __name__ == "__main__":
    main()
