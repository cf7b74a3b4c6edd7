"""UPMC Food-101 (Wang et al. 2015, "Recipe recognition with large multimodal food dataset"), read
from its released layout.

Registered as ``food101``. Nothing is downloaded: ``root`` (required) points at the user's copy::

    <root>/texts/train_titles.csv          rows: image file name, text, class (no header)
    <root>/texts/test_titles.csv           e.g. apple_pie_0.jpg,"Apple Pie Recipe | ...",apple_pie
    <root>/images/train/<class>/<file>     e.g. images/train/apple_pie/apple_pie_0.jpg
    <root>/images/test/<class>/<file>

Each row is one image-text pair of a web page about a dish (``pairing == "instance"``),
labelled by its class (101 dishes: ``apple_pie`` ... ``waffles``, the class names of
the train CSV in sorted order, which is the folder order). The CSV is read with
Python's ``csv`` module: the first field is the image file, the last the class, and
the fields between them are the text (joined with "," should an unquoted comma have
split it). A first line whose first field has no "." (a file name always has an
extension) is taken as a header and skipped.

Images and texts go through the frozen encoders of :mod:`mmfl.data.featurize` exactly
like the caption sets of :mod:`mmfl.data.captions`: each image is read with Pillow,
converted to RGB and scaled to fill an ``image_size`` square (shorter side bilinear,
centre crop), then ``image_encoder`` (default MobileNetV2, 1280-d); the text (whitespace
collapsed, its first ``max_words`` words) goes through ``text_encoder`` (default
all-MiniLM-L6-v2, 384-d). Features are cached (:mod:`mmfl.data.cache`) by the settings,
the CSV's content and the image files' names, sizes and modification times.

The split is the released one; ``max_train`` / ``max_test`` take seeded subsets
stratified by class. A row whose image is missing is an error, or is left out (and
counted in ``meta.info["skipped_missing_images"]``) with ``skip_missing_images``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.captions import (IMAGE_BATCH, FrozenEncoderParams, _check_counts, _check_encoders, clean_caption,
                                read_image)
from mmfl.errors import ConfigError, DataError

FOOD101_VERSION = 1  # bump when the code changes what the loader returns
SPLITS = ("train", "test")


@dataclass
class Food101Params(FrozenEncoderParams):
    root: str = field(default="", metadata={
        "help": "(required) UPMC Food-101 folder holding texts/{train,test}_titles.csv and "
                "images/{train,test}/<class>/"})
    max_train: int = field(default=0, metadata={
        "help": "seeded subset of this many train pairs, stratified by class (0 = all)"})
    max_test: int = field(default=0, metadata={
        "help": "seeded subset of this many test pairs, stratified by class (0 = all)"})
    max_words: int = field(default=0, metadata={
        "help": "encode the first this many words of each text (0 = all; MiniLM reads at most 256 word pieces)"})
    skip_missing_images: bool = field(default=False, metadata={
        "help": "leave out rows whose image file is missing (counted in meta.info) instead of failing"})
    seed: int = field(default=0, metadata={"help": "seed of the subsets"})

    def __post_init__(self):
        if not self.root:
            raise ConfigError("data.root: required for food101 (the UPMC Food-101 folder holding texts/ and images/)")
        _check_counts(self, ("max_train", "max_test", "max_words"))
        _check_encoders(self.image_encoder, self.text_encoder, self.image_size)


def _bad_name(name: str) -> bool:
    return not name or name in (".", "..") or "/" in name or "\\" in name


def read_food101_csv(path: Path) -> tuple[list[str], list[str], list[str], bool]:
    """A released ``<split>_titles.csv`` -> (image file names, texts, class names, header skipped),
    rows in file order; blank lines are ignored. Texts have their whitespace collapsed."""
    if not path.is_file():
        raise DataError(f"{path}: UPMC Food-101 text file not found (expected <root>/texts/{path.name})")
    files, texts, classes, header = [], [], [], False
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))  # page texts can exceed the 128 KiB default
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # a byte-order mark is tolerated
            for line, row in enumerate(csv.reader(f), 1):
                if not row or not "".join(row).strip():
                    continue
                name = row[0].strip()
                if line == 1 and "." not in name:
                    header = True  # e.g. "image_path,text,food"
                    continue
                if len(row) < 3:
                    raise DataError(f"{path}: line {line}: expected 'image file,text,class', got {len(row)} "
                                    f"field(s) starting {name[:40]!r}")
                cls = row[-1].strip()
                if _bad_name(name) or _bad_name(cls):
                    raise DataError(f"{path}: line {line}: expected an image file name and a class name "
                                    f"(no '/'), got {name[:40]!r} and {cls[:40]!r}")
                files.append(name)
                texts.append(clean_caption(",".join(row[1:-1])))
                classes.append(cls)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: cannot read CSV ({type(e).__name__}: {e})") from None
    if not files:
        raise DataError(f"{path}: no rows")
    return files, texts, classes, header


def _stratified_subset(labels: np.ndarray, k: int, seed: int, split: str) -> np.ndarray:
    from mmfl.data.avmnist import stratified_subset

    return stratified_subset(labels, k, np.random.default_rng([seed, SPLITS.index(split)]))


def _encode(split: str, paths: list[Path], texts: list[str], p: Food101Params, root: Path,
            csv_path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(image features ``[n, d_i]``, text features ``[n, d_t]``), cached by the settings, the CSV's
    content, the image files' stats and the texts."""
    from mmfl.data.audio import stat_fingerprint
    from mmfl.data.cache import cached
    from mmfl.data.featurize import image_feature_dim, text_features, texts_digest
    from mmfl.data.featurize_image import image_features

    def compute():
        feats = []
        for s in range(0, len(paths), IMAGE_BATCH):
            batch = np.stack([read_image(path, p.image_size) for path in paths[s:s + IMAGE_BATCH]])
            feats.append(image_features(batch, p.image_encoder, size=p.image_size, cache=False))
        img = torch.cat(feats) if feats else torch.zeros(0, image_feature_dim(p.image_encoder))
        return {"image": img, "text": text_features(texts, p.text_encoder, cache=False)}

    settings = {"loader": "food101", "split": split, "image_encoder": p.image_encoder,
                "text_encoder": p.text_encoder, "image_size": p.image_size,
                "fit": "shorter side bilinear + centre crop", "max_words": p.max_words,
                "images": stat_fingerprint(paths, root), "n": len(paths), "texts": texts_digest(texts)}
    out = cached("food101", [csv_path], settings, compute, version=FOOD101_VERSION)
    return out["image"], out["text"]


