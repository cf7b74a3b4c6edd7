"""AG_NEWS (Zhang et al. 2015) in its released CSV format: news texts of four classes,
encoded by a frozen text encoder (CreamFL's text clients)."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.errors import ConfigError, DataError
from mmfl.data.captions import _check_counts, _check_encoders, _subset, clean_caption

AG_NEWS_CLASSES = ["World", "Sports", "Business", "Sci/Tech"]  # classes.txt of the release, label = index - 1


@dataclass
class AgNewsParams:
    root: str = field(default="", metadata={
        "help": "(required) folder holding AG_NEWS train.csv and test.csv (class_index,title,description)"})
    max_train: int = field(default=0, metadata={"help": "seeded random subset of train rows (0 = all 120,000)"})
    max_test: int = field(default=0, metadata={"help": "seeded random subset of test rows (0 = all 7,600)"})
    text_encoder: str = field(default="minilm", metadata={
        "help": "frozen text encoder: minilm (384-d all-MiniLM-L6-v2) or hash[:<d>] (hashed words)"})
    seed: int = field(default=0, metadata={"help": "seed of the subsets"})

    def __post_init__(self):
        if not self.root:
            raise ConfigError("data.root: required for ag_news (the folder holding train.csv and test.csv)")
        _check_counts(self, ("max_train", "max_test"))
        _check_encoders(None, self.text_encoder)


def read_ag_news_csv(path: Path) -> tuple[list[str], np.ndarray]:
    """AG_NEWS ``class_index,title,description`` rows (no header; one header line is tolerated) ->
    (``title + " " + description`` with the release's backslash escapes as spaces, labels 0-3)."""
    if not path.is_file():
        raise DataError(f"{path}: AG_NEWS file not found")
    texts, labels = [], []
    try:
        with path.open(newline="", encoding="utf-8") as f:
            for line, row in enumerate(csv.reader(f), 1):
                if not row or not "".join(row).strip():
                    continue
                cls = row[0].strip()
                if not cls.isdigit():
                    if line == 1:
                        continue  # a header such as "Class Index,Title,Description"
                    raise DataError(f"{path}: line {line}: class index must be 1-4, got {cls!r}")
                if len(row) != 3 or not 1 <= int(cls) <= len(AG_NEWS_CLASSES):
                    raise DataError(f"{path}: line {line}: expected 'class_index (1-4),title,description', "
                                    f"got {len(row)} field(s) starting {cls!r}")
                texts.append(clean_caption(f"{row[1]} {row[2]}".replace("\\", " ")))
                labels.append(int(cls) - 1)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: cannot read CSV ({e})") from None
    if not texts:
        raise DataError(f"{path}: no rows")
    return texts, np.asarray(labels, dtype=np.int64)


@DATASETS.register("ag_news", AgNewsParams,
                   help="AG_NEWS from your copy (train.csv/test.csv): text [384] MiniLM features of "
                        "title + description, 4 classes")
def ag_news(p: AgNewsParams) -> DatasetBundle:
    """AG_NEWS: ``text`` float32 ``[N, d]``, 4 classes (World, Sports, Business, Sci/Tech)."""
    from mmfl.data.featurize import text_feature_dim, text_features

    root = Path(p.root).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: AG_NEWS folder not found")
    sets, rows = {}, {}
    for split, limit, seed in (("train", p.max_train, p.seed), ("test", p.max_test, p.seed + 1)):
        texts, labels = read_ag_news_csv(root / f"{split}.csv")
        keep = _subset(len(texts), limit, seed)
        feats = text_features([texts[i] for i in keep], p.text_encoder)
        sets[split] = ArrayDataset({"text": feats}, torch.from_numpy(labels[keep]))
        rows[split] = len(keep)
    meta = DatasetMeta(name="ag_news", num_classes=len(AG_NEWS_CLASSES),
                       modalities={"text": (text_feature_dim(p.text_encoder),)}, class_names=list(AG_NEWS_CLASSES),
                       info={"source": str(root), "rows": rows, "text": "title + ' ' + description",
                             "encoder": {"text": p.text_encoder}})
    return DatasetBundle(train=sets["train"], test=sets["test"], meta=meta, public=sets.get("public"))
