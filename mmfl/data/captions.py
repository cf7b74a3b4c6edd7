"""Image-caption pairs (MS-COCO captions, Flickr30k) and AG_NEWS, read from released files.

Registered as ``coco_captions``, ``flickr30k`` and ``ag_news``. Nothing is
downloaded: ``root`` (required) points at the user's copy in its released layout.

The framework holds tensors, so images and texts go through the frozen
encoders of :mod:`mmfl.data.featurize` (``image_encoder``, default MobileNetV2,
1280-d; ``text_encoder``, default all-MiniLM-L6-v2, 384-d). Images are read with
Pillow, converted to RGB and scaled to fill an ``image_size`` square (shorter side
resized, centre crop) before encoding.

Caption sets (``coco_captions``, ``flickr30k``): **one sample per caption**, the
caption's ``text`` features paired with its image's ``image`` features (the
image row repeated for each of its captions), ``pairing == "instance"``. Each
split lists its images in a fixed order (COCO: by image id; Flickr30k: file
order) and their captions consecutively, so ``meta.info["image_index"][split]``
(int64 ``[N]``: the image's position in the split) gives the pairs that
:func:`mmfl.core.retrieval.pairs_to_retrieval` turns into the
(images, captions, caption -> image) form :func:`~mmfl.core.retrieval.evaluate_retrieval`
takes; a 5,000-image test split (COCO val2017, or ``max_test_images = 5000``)
gets the 1K / 5K protocols. There are no classes: every label is 0
(``num_classes`` 1), so only label-free partitioners (``iid``, ...) make sense.

Encoded features are cached (:mod:`mmfl.data.cache`) by the settings, the
annotation file's content and the image files' names, sizes and modification times.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mmfl.data import DATASETS
from mmfl.data.base import ArrayDataset, DatasetBundle, DatasetMeta
from mmfl.errors import ConfigError, DataError

IMAGE_BATCH = 256  # images decoded (and encoded) per step: bounds memory at 256 x S x S x 3 bytes
CAPTIONS_VERSION = 1  # bump when the code changes what the caption loaders return


def _check_encoders(image_encoder: str | None, text_encoder: str, image_size: int | None = None) -> None:
    from mmfl.data.featurize import check_image_size, parse_image_encoder, parse_text_encoder

    if image_encoder is not None:
        parse_image_encoder(image_encoder, "data.image_encoder")
    parse_text_encoder(text_encoder, "data.text_encoder")
    if image_size is not None:
        check_image_size(image_size, "data.image_size")


def _check_counts(p, keys) -> None:
    for key in keys:
        if getattr(p, key) < 0:
            raise ConfigError(f"data.{key}: must be >= 0 (0 = all), got {getattr(p, key)}")


def clean_caption(text: str) -> str:
    """Whitespace collapsed, ends stripped."""
    return " ".join(str(text).split())


def read_json(path: Path, what: str) -> object:
    if not path.is_file():
        raise DataError(f"{path}: {what} not found")
    try:
        with path.open(encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DataError(f"{path}: cannot parse JSON ({e})") from None


def read_image(path: Path, size: int) -> np.ndarray:
    """RGB uint8 ``[size, size, 3]``: shorter side scaled to ``size`` (bilinear), centre crop."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if not path.is_file():
        raise DataError(f"{path}: image file not found")
    try:
        with Image.open(path) as img:
            img = ImageOps.fit(img.convert("RGB"), (size, size), Image.BILINEAR)
            return np.asarray(img, dtype=np.uint8)
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise DataError(f"{path}: cannot read the image ({e})") from None


def _subset(n: int, k: int, seed: int) -> np.ndarray:
    """Sorted positions of a seeded random subset of ``k`` of ``n`` (all when k is 0 or >= n)."""
    if k == 0 or k >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))