@DATASETS.register("food101", Food101Params,
                   help="UPMC Food-101 from your copy (texts/*_titles.csv + images/<split>/<class>/): "
                        "image [1280] MobileNetV2 + text [384] MiniLM features, 101 classes")
def food101(p: Food101Params) -> DatasetBundle:
    """UPMC Food-101: ``image`` ``[N, d_i]`` + ``text`` ``[N, d_t]`` per web page, labels = dish."""
    from mmfl.data.featurize import image_feature_dim, text_feature_dim

    root = Path(p.root).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: UPMC Food-101 folder not found")
    rows = {}
    for split in SPLITS:
        csv_path = root / "texts" / f"{split}_titles.csv"
        rows[split] = (csv_path, *read_food101_csv(csv_path))
    classes = sorted(set(rows["train"][3]))
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted(set(rows["test"][3]) - set(classes))
    if unknown:
        raise DataError(f"{rows['test'][0]}: class {unknown[0]!r} does not occur in {rows['train'][0].name} "
                        f"({len(unknown)} such class(es))")
    sets, files, skipped, headers = {}, {}, {}, {}
    for split, limit in (("train", p.max_train), ("test", p.max_test)):
        csv_path, names, texts, cls, headers[split] = rows[split]
        img_dir = root / "images" / split
        if not img_dir.is_dir():
            raise DataError(f"{img_dir}: image folder of split {split} not found (expected "
                            f"<root>/images/{split}/<class>/<file>)")
        paths = [img_dir / c / n for c, n in zip(cls, names)]
        present = np.array([path.is_file() for path in paths])
        if not present.all() and not p.skip_missing_images:
            first = paths[int(np.flatnonzero(~present)[0])]
            raise DataError(f"{first}: image file not found ({int((~present).sum())} of {len(paths)} {split} "
                            "images missing; set data.skip_missing_images = true to leave those rows out)")
        skipped[split] = int((~present).sum())
        kept = np.flatnonzero(present)
        if not len(kept):
            raise DataError(f"{img_dir}: none of the {len(paths)} images of {csv_path.name} exist")
        labels = np.array([index[cls[i]] for i in kept], dtype=np.int64)
        pick = _stratified_subset(labels, limit, p.seed, split)
        kept, labels = kept[pick], labels[pick]
        words = [texts[i] for i in kept]
        if p.max_words:
            words = [" ".join(t.split()[:p.max_words]) for t in words]
        img, txt = _encode(split, [paths[i] for i in kept], words, p, root, csv_path)
        sets[split] = ArrayDataset({"image": img, "text": txt}, torch.from_numpy(labels))
        files[split] = [f"{cls[i]}/{names[i]}" for i in kept]
    meta = DatasetMeta(
        name="food101", num_classes=len(classes),
        modalities={"image": (image_feature_dim(p.image_encoder),), "text": (text_feature_dim(p.text_encoder),)},
        class_names=classes,
        info={"source": str(root), "pairing": "instance", "split": "released (texts/<split>_titles.csv)",
              "rows": {s: len(ds) for s, ds in sets.items()}, "files": files,
              "skipped_missing_images": skipped, "header_skipped": headers,
              "text": "the CSV's text field, whitespace collapsed"
                      + (f", first {p.max_words} words" if p.max_words else ""),
              "encoder": {"image": p.image_encoder, "image_size": p.image_size, "text": p.text_encoder}})
    return DatasetBundle(train=sets["train"], test=sets["test"], meta=meta)
