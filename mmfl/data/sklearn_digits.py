"""scikit-learn's bundled digits: 1,797 8x8 images of handwritten digits, 10 classes.

Modality ``"image"``: float32 ``[N, 1, 8, 8]`` in [0, 1] (stored values 0-16
divided by 16); labels int64 ``[N]``; a seeded stratified train/test split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.split import check_fraction, stratified_split
from mmfl.errors import DataError


@dataclass
class DigitsParams:
    test_fraction: float = field(default=0.2, metadata={"help": "share of each class in the test split"})
    seed: int = field(default=0, metadata={"help": "seed of the stratified split"})

    def __post_init__(self):
        check_fraction(self.test_fraction)


@DATASETS.register("digits", DigitsParams, help="scikit-learn digits: 1,797 images [1,8,8], 10 classes")
def digits(p: DigitsParams) -> DatasetBundle:
    """sklearn digits: image ``[N, 1, 8, 8]`` in [0, 1], 10 classes."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise DataError(f"digits: scikit-learn is not installed ({e}); pip install scikit-learn") from None
    raw = load_digits()
    x = torch.from_numpy((raw.images / 16.0).astype(np.float32)[:, None])
    labels = np.asarray(raw.target, dtype=np.int64)
    tr_idx, te_idx = stratified_split(labels, p.test_fraction, p.seed)
    y = torch.from_numpy(labels)
    tr, te = torch.from_numpy(tr_idx), torch.from_numpy(te_idx)
    meta = DatasetMeta(name="digits", num_classes=10, modalities={"image": (1, 8, 8)},
                       class_names=[str(i) for i in range(10)], info={"source": "sklearn.datasets.load_digits"})
    return DatasetBundle(train=ArrayDataset({"image": x[tr]}, y[tr]),
                         test=ArrayDataset({"image": x[te]}, y[te]), meta=meta)