def _encode_split(name: str, paths: list[Path], captions: list[list[str]], p, source: Path,
                  ann_files: list[Path]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(image features ``[n_images, d_i]``, text features ``[n_captions, d_t]``, image index ``[n_captions]``),
    captions flattened image by image; cached by settings, annotation contents and image file stats."""
    from mmfl.data.audio import stat_fingerprint
    from mmfl.data.cache import cached
    from mmfl.data.featurize import image_feature_dim, text_features, texts_digest
    from mmfl.data.featurize_image import image_features

    for path in paths:
        if not path.is_file():
            raise DataError(f"{path}: image file not found")
    texts = [c for cs in captions for c in cs]
    index = torch.repeat_interleave(torch.arange(len(captions)), torch.tensor([len(cs) for cs in captions],
                                                                              dtype=torch.long))

    def compute():
        feats = []
        for s in range(0, len(paths), IMAGE_BATCH):
            batch = np.stack([read_image(path, p.image_size) for path in paths[s:s + IMAGE_BATCH]])
            feats.append(image_features(batch, p.image_encoder, size=p.image_size, cache=False))
        img = torch.cat(feats) if feats else torch.zeros(0, image_feature_dim(p.image_encoder))
        return {"image": img, "text": text_features(texts, p.text_encoder, cache=False)}

    settings = {"loader": name, "image_encoder": p.image_encoder, "text_encoder": p.text_encoder,
                "image_size": p.image_size, "fit": "shorter side bilinear + centre crop",
                "images": stat_fingerprint(paths, source), "n_images": len(paths),
                "captions": [len(cs) for cs in captions],
                "texts": texts_digest(texts)}
    out = cached(f"captions-{name}", ann_files, settings, compute, version=CAPTIONS_VERSION)
    return out["image"], out["text"], index


def _pair_bundle(name: str, splits: dict, p, info: dict) -> DatasetBundle:
    """``splits[s] = (image feats, text feats, image index, file names)`` -> a pair bundle."""
    from mmfl.data.featurize import image_feature_dim, text_feature_dim

    splits = dict(splits)
    if getattr(p, "public_images", 0):  # a seeded subset of the train images and all their captions
        img, txt, idx, names = splits["train"]
        if p.public_images >= len(names):
            raise DataError(f"data.public_images: {p.public_images} of {len(names)} train images would leave "
                            "the clients none")
        chosen = torch.from_numpy(_subset(len(names), p.public_images, p.seed + 2))
        is_pub = torch.zeros(len(names), dtype=torch.bool)
        is_pub[chosen] = True
        for part, keep in (("public", is_pub), ("train", ~is_pub)):
            imgs = torch.nonzero(keep).flatten()  # kept images, in order; captions follow them
            new = torch.full((len(names),), -1, dtype=torch.long)
            new[imgs] = torch.arange(imgs.numel())
            rows = keep[idx]
            splits[part] = (img[imgs], txt[rows], new[idx[rows]], [names[i] for i in imgs.tolist()])
    sets, index, files = {}, {}, {}
    for s, (img, txt, idx, names) in splits.items():
        sets[s] = ArrayDataset({"image": img[idx].contiguous(), "text": txt},
                               torch.zeros(idx.numel(), dtype=torch.int64))
        index[s], files[s] = idx, names
    meta = DatasetMeta(
        name=name, num_classes=1,
        modalities={"image": (image_feature_dim(p.image_encoder),), "text": (text_feature_dim(p.text_encoder),)},
        class_names=["pair"],
        info={**info, "pairing": "instance",
              "image_index": index,  # int64 [N] per split: the image (position in image_files) of each row
              "image_files": files,
              "images": {s: len(f) for s, f in files.items()},
              "captions": {s: int(i.numel()) for s, i in index.items()},
              "encoder": {"image": p.image_encoder, "image_size": p.image_size, "text": p.text_encoder},
              "labels": "none: every label is 0 (pairs, not classes)"})
    return DatasetBundle(train=sets["train"], test=sets["test"], meta=meta, public=sets.get("public"))


# ----------------------------------------------------------------------------- MS-COCO captions

@dataclass
class FrozenEncoderParams:
    """The frozen encoders an image-text loader puts its files through (captions, food101)."""

    image_encoder: str = field(default="mobilenet_v2", metadata={
        "help": "frozen image encoder: mobilenet_v2 (1280-d, ImageNet) or pixels:<s> (s*s grey pixels)"})
    image_size: int = field(default=224, metadata={
        "help": "images are scaled to fill this square (centre crop) before encoding (>= 32)"})
    text_encoder: str = field(default="minilm", metadata={
        "help": "frozen text encoder: minilm (384-d all-MiniLM-L6-v2) or hash[:<d>] (hashed words)"})


@dataclass
class _PairParams(FrozenEncoderParams):
    """What every caption-pair loader takes besides its own layout keys."""

    max_images: int = field(default=0, metadata={
        "help": "seeded random subset of this many train images (0 = all)"})
    max_test_images: int = field(default=0, metadata={
        "help": "seeded random subset of this many test images (0 = all)"})
    captions_per_image: int = field(default=5, metadata={
        "help": "keep the first this many captions of each image (0 = all; COCO has 5-7)"})
    seed: int = field(default=0, metadata={"help": "seed of the image subsets"})
    public_images: int = field(default=0, metadata={
        "help": "move a seeded subset of this many train images, with their captions, into the public "
                "set (CreamFL's public pairs; 0 = no public set)"})

    def check_pairs(self) -> None:
        _check_counts(self, ("max_images", "max_test_images", "captions_per_image", "public_images"))
        _check_encoders(self.image_encoder, self.text_encoder, self.image_size)


@dataclass
class CocoCaptionsParams(_PairParams):
    root: str = field(default="", metadata={
        "help": "(required) COCO folder holding annotations/captions_<split>.json and <split>/ image folders"})
    split_train: str = field(default="train2017", metadata={
        "help": "train split: reads annotations/captions_<name>.json and images from <name>/"})
    split_test: str = field(default="val2017", metadata={
        "help": "test split (val2017 has 5,000 images: the 1K/5K retrieval protocols)"})

    def __post_init__(self):
        if not self.root:
            raise ConfigError("data.root: required for coco_captions (the folder holding annotations/ "
                              "and the image folders)")
        for key in ("split_train", "split_test"):
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", getattr(self, key) or ""):
                raise ConfigError(f"data.{key}: must be a split name such as train2017, got {getattr(self, key)!r}")
        self.check_pairs()


def read_coco_captions(path: Path, captions_per_image: int) -> tuple[list[int], list[str], list[list[str]], int]:
    """A released ``captions_<split>.json`` -> (image ids sorted, file names, captions per image,
    images without captions), captions in file order, the first ``captions_per_image`` (0 = all) kept."""
    data = read_json(path, "COCO captions file")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) \
            or not isinstance(data.get("annotations"), list):
        raise DataError(f"{path}: expected a COCO captions file (an object with 'images' and 'annotations' lists)")
    files: dict[int, str] = {}
    for i, im in enumerate(data["images"]):
        if not isinstance(im, dict) or not isinstance(im.get("id"), int) or not isinstance(im.get("file_name"), str):
            raise DataError(f"{path}: images[{i}]: expected {{'id': int, 'file_name': str}}")
        files[im["id"]] = im["file_name"]
    caps: dict[int, list[str]] = {k: [] for k in files}
    for i, a in enumerate(data["annotations"]):
        if not isinstance(a, dict) or not isinstance(a.get("image_id"), int) or not isinstance(a.get("caption"), str):
            raise DataError(f"{path}: annotations[{i}]: expected {{'image_id': int, 'caption': str}}")
        if a["image_id"] not in caps:
            raise DataError(f"{path}: annotations[{i}]: image_id {a['image_id']} is not in 'images'")
        text = clean_caption(a["caption"])
        if text:
            caps[a["image_id"]].append(text)
    ids = sorted(k for k in files if caps[k])
    k = captions_per_image or None
    return ids, [files[i] for i in ids], [caps[i][:k] for i in ids], len(files) - len(ids)


@DATASETS.register("coco_captions", CocoCaptionsParams,
                   help="MS-COCO captions from your copy: image-caption pairs through frozen encoders "
                        "(image [1280] MobileNetV2, text [384] MiniLM), one sample per caption")
def coco_captions(p: CocoCaptionsParams) -> DatasetBundle:
    """COCO caption pairs: ``image`` ``[N, d_i]`` + ``text`` ``[N, d_t]``, label 0, image of each row in
    ``meta.info["image_index"]``."""
    root = Path(p.root).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: COCO folder not found")
    splits, skipped, anns = {}, {}, {}
    for split, name, limit, seed in (("train", p.split_train, p.max_images, p.seed),
                                     ("test", p.split_test, p.max_test_images, p.seed + 1)):
        ann = root / "annotations" / f"captions_{name}.json"
        ids, names, caps, skipped[split] = read_coco_captions(ann, p.captions_per_image)
        if not ids:
            raise DataError(f"{ann}: no images with captions")
        keep = _subset(len(ids), limit, seed)
        names, caps = [names[i] for i in keep], [caps[i] for i in keep]
        img_dir = root / name
        if not img_dir.is_dir():
            raise DataError(f"{img_dir}: image folder of split {name} not found")
        img, txt, idx = _encode_split("coco", [img_dir / n for n in names], caps, p, root, [ann])
        splits[split] = (img, txt, idx, names)
        anns[split] = str(ann)
    return _pair_bundle("coco_captions", splits, p, {
        "source": str(root), "annotations": anns, "splits": {"train": p.split_train, "test": p.split_test},
        "images_without_captions": skipped, "order": "images by id, their captions in file order"})


# ----------------------------------------------------------------------------- Flickr30k (Karpathy split)

@dataclass
class Flickr30kParams(_PairParams):
    root: str = field(default="", metadata={
        "help": "(required) folder holding the Karpathy-split JSON and the image folder"})
    json_file: str = field(default="dataset_flickr30k.json", metadata={
        "help": "Karpathy-split JSON in root ({'images': [{'filename', 'split', 'sentences': [{'raw'}]}]})"})
    images_dir: str = field(default="flickr30k-images", metadata={"help": "image folder in root"})
    split_train: str = field(default="train", metadata={
        "help": "Karpathy split(s) for training, '+'-joined (e.g. train+val)"})
    split_test: str = field(default="test", metadata={"help": "Karpathy split(s) for testing (1,000 images)"})

    def __post_init__(self):
        if not self.root:
            raise ConfigError("data.root: required for flickr30k (the folder holding "
                              f"{self.json_file} and {self.images_dir}/)")
        for key in ("split_train", "split_test"):
            if not all(self.split_names(getattr(self, key))):
                raise ConfigError(f"data.{key}: expected split names joined by '+', got {getattr(self, key)!r}")
        if set(self.split_names(self.split_train)) & set(self.split_names(self.split_test)):
            raise ConfigError(f"data.split_test: shares a split with data.split_train ({self.split_train!r})")
        if not self.json_file or not self.images_dir:
            raise ConfigError("data.json_file and data.images_dir: must not be empty")
        self.check_pairs()

    @staticmethod
    def split_names(value: str) -> list[str]:
        return [s.strip() for s in (value or "").split("+")]


def read_karpathy(path: Path, captions_per_image: int) -> dict[str, list[tuple[str, list[str]]]]:
    """Karpathy-split JSON -> ``{split: [(relative image path, captions), ...]}`` in file order
    (``filepath/filename`` where an entry has ``filepath``, as dataset_coco.json does); images without
    captions are left out."""
    data = read_json(path, "Karpathy-split JSON")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataError(f"{path}: expected a Karpathy-split file (an object with an 'images' list)")
    out: dict[str, list[tuple[str, list[str]]]] = {}
    k = captions_per_image or None
    for i, im in enumerate(data["images"]):
        if not isinstance(im, dict) or not isinstance(im.get("filename"), str) \
                or not isinstance(im.get("split"), str) or not isinstance(im.get("sentences"), list):
            raise DataError(f"{path}: images[{i}]: expected {{'filename': str, 'split': str, 'sentences': list}}")
        caps = []
        for j, s in enumerate(im["sentences"]):
            raw = s.get("raw") if isinstance(s, dict) else None
            if raw is None and isinstance(s, dict) and isinstance(s.get("tokens"), list):
                raw = " ".join(map(str, s["tokens"]))
            if not isinstance(raw, str):
                raise DataError(f"{path}: images[{i}].sentences[{j}]: expected {{'raw': str}}")
            if clean_caption(raw):
                caps.append(clean_caption(raw))
        if caps:
            rel = f"{im['filepath']}/{im['filename']}" if isinstance(im.get("filepath"), str) else im["filename"]
            out.setdefault(im["split"], []).append((rel, caps[:k]))
    return out


@DATASETS.register("flickr30k", Flickr30kParams,
                   help="Flickr30k (Karpathy split) from your copy: image-caption pairs through frozen "
                        "encoders (image [1280] MobileNetV2, text [384] MiniLM), one sample per caption")
def flickr30k(p: Flickr30kParams) -> DatasetBundle:
    """Flickr30k caption pairs: ``image`` ``[N, d_i]`` + ``text`` ``[N, d_t]``, label 0, image of each row
    in ``meta.info["image_index"]``."""
    root = Path(p.root).expanduser()
    if not root.is_dir():
        raise DataError(f"{root}: Flickr30k folder not found")
    path = root / p.json_file
    by_split = read_karpathy(path, p.captions_per_image)
    img_dir = root / p.images_dir
    if not img_dir.is_dir():
        raise DataError(f"{img_dir}: Flickr30k image folder not found (set data.images_dir)")
    splits = {}
    for split, names, limit, seed in (("train", p.split_train, p.max_images, p.seed),
                                      ("test", p.split_test, p.max_test_images, p.seed + 1)):
        items = [it for s in Flickr30kParams.split_names(names) for it in by_split.get(s, [])]
        if not items:
            raise DataError(f"{path}: no images with captions in split {names!r} "
                            f"(splits present: {', '.join(sorted(by_split)) or 'none'})")
        items = [items[i] for i in _subset(len(items), limit, seed)]
        files = [f for f, _ in items]
        img, txt, idx = _encode_split("flickr30k", [img_dir / f for f in files], [c for _, c in items], p,
                                      root, [path])
        splits[split] = (img, txt, idx, files)
    return _pair_bundle("flickr30k", splits, p, {
        "source": str(root), "json": str(path), "splits": {"train": p.split_train, "test": p.split_test},
        "order": "images in file order, their sentences in order"})
