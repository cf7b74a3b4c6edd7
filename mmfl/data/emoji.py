"""Emoji image-text pairs (npm ``emoji-datasource-google@16.0.0``), as frozen-encoder features.

Registered as ``emoji_pairs``. The package's ``package/emoji.json`` lists 1,911
emoji, each with a ``name`` ("RED APPLE", "Egypt Flag"), ``short_names``
(["apple"]), a ``category`` (10: Smileys & Emotion, People & Body, Component,
Animals & Nature, Food & Drink, Travel & Places, Activities, Objects, Symbols,
Flags), an ``image`` file name under ``package/img/google/64/`` (a 64x64 RGBA
PNG) and, for 323 of them, ``skin_variations`` (1,875 more PNGs).

Each emoji is one image-text pair, paired **per instance** (retrieval between
the modalities is meaningful):

* ``image``: float32 ``[N, d]``, :func:`~mmfl.data.featurize.image_features` of
  the PNG (composited on white; ``image_encoder``, default MobileNetV2 at
  ``image_size`` 96: 1280-d);
* ``text``: float32 ``[N, d]``, :func:`~mmfl.data.featurize.text_features` of
  the lower-cased name (``text = "name"``) or of "name: short, names"
  (``"name+short"``; default encoder MiniLM: 384-d);
* label: the ``category`` (``label = "category"``, 10 classes) or the finer
  ``subcategory`` (``label = "subcategory"``: 99 classes in this package, such as
  "face-smiling", "animal-mammal", "flag"; every subcategory lies within one
  category), classes ordered by first appearance in the Unicode emoji order.

With ``skin_tones = true`` each skin-tone variant is a further pair (text: the
name plus ", medium skin tone" etc.); variants always fall in the split of
their base emoji. The split is **by emoji** and disjoint: a seeded,
label-stratified ``public`` share (``public_fraction``, returned as
``DatasetBundle.public``, CreamFL's public set), a ``test`` share
(``test_fraction``) and the clients' ``train`` set (the rest).

Small classes (some subcategories have 1-3 emoji) are never dropped and always
keep at least one emoji in ``train``: :func:`~mmfl.data.split.stratified_split`
leaves a class of one in ``train``, and gives a class of two or more at least one
``test`` emoji while keeping one back, and the ``public`` share is drawn from
what remains the same way. So a class of 1 is train-only, a class of 2 has one
train and one test emoji (no public one), and a class of 3 one of each (default fractions).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.avmnist import data_dir
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.data.featurize import (check_image_size, image_feature_dim, parse_image_encoder, parse_text_encoder,
                                 text_feature_dim, text_features)
from mmfl.data.featurize_image import image_features
from mmfl.data.split import check_fraction, stratified_split
from mmfl.errors import ConfigError, DataError

EMOJI_NPM = "emoji-datasource-google@16.0.0"
EMOJI_DIRNAME = "emoji-datasource-google-16.0.0"
IMAGE_SUBDIR = Path("img") / "google" / "64"
IMAGE_SIDE = 64
SETUP_HINT = f"run `bash scripts/setup.sh` (it fetches npm's {EMOJI_NPM}) or set data.root"
SKIN_TONES = {"1F3FB": "light skin tone", "1F3FC": "medium-light skin tone", "1F3FD": "medium skin tone",
              "1F3FE": "medium-dark skin tone", "1F3FF": "dark skin tone"}


def emoji_package_dir(root: str = "") -> Path:
    """The folder holding ``emoji.json`` and ``img/google/64/``: ``root`` or its ``package/``;
    empty ``root`` means ``$MMFL_DATA_DIR/emoji-datasource-google-16.0.0``."""
    base = Path(root).expanduser() if root else data_dir() / EMOJI_DIRNAME
    for d in (base / "package", base):
        if (d / "emoji.json").is_file():
            return d
    raise DataError(f"{base}: npm {EMOJI_NPM} not found (no emoji.json or package/emoji.json); {SETUP_HINT}")


@dataclass
class EmojiEntry:
    name: str  # the display name, as in emoji.json
    text: str  # what the text encoder reads
    image: str  # file name under img/google/64/
    category: str
    group: int  # index of the base emoji (skin-tone variants share it)
    sort_order: int
    subcategory: str = ""  # "" where emoji.json has none


def _tone_text(key: str) -> str:
    parts = [SKIN_TONES.get(k.upper(), k.lower()) for k in key.split("-")]
    return ", ".join(parts)


def read_emoji_json(pkg: Path, text: str = "name", skin_tones: bool = False) -> list[EmojiEntry]:
    """The pairs of ``pkg/emoji.json`` in Unicode order (entries without a Google image are skipped)."""
    path = pkg / "emoji.json"
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read emoji.json ({type(e).__name__}: {e})") from None
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON list of emoji objects")
    items = sorted(items, key=lambda x: (x.get("sort_order", 0), str(x.get("unified", ""))))
    out: list[EmojiEntry] = []
    for g, it in enumerate(items):
        try:
            name, image, category = it["name"], it["image"], it["category"]
        except (KeyError, TypeError):
            raise DataError(f"{path}: entry {g} lacks name, image or category") from None
        if not name or not image or not category:
            raise DataError(f"{path}: entry {g} has an empty name, image or category")
        if not it.get("has_img_google", True):
            continue
        base = name.lower()
        if text == "name+short":
            shorts = [s.replace("_", " ") for s in it.get("short_names") or [] if s]
            base = f"{base}: {', '.join(shorts)}" if shorts else base
        order = int(it.get("sort_order", g))
        sub = str(it.get("subcategory") or "")
        out.append(EmojiEntry(name, base, image, category, g, order, sub))
        if skin_tones:
            for key, var in sorted((it.get("skin_variations") or {}).items()):
                if var.get("has_img_google", True) and var.get("image"):
                    out.append(EmojiEntry(f"{name} ({_tone_text(key)})", f"{base}, {_tone_text(key)}",
                                          var["image"], category, g, order, sub))
    if not out:
        raise DataError(f"{path}: no emoji with a Google image")
    return out


def load_pngs(pkg: Path, files: list[str]) -> np.ndarray:
    """uint8 RGBA ``[N, 64, 64, 4]`` of ``pkg/img/google/64/<file>``, decoded once per file set
    (:mod:`mmfl.data.cache`, keyed by names, sizes and modification times)."""
    from PIL import Image, UnidentifiedImageError

    from mmfl.data.audio import stat_fingerprint
    from mmfl.data.cache import cached

    img_dir = pkg / IMAGE_SUBDIR
    paths = [img_dir / f for f in files]
    for p in paths:
        if not p.is_file():
            raise DataError(f"{p}: emoji image not found; {SETUP_HINT}")

    def decode():
        arr = np.empty((len(paths), IMAGE_SIDE, IMAGE_SIDE, 4), dtype=np.uint8)
        for i, p in enumerate(paths):
            try:
                with Image.open(p) as im:
                    im = im.convert("RGBA")
                    if im.size != (IMAGE_SIDE, IMAGE_SIDE):
                        im = im.resize((IMAGE_SIDE, IMAGE_SIDE), Image.BILINEAR)
                    arr[i] = np.asarray(im)
            except (OSError, UnidentifiedImageError) as e:
                raise DataError(f"{p}: cannot read PNG ({type(e).__name__}: {e})") from None
        return {"rgba": torch.from_numpy(arr)}

    settings = {"files": stat_fingerprint(paths, img_dir), "mode": "RGBA", "side": IMAGE_SIDE}
    return cached("emoji-png", [], settings, decode)["rgba"].numpy()


@dataclass
class EmojiPairsParams:
    root: str = field(default="", metadata={
        "help": f"folder holding npm {EMOJI_NPM}'s emoji.json (or package/emoji.json) and img/google/64/ "
                f"(empty = $MMFL_DATA_DIR/{EMOJI_DIRNAME}, MMFL_DATA_DIR defaulting to ~/.cache/mmfl/data)"})
    skin_tones: bool = field(default=False, metadata={
        "help": "also use the skin-tone variants (1,875 more pairs, in their base emoji's split)"})
    text: Literal["name", "name+short"] = field(default="name", metadata={
        "help": "text of a pair: the lower-cased name, or name + ': ' + its short names"})
    label: Literal["category", "subcategory"] = field(default="category", metadata={
        "help": "label of a pair: its category (10 classes) or its subcategory (99 classes, e.g. "
                "'face-smiling'), classes in Unicode emoji order"})
    image_encoder: str = field(default="mobilenet_v2", metadata={
        "help": "frozen image encoder: mobilenet_v2 (1280-d) or pixels:<s> (s*s grey pixels)"})
    image_size: int = field(default=96, metadata={"help": "side the 64x64 PNGs are resized to for "
                                                          "mobilenet_v2 (>= 32)"})
    text_encoder: str = field(default="minilm", metadata={
        "help": "frozen text encoder: minilm (384-d all-MiniLM-L6-v2) or hash[:<d>] (hashed words, 512-d)"})
    public_fraction: float = field(default=0.5, metadata={
        "help": "share of emoji (per class) in the public set (DatasetBundle.public)"})
    test_fraction: float = field(default=0.2, metadata={"help": "share of emoji (per class) in the test set"})
    seed: int = field(default=0, metadata={"help": "seed of the split"})

    def __post_init__(self):
        if self.text not in ("name", "name+short"):
            raise ConfigError(f"data.text: must be 'name' or 'name+short', got {self.text!r}")
        if self.label not in ("category", "subcategory"):
            raise ConfigError(f"data.label: must be 'category' or 'subcategory', got {self.label!r}")
        parse_image_encoder(self.image_encoder, "data.image_encoder")
        parse_text_encoder(self.text_encoder, "data.text_encoder")
        check_image_size(self.image_size, "data.image_size")
        check_fraction(self.public_fraction, "public_fraction")
        check_fraction(self.test_fraction, "test_fraction")
        if self.public_fraction + self.test_fraction >= 1.0:
            raise ConfigError(f"data.public_fraction + data.test_fraction must be < 1 (the rest is the "
                              f"clients' train set), got {self.public_fraction} + {self.test_fraction}")


def split_groups(group_labels: np.ndarray, public_fraction: float, test_fraction: float,
                 seed: int) -> dict[str, np.ndarray]:
    """Disjoint, per-class stratified ``public`` / ``train`` / ``test`` positions of the groups.

    Every class keeps at least one group in ``train``: a class of one group is train-only, a class
    of two gets one test group and no public one (see :func:`~mmfl.data.split.stratified_split`)."""
    rest, test = stratified_split(group_labels, test_fraction, seed)
    share = public_fraction / (1.0 - test_fraction)
    train_pos, public_pos = stratified_split(group_labels[rest], share, seed + 1)
    return {"public": rest[public_pos], "train": rest[train_pos], "test": test}


@DATASETS.register("emoji_pairs", EmojiPairsParams,
                   help="emoji image-text pairs (npm emoji-datasource-google@16.0.0): image [1280] MobileNetV2 + "
                        "text [384] MiniLM features, 10 categories (or 99 subcategories), public/train/test "
                        "split by emoji")
def emoji_pairs(p: EmojiPairsParams) -> DatasetBundle:
    """Emoji pairs: ``image`` and ``text`` feature vectors, label = category or subcategory;
    ``public`` set included."""
    pkg = emoji_package_dir(p.root)
    entries = read_emoji_json(pkg, p.text, p.skin_tones)
    if p.label == "subcategory":
        lacking = next((e for e in entries if not e.subcategory), None)
        if lacking is not None:
            raise DataError(f"{pkg / 'emoji.json'}: emoji {lacking.name!r} has no subcategory "
                            "(data.label = 'subcategory' needs one on every emoji)")
    key = (lambda e: e.subcategory) if p.label == "subcategory" else (lambda e: e.category)
    order: dict[str, int] = {}
    for e in sorted(entries, key=lambda e: e.sort_order):
        order.setdefault(key(e), len(order))
    classes = list(order)
    labels = np.array([order[key(e)] for e in entries], dtype=np.int64)
    groups = np.array([e.group for e in entries], dtype=np.int64)

    img = image_features(load_pngs(pkg, [e.image for e in entries]), p.image_encoder, size=p.image_size)
    txt = text_features([e.text for e in entries], p.text_encoder)

    uniq, first = np.unique(groups, return_index=True)
    parts = split_groups(labels[first], p.public_fraction, p.test_fraction, p.seed)
    splits, names = {}, {}
    for split, gpos in parts.items():
        rows = np.flatnonzero(np.isin(groups, uniq[gpos]))
        r = torch.from_numpy(rows)
        splits[split] = ArrayDataset({"image": img[r].contiguous(), "text": txt[r].contiguous()},
                                     torch.from_numpy(labels[rows]))
        names[split] = [entries[i].name for i in rows]
    meta = DatasetMeta(
        name="emoji_pairs", num_classes=len(classes),
        modalities={"image": (image_feature_dim(p.image_encoder),), "text": (text_feature_dim(p.text_encoder),)},
        class_names=classes,
        info={"pairing": "instance", "source": str(pkg), "package": EMOJI_NPM,
              "encoders": {"image": p.image_encoder, "image_size": p.image_size, "text": p.text_encoder,
                           "text_field": p.text},
              "label": p.label,
              "split": f"by emoji, stratified by {p.label}; skin-tone variants follow their base emoji",
              "sizes": {k: len(v) for k, v in splits.items()}, "names": names},
    )
    return DatasetBundle(train=splits["train"], test=splits["test"], meta=meta, public=splits["public"])
